"""Measure the Kafka-protocol broker with a real client: what it sustains and what it costs.

    python examples/kafka_broker/bench.py [--records 20000] [--idle 10000] [--json FILE]

Starts ``server.py`` as a subprocess on a free port (so its own CPU time and RSS can be
read from /proc) and measures, with aiokafka:

* **throughput** — records/s produced (acks=1 and acks=all; 100-byte values, the
  producer's defaults otherwise) and consumed end to end (first send to last record
  received by a consumer reading all partitions);
* **latency** — produce-to-consume p50/p99 with consumers parked in long polls, one
  record at a time (the time a parked fetch takes to be woken and answered);
* **idle** — the broker's CPU share and RSS while ``--idle`` consumers long-poll an
  empty partition (max wait 500 ms): what keeping them parked costs. The idle
  consumers are raw connections re-sending one Fetch request (kio-encoded), lighter
  than as many client objects; each is answered every 500 ms by the fetch purgatory's
  timer.

Linux only (it reads /proc). Returns a dict (``run(...)``) the repository's
``python -m bench`` can embed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import math
import os
import re
import select
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kio.schema.fetch.v11 import request as fetch
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import i8, i32, i32Timedelta, i64

SERVER = Path(__file__).resolve().parent / "server.py"
PARTITIONS = 3
VALUE = bytes(100)


def start_broker(*options: str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, str(SERVER), "--host", "127.0.0.1", "--port", "0", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], 15.0)
    line = process.stdout.readline() if readable else ""
    match = re.search(r"listening on (\S+:\d+)", line)
    if match is None:
        process.kill()
        raise RuntimeError(f"the broker did not start: {line!r}")
    return process, match.group(1)


def stop_broker(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


async def throughput(address: str, records: int, acks: int | str) -> dict[str, float]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=address, acks=acks)
    consumer = AIOKafkaConsumer(bootstrap_servers=address, auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    try:
        await producer.partitions_for(topic)
        consumer.assign([AioTopicPartition(topic, p) for p in range(PARTITIONS)])
        received = 0

        async def consume() -> float:
            nonlocal received
            while received < records:
                batches = await consumer.getmany(timeout_ms=500)
                received += sum(len(batch) for batch in batches.values())
            return time.perf_counter()

        consuming = asyncio.create_task(consume())
        started = time.perf_counter()
        sends = [await producer.send(topic, VALUE) for _ in range(records)]
        await asyncio.gather(*sends)
        produced = time.perf_counter() - started
        consumed = await asyncio.wait_for(consuming, 120) - started
    finally:
        await consumer.stop()
        await producer.stop()
    return {"produced_per_s": records / produced, "consumed_per_s": records / consumed}


async def latency(address: str, samples: int) -> dict[str, float]:
    """One record at a time to a partition a consumer is parked on."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=address, linger_ms=0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=address, auto_offset_reset="earliest", fetch_max_wait_ms=5000
    )
    await producer.start()
    await consumer.start()
    delays: list[float] = []
    try:
        await producer.partitions_for(topic)
        consumer.assign([AioTopicPartition(topic, 0)])
        await asyncio.sleep(0.3)  # parked
        for _ in range(samples):
            sent = time.perf_counter()
            await producer.send(topic, VALUE, partition=0)
            while not (await consumer.getmany(timeout_ms=5000)):
                pass
            delays.append(time.perf_counter() - sent)
            await asyncio.sleep(0.005)  # let the consumer park again
    finally:
        await consumer.stop()
        await producer.stop()
    return {
        "p50_ms": percentile(delays, 0.5) * 1e3,
        "p99_ms": percentile(delays, 0.99) * 1e3,
        "samples": float(len(delays)),
    }


def idle_fetch_frame(topic: str) -> bytes:
    request = fetch.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            fetch.FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    fetch.FetchPartition(
                        partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    buffer = io.BytesIO()
    header = RequestHeader(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=i32(1),
        client_id="bench-idle",
    )
    entity_writer(RequestHeader)(buffer, header)
    entity_writer(fetch.FetchRequest)(buffer, request)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


async def idle(address: str, pid: int, consumers: int, seconds: float) -> dict[str, float]:
    topic = f"bench-idle-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=address)
    await producer.start()
    try:
        await producer.partitions_for(topic)  # an empty topic to wait on
    finally:
        await producer.stop()
    frame = idle_fetch_frame(topic)
    host, port = address.rsplit(":", 1)
    answers = 0
    stop = asyncio.Event()

    async def poll() -> None:
        nonlocal answers
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not stop.is_set():
                writer.write(frame)
                size = int.from_bytes(await reader.readexactly(4), "big")
                await reader.readexactly(size)
                answers += 1
        finally:
            writer.close()

    before_rss = rss_mib(pid)
    tasks = []
    for _ in range(consumers):
        tasks.append(asyncio.create_task(poll()))
        if len(tasks) % 500 == 0:
            await asyncio.sleep(0.05)  # connect in waves, not in one SYN flood
    await asyncio.sleep(1.0)  # all parked
    cpu0, answers0, wall0 = cpu_seconds(pid), answers, time.perf_counter()
    await asyncio.sleep(seconds)
    cpu1, answers1, wall1 = cpu_seconds(pid), answers, time.perf_counter()
    parked_rss = rss_mib(pid)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    wall = wall1 - wall0
    return {
        "consumers": float(consumers),
        "broker_cpu_percent": 100 * (cpu1 - cpu0) / wall,
        "answers_per_s": (answers1 - answers0) / wall,
        "rss_mib": parked_rss,
        "rss_mib_before": before_rss,
    }


async def measure(
    records: int, samples: int, idle_consumers: int, seconds: float
) -> dict[str, Any]:
    process, address = start_broker("--max-connections", str(idle_consumers + 100))
    try:
        await throughput(address, min(records, 2000), 1)  # warm up both sides
        started = time.perf_counter()
        results: dict[str, Any] = {
            "acks_1": await throughput(address, records, 1),
            "acks_all": await throughput(address, records, "all"),
            "latency": await latency(address, samples),
        }
        if idle_consumers:
            results["idle"] = await idle(address, process.pid, idle_consumers, seconds)
        results["broker_rss_mib"] = rss_mib(process.pid)
        results["elapsed_s"] = time.perf_counter() - started
    finally:
        stop_broker(process)
    return results


def run(
    records: int = 20_000, samples: int = 300, idle_consumers: int = 10_000, seconds: float = 5.0
) -> dict[str, Any]:
    """Every measurement, in a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(measure(records, samples, idle_consumers, seconds))
    return uvloop.run(measure(records, samples, idle_consumers, seconds))


def format_results(results: dict[str, Any]) -> str:
    lines = []
    for name in ("acks_1", "acks_all"):
        row = results[name]
        lines.append(
            f"{name:9} produced {row['produced_per_s']:>9,.0f} records/s, "
            f"consumed end to end {row['consumed_per_s']:>9,.0f} records/s"
        )
    lat = results["latency"]
    lines.append(
        f"latency   produce to parked consumer p50 {lat['p50_ms']:.2f} ms, "
        f"p99 {lat['p99_ms']:.2f} ms ({lat['samples']:.0f} records)"
    )
    if "idle" in results:
        idle_row = results["idle"]
        lines.append(
            f"idle      {idle_row['consumers']:,.0f} consumers long-polling (max wait 500 ms): "
            f"broker CPU {idle_row['broker_cpu_percent']:.1f} %, "
            f"{idle_row['answers_per_s']:,.0f} answers/s, RSS {idle_row['rss_mib']:.0f} MiB "
            f"({idle_row['rss_mib_before']:.0f} MiB before)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure the Kafka-protocol broker.")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--idle", type=int, default=10_000, help="idle consumers (0: skip)")
    parser.add_argument("--seconds", type=float, default=5.0, help="idle measurement time")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.records < 1 or args.samples < 1 or args.idle < 0 or not args.seconds > 0:
        parser.error("--records and --samples must be >= 1, --idle >= 0, --seconds > 0")
    results = run(args.records, args.samples, args.idle, args.seconds)
    print(format_results(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
