"""Measure the Kafka-protocol broker with a real client: what it sustains and what it costs.

    python bench/kafka.py [--records 20000] [--idle 10000] [--transactions 500] [--json FILE]

Starts the broker (``python -m aiopurgatory.kafka``) as a subprocess on a free port (so
its own CPU time and RSS can be read from /proc) and measures, with aiokafka:

* **throughput** — records/s produced (acks=1 and acks=all; 100-byte values, the
  producer's defaults otherwise) and consumed end to end (first send to last record
  received by a consumer reading all partitions);
* **latency** — produce-to-consume p50/p99 with consumers parked in long polls, one
  record at a time (the time a parked fetch takes to be woken and answered);
* **transactions** — commits/s of ``--transactions`` transactions of 10 records each,
  one after the other, with aiokafka's transactional producer (and confluent-kafka's,
  when installed), and the broker's CPU per commit;
* **start time** — from nothing to a broker answering ApiVersions and Metadata (medians
  of ``--starts``): ``KafkaBroker()`` on the running loop, ``BrokerThread`` (the pytest
  fixture's path), and ``python -m aiopurgatory.kafka`` as a subprocess (to its
  ``listening on`` line and to the answer); beside them, cited and not run, a Kafka
  container's start as Apache Kafka documents it (:data:`CONTAINER_CITED`);
* **compaction** — the log cleaner (``aiopurgatory.kafka.cleaner``), in this process:
  ``--compact-records`` records (batches of 100, 100-byte values, 10,000 keys) on one
  compacted partition, cleaned through ``Cleaner.settle`` as ``advance`` runs it: the
  records the cleaner reads per second, and the loop's longest stall meanwhile (a
  task timing each loop iteration beside it);
* **idle** — ``--idle`` consumers on an empty partition, raw connections (one
  kio-encoded Fetch re-sent as soon as its answer is in, lighter than as many client
  objects) spread over ``--clients`` processes, measured twice: *polling* with max wait
  500 ms (each fetch parked, expired by the purgatory's timer, answered: the broker's
  CPU per answered fetch and the round trip, 500 ms while the broker keeps up) and
  *parked* with max wait 30 s (nothing expires within the window: the CPU and RSS of
  holding them). The clients' CPU and the broker's time waiting for a CPU are reported
  too, so that neither a slow client nor a busy machine passes for the broker's cost.

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
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.api_versions.v0 import request as api_versions_v0
from kio.schema.api_versions.v0 import response as api_versions_v0_response
from kio.schema.fetch.v11 import request as fetch
from kio.schema.metadata.v1 import request as metadata_v1
from kio.schema.metadata.v1 import response as metadata_v1_response
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i32Timedelta, i64

from aiopurgatory.kafka.cleaner import Cleaner
from aiopurgatory.kafka.configs import check_topic_configs
from aiopurgatory.kafka.core import BrokerCore
from aiopurgatory.kafka.limits import Limits
from aiopurgatory.kafka.log import TopicPartition
from aiopurgatory.kafka.records import StoredBatch

PARTITIONS = 3
VALUE = bytes(100)
IDLE_MAX_WAIT_MS = 500
"""The idle consumers' max wait (the issue's figure)."""
PARKED_MAX_WAIT_S = 30.0
"""The parked measurement's max wait: the broker's default cap, longer than its window."""
IDLE_CLIENTS = 2
"""Client processes the idle consumers are spread over."""
IDLE_SETTLE_S = 1.0
IDLE_CLIENT_COMMAND = "_idle_client"
CONNECT_WAVE = 40
"""Connections each client opens at once: both clients' waves together stay under the
broker's listen backlog (100), so no SYN is dropped and retried a second later."""
TXN_RECORDS = 10
"""Records each measured transaction sends."""
TXN_WARM_UP = 3
"""Transactions each producer commits before the measured ones."""
KIP_974 = (
    "https://cwiki.apache.org/confluence/display/KAFKA/"
    "KIP-974%3A+Docker+Image+for+GraalVM+based+Native+Kafka+Broker"
)
CONTAINER_CITED: dict[str, Any] = {
    # Apache Kafka's own measurement (KIP-974, the apache/kafka-native image): the
    # broker's start inside the container, default configs. Not run here; it leaves
    # out creating the container (and pulling its image) and a client's first answer.
    "cited_jvm_broker_start_ms_low": 1150.0,
    "cited_jvm_broker_start_ms_high": 1200.0,
    "cited_native_broker_start_ms_low": 110.0,
    "cited_native_broker_start_ms_high": 140.0,
    "cited_source": KIP_974,
}
"""Container start times cited from documentation, never measured by this bench."""


def start_broker(*options: str) -> tuple[subprocess.Popen[str], str]:
    # 3 partitions and 2 simulated followers, as every recorded run (bench/kafka-*.json)
    # measured: the broker's own defaults are a single node's (1 and none).
    command = [sys.executable, "-m", "aiopurgatory.kafka", "--host", "127.0.0.1", "--port", "0"]
    command += ["--partitions", "3", "--replicas", "3", *options]
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


def cpu_seconds_fine(pid: int) -> float:
    """``pid``'s CPU time to the nanosecond (Linux schedstat, summed over its threads),
    where :func:`cpu_seconds` counts clock ticks (10 ms): for windows of a few hundred
    ms. Falls back on :func:`cpu_seconds` where the kernel keeps no schedstat."""
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return cpu_seconds(pid)
    return total


def run_queue_seconds(pid: int) -> float:
    """Time ``pid``'s threads spent runnable but waiting for a CPU (Linux schedstat),
    summed over its threads; 0.0 where the kernel does not keep it."""
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
    return total


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


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


async def new_topic(address: str, prefix: str) -> str:
    """A topic of a new name (``prefix`` and a random part), created by asking an
    aiokafka producer for its partitions."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=address)
    await producer.start()
    try:
        await producer.partitions_for(topic)
    finally:
        await producer.stop()
    return topic


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


def idle_fetch_frame(topic: str, max_wait_ms: int = IDLE_MAX_WAIT_MS) -> bytes:
    """One Fetch v11 request (kio-encoded) for partition 0 of ``topic`` from offset 0."""
    request = fetch.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
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
    return request_frame(request, correlation_id=1, client_id="bench-idle")


def request_frame(request: Any, correlation_id: int, client_id: str) -> bytes:
    """``request`` (a kio request entity with a v1 header) as one size-prefixed frame."""
    # Imported here, as the broker is below: this file also runs as a script (the idle
    # clients), and the library's encoder is the one the tests' raw peers use too.
    from aiopurgatory.kafka import protocol

    return protocol.encode_request(request, correlation_id, client_id, RequestHeader)


# -- idle consumers: client processes of raw connections ------------------------------------


class _IdleStats:
    """What one client process saw: answers and round trips inside the measured window."""

    __slots__ = ("answers", "lost", "measuring", "round_trips")

    def __init__(self) -> None:
        self.answers = 0
        self.lost = 0
        self.measuring = False
        self.round_trips: list[float] = []

    def answered(self, round_trip: float) -> None:
        if self.measuring:
            self.answers += 1
            self.round_trips.append(round_trip)


class _Poller(asyncio.Protocol):
    """One idle consumer: re-sends its Fetch as soon as the answer is in, nothing else.

    A bare protocol (no stream reader, no task) so that the client side costs a few
    microseconds per answer and the broker, not the clients, is what gets measured.
    """

    __slots__ = ("buffer", "frame", "sent", "stats", "transport")

    def __init__(self, frame: bytes, stats: _IdleStats) -> None:
        self.frame = frame
        self.stats = stats
        self.buffer = bytearray()
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not a subclass of asyncio.Transport: no isinstance.
        self.transport = cast(asyncio.Transport, transport)

    def start(self) -> None:
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent = time.perf_counter()
        self.transport.write(self.frame)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            size = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + size:
                return
            del self.buffer[: 4 + size]
            self.stats.answered(time.perf_counter() - self.sent)
            self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.lost += 1


async def idle_client(address: str, topic: str, connections: int, max_wait_ms: int) -> None:
    """The child side: open ``connections``, print "connected"; on a "go" line on stdin
    start polling and print "ready"; count between "start" and "stop" lines, then print
    what it saw as one JSON line."""
    loop = asyncio.get_running_loop()
    host, port = address.rsplit(":", 1)
    frame = idle_fetch_frame(topic, max_wait_ms)
    stats = _IdleStats()
    pollers: list[_Poller] = []

    def poller() -> _Poller:
        pollers.append(_Poller(frame, stats))
        return pollers[-1]

    # Every connection first, then every first fetch: a broker busy answering the
    # early ones would accept the later ones slowly.
    for wave in range(0, connections, CONNECT_WAVE):
        count = min(CONNECT_WAVE, connections - wave)
        await asyncio.gather(
            *(loop.create_connection(poller, host, int(port)) for _ in range(count))
        )
    # Every client connected before any polls (a busy broker accepts slowly: a full
    # listen backlog drops handshakes, and some of those connections are reset later).
    print("connected", flush=True)
    # A blocking readline in a thread: stdin stays a plain blocking pipe.
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    # First fetches spread over one max wait, as consumers that did not all start in
    # the same millisecond would be: one burst of expiries would measure queueing.
    spread = min(max_wait_ms, IDLE_MAX_WAIT_MS) / 1000
    for index, each in enumerate(pollers):
        loop.call_later(spread * index / len(pollers), each.start)
    await asyncio.sleep(spread)
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "start"
    stats.measuring = True
    await loop.run_in_executor(None, sys.stdin.readline)  # "stop"
    stats.measuring = False
    trips = stats.round_trips
    print(
        json.dumps(
            {
                "answers": stats.answers,
                "lost": stats.lost,
                "round_trip_p50_ms": percentile(trips, 0.5) * 1e3 if trips else None,
                "round_trip_p99_ms": percentile(trips, 0.99) * 1e3 if trips else None,
                "round_trip_max_ms": max(trips) * 1e3 if trips else None,
            }
        ),
        flush=True,
    )
    for each in pollers:
        if each.transport is not None:
            each.transport.abort()


async def _each_says(children: list[asyncio.subprocess.Process], word: bytes) -> None:
    for child in children:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if line.strip() != word:
            raise RuntimeError(f"an idle client said {line!r}, not {word!r}")


async def _idle_phase(
    address: str,
    pid: int,
    topic: str,
    consumers: int,
    clients: int,
    max_wait_ms: int,
    seconds: float,
) -> dict[str, float]:
    """``consumers`` idle consumers spread over ``clients`` processes, measured ``seconds``."""
    shares = [consumers // clients + (i < consumers % clients) for i in range(clients)]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            IDLE_CLIENT_COMMAND,
            address,
            topic,
            str(share),
            str(max_wait_ms),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for share in shares
        if share
    ]
    try:
        await _each_says(children, b"connected")
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
        await _each_says(children, b"ready")
        await asyncio.sleep(IDLE_SETTLE_S)  # every consumer parked (or cycling)
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"start\n")
        cpu0, wall0, waited0 = cpu_seconds(pid), time.perf_counter(), run_queue_seconds(pid)
        clients0 = sum(cpu_seconds(child.pid) for child in children)
        await asyncio.sleep(seconds)
        cpu1, wall1, waited1 = cpu_seconds(pid), time.perf_counter(), run_queue_seconds(pid)
        clients1 = sum(cpu_seconds(child.pid) for child in children)
        rss = rss_mib(pid)
        seen = []
        for child in children:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write(b"stop\n")
            seen.append(json.loads(await asyncio.wait_for(child.stdout.readline(), 30)))
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
            await child.wait()
    wall = wall1 - wall0
    answers = sum(s["answers"] for s in seen)
    cpu = cpu1 - cpu0
    p50s = [s["round_trip_p50_ms"] for s in seen if s["round_trip_p50_ms"] is not None]
    p99s = [s["round_trip_p99_ms"] for s in seen if s["round_trip_p99_ms"] is not None]
    return {
        "broker_cpu_percent": 100 * cpu / wall,
        "clients_cpu_percent": 100 * (clients1 - clients0) / wall,
        # Runnable but not running: the machine's other load, not the broker's own work.
        "broker_run_queue_percent": 100 * (waited1 - waited0) / wall,
        "answers_per_s": answers / wall,
        "broker_cpu_us_per_answer": 1e6 * cpu / answers if answers else math.nan,
        "broker_cpu_us_per_parked_s": 1e6 * cpu / (consumers * wall),
        "round_trip_p50_ms": max(p50s) if p50s else math.nan,
        "round_trip_p99_ms": max(p99s) if p99s else math.nan,
        "connections_lost": float(sum(s["lost"] for s in seen)),
        "rss_mib": rss,
    }


async def idle(
    address: str, pid: int, consumers: int, seconds: float, clients: int = IDLE_CLIENTS
) -> dict[str, Any]:
    """Two measurements of ``consumers`` idle consumers long-polling an empty partition.

    * ``polling``: max wait 500 ms, so each is answered by the purgatory's timer every
      500 ms and re-sends at once: ``consumers / 0.5`` answers/s if the broker keeps up
      (the round trip then stays at 500 ms). The broker's CPU per answered fetch is the
      cost of one park-expire-answer cycle.
    * ``parked``: max wait 30 s, longer than the window, so nothing expires: the CPU and
      RSS of merely holding the fetches parked.

    The consumers are spread over ``clients`` processes (raw connections, one Fetch
    re-sent on each answer) whose own CPU is reported, so that a client too slow to
    re-send does not pass for a broker that keeps up.
    """
    topic = await new_topic(address, "bench-idle")  # an empty topic to wait on
    before_rss, files_before = rss_mib(pid), open_files(pid)
    polling = await _idle_phase(address, pid, topic, consumers, clients, IDLE_MAX_WAIT_MS, seconds)
    # The polling phase's connections end with their last fetch (later than 500 ms when
    # the broker is saturated): the parked phase starts once the broker has closed them.
    for _ in range(300):  # 60 s at most
        if open_files(pid) <= files_before + 10:
            break
        await asyncio.sleep(0.2)
    parked_wait_ms = int(PARKED_MAX_WAIT_S * 1000)
    parked = await _idle_phase(address, pid, topic, consumers, clients, parked_wait_ms, seconds)
    return {
        "consumers": float(consumers),
        "clients": float(clients),
        "max_wait_ms": float(IDLE_MAX_WAIT_MS),
        "nominal_answers_per_s": consumers / (IDLE_MAX_WAIT_MS / 1000),
        "rss_mib_before": before_rss,
        "polling": polling,
        "parked": parked,
    }


# -- transactions ---------------------------------------------------------------------------


async def _one_transaction(producer: AIOKafkaProducer, topic: str, records: int) -> None:
    async with producer.transaction():
        for _ in range(records):
            await producer.send(topic, VALUE)


async def transactions(address: str, pid: int, count: int) -> dict[str, float]:
    """``count`` transactions of :data:`TXN_RECORDS` records each, one after the other,
    with aiokafka's transactional producer: commits/s and the broker's CPU per commit.

    Each commit is the whole round: AddPartitionsToTxn, the produce, EndTxn and its
    markers in every partition the transaction wrote (the records spread over the
    topic's partitions, no key).
    """
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(
        bootstrap_servers=address, transactional_id=f"bench-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()  # InitProducerId
    try:
        await producer.partitions_for(topic)
        for _ in range(TXN_WARM_UP):
            await _one_transaction(producer, topic, TXN_RECORDS)
        cpu0, wall0 = cpu_seconds_fine(pid), time.perf_counter()
        for _ in range(count):
            await _one_transaction(producer, topic, TXN_RECORDS)
        cpu1, wall1 = cpu_seconds_fine(pid), time.perf_counter()
    finally:
        await producer.stop()
    return _txn_figures(count, wall1 - wall0, cpu1 - cpu0)


def _txn_figures(count: int, wall: float, cpu: float) -> dict[str, float]:
    return {
        "transactions": float(count),
        "records_per_transaction": float(TXN_RECORDS),
        "commits_per_s": count / wall,
        "broker_cpu_us_per_commit": 1e6 * cpu / count,
        "broker_cpu_percent": 100 * cpu / wall,
    }


def confluent_transactions(address: str, pid: int, topic: str, count: int) -> dict[str, float]:
    """The same with confluent-kafka (librdkafka, its defaults otherwise): blocking, so
    run in a thread. NaN figures when confluent-kafka is not installed."""
    try:
        from confluent_kafka import Producer
    except ImportError:
        return {
            "transactions": float(count),
            "records_per_transaction": float(TXN_RECORDS),
            "commits_per_s": math.nan,
            "broker_cpu_us_per_commit": math.nan,
            "broker_cpu_percent": math.nan,
        }
    producer = Producer(
        {
            "bootstrap.servers": address,
            "transactional.id": f"bench-ck-{uuid.uuid4().hex[:8]}",
            "log_level": 3,  # errors only
        }
    )
    producer.init_transactions(30)

    def one() -> None:
        producer.begin_transaction()
        for _ in range(TXN_RECORDS):
            producer.produce(topic, VALUE)
        producer.commit_transaction(30)

    for _ in range(TXN_WARM_UP):
        one()
    cpu0, wall0 = cpu_seconds_fine(pid), time.perf_counter()
    for _ in range(count):
        one()
    cpu1, wall1 = cpu_seconds_fine(pid), time.perf_counter()
    producer.flush(5)
    return _txn_figures(count, wall1 - wall0, cpu1 - cpu0)


async def all_transactions(address: str, pid: int, count: int) -> dict[str, Any]:
    results: dict[str, Any] = {"aiokafka": await transactions(address, pid, count)}
    topic = await new_topic(address, "bench-txn-ck")  # before librdkafka asks for it
    results["confluent"] = await asyncio.to_thread(
        confluent_transactions, address, pid, topic, count
    )
    return results


# -- start time -----------------------------------------------------------------------------


async def answered(host: str, port: int) -> None:
    """Connect, then ApiVersions v0 and Metadata v1 (all topics), one after the other as a
    client's bootstrap does; raise unless both are answered without error."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        asks: tuple[tuple[Any, Any], ...] = (
            (api_versions_v0.ApiVersionsRequest(), api_versions_v0_response.ApiVersionsResponse),
            (metadata_v1.MetadataRequest(topics=None), metadata_v1_response.MetadataResponse),
        )
        for correlation_id, (request, response_type) in enumerate(asks, 1):
            writer.write(request_frame(request, correlation_id, "bench-start"))
            size = int.from_bytes(await reader.readexactly(4), "big")
            payload = await reader.readexactly(size)
            header, used = entity_reader(ResponseHeader)(payload, 0)
            response, _ = entity_reader(response_type)(payload, used)
            if header.correlation_id != correlation_id:
                raise RuntimeError(f"answer {header.correlation_id} to request {correlation_id}")
            if getattr(response, "error_code", 0) or not getattr(response, "brokers", True):
                raise RuntimeError(f"the broker answered {response!r}")
    finally:
        writer.close()
        await writer.wait_closed()


async def _start_in_process() -> float:
    """``KafkaBroker()`` (the fixture's defaults) on the running loop, to answered."""
    from aiopurgatory.kafka import KafkaBroker

    started = time.perf_counter()
    async with KafkaBroker() as broker:
        await answered(broker.host, broker.port)
        return time.perf_counter() - started


async def _start_thread() -> float:
    """``BrokerThread().started()``, the ``kafka_bootstrap`` fixture's own path (its
    thread, its loop), to answered. Blocks this loop while the thread starts, as the
    fixture blocks pytest."""
    from aiopurgatory.kafka import BrokerThread

    started = time.perf_counter()
    thread = BrokerThread().started()
    try:
        host, port = thread.bootstrap.rsplit(":", 1)
        await answered(host, int(port))
        took = time.perf_counter() - started
    finally:
        thread.stop()
    return took


async def _start_subprocess() -> tuple[float, float]:
    """``python -m aiopurgatory.kafka --port 0`` (its defaults): to the ``listening on``
    line, and to answered. Includes the interpreter's start and every import."""
    started = time.perf_counter()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aiopurgatory.kafka",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = (await asyncio.wait_for(child.stdout.readline(), 30)).decode()
        listening = time.perf_counter() - started
        match = re.search(r"listening on (\S+):(\d+)", line)
        if match is None:
            raise RuntimeError(f"the broker did not start: {line!r}")
        await answered(match.group(1), int(match.group(2)))
        took = time.perf_counter() - started
    finally:
        if child.returncode is None:
            child.terminate()
        await asyncio.wait_for(child.communicate(), 30)
    return listening, took


async def start_time(starts: int) -> dict[str, float]:
    """Medians of ``starts`` starts each, from nothing to a broker answering ApiVersions
    and Metadata: in-process on the running loop, as the fixture (its thread), and as a
    subprocess; beside them the container figures cited from :data:`CONTAINER_CITED`."""
    await _start_in_process()  # the lazy imports (kio's schemas) once, outside the samples
    in_process = [await _start_in_process() for _ in range(starts)]
    thread = [await _start_thread() for _ in range(starts)]
    subprocess_runs = [await _start_subprocess() for _ in range(starts)]
    return {
        "starts": float(starts),
        "in_process_ms": 1e3 * statistics.median(in_process),
        "fixture_thread_ms": 1e3 * statistics.median(thread),
        "subprocess_listening_ms": 1e3 * statistics.median(r[0] for r in subprocess_runs),
        "subprocess_answered_ms": 1e3 * statistics.median(r[1] for r in subprocess_runs),
        "subprocess_answered_max_ms": 1e3 * max(r[1] for r in subprocess_runs),
        **CONTAINER_CITED,
    }


COMPACT_BATCH = 100
"""Records per batch of the compaction bench (a producer's batch under load)."""
COMPACT_KEYS = 10_000
"""Distinct keys of the compaction bench: all but the latest 10,000 records go."""


def _keyed_batch(keys: range, stamp: TZAwareMicros) -> bytes:
    buffer = io.BytesIO()
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=stamp,
            offset=i64(i),
            key=b"key-%06d" % key,
            value=VALUE,
            headers=(),
        )
        for i, key in enumerate(keys)
    )
    batch = NewRecordBatch(
        producer_id=i64(-1),
        producer_epoch=i16(-1),
        base_sequence=i32(-1),
        records=records,
        attributes=i16(0),
    )
    write_new_batch(buffer, batch)
    return buffer.getvalue()


async def compaction(records: int) -> dict[str, float]:
    """Clean a compacted partition of ``records`` records (all closed, all dirty) on
    this loop: records read per second and the loop's longest stall meanwhile."""
    now = [0]
    limits = Limits()
    core: BrokerCore[StoredBatch] = BrokerCore(followers=0)
    core.segment_now = lambda: now[0]
    cleaner = Cleaner(core, limits, lambda: now[0])
    core.create_topic("compacted", 1)
    configs = {"cleanup.policy": "compact", "segment.bytes": str(16 << 20)}
    cleaner.configure("compacted", check_topic_configs(configs, limits))
    tp = TopicPartition("compacted", 0)
    partition = core.partitions[tp]
    stamp = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC).replace(microsecond=0))
    # The keys repeat every COMPACT_KEYS records: one template per key range, its
    # copies with their base offsets written in (outside the CRC).
    templates = [
        _keyed_batch(range(first, first + COMPACT_BATCH), stamp)
        for first in range(0, COMPACT_KEYS, COMPACT_BATCH)
    ]
    stamp_ms = int(stamp.timestamp() * 1000)
    for index in range(max(records // COMPACT_BATCH, 2)):
        data = bytearray(templates[index % len(templates)])
        data[:8] = partition.leo.to_bytes(8, "big")
        batch = StoredBatch(bytes(data), COMPACT_BATCH, stamp_ms, stamp_ms)
        core.append({tp: [batch]})
    now[0] = 2**40  # every segment old: the idle active one rolls, all is cleanable
    longest = 0.0
    done = False

    async def probe() -> None:
        nonlocal longest
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - before)

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)
    started = time.perf_counter()
    try:
        await cleaner.settle()
    finally:
        done = True
        await prober
    elapsed = time.perf_counter() - started
    stats = cleaner.stats
    core.close()
    return {
        "records": float(stats.records_read),
        "removed": float(stats.records_removed),
        "seconds": elapsed,
        "records_per_s": stats.records_read / elapsed if elapsed else math.nan,
        "longest_stall_ms": 1e3 * longest,
        "longest_step_ms": 1e3 * stats.longest_step,
    }


async def measure(
    records: int,
    samples: int,
    idle_consumers: int,
    seconds: float,
    clients: int = IDLE_CLIENTS,
    txns: int = 500,
    starts: int = 10,
    compact_records: int = 0,
) -> dict[str, Any]:
    if idle_consumers and seconds + IDLE_SETTLE_S >= PARKED_MAX_WAIT_S / 2:
        raise ValueError(f"the idle window ({seconds} s) must be well under {PARKED_MAX_WAIT_S} s")
    started = time.perf_counter()
    start = await start_time(starts)  # brokers of its own, before the measured one starts
    # Room for two sets of idle connections: the first set's are closed by the broker
    # only when their last fetch is answered.
    process, address = start_broker("--max-connections", str(2 * idle_consumers + 100))
    try:
        await throughput(address, min(records, 2000), 1)  # warm up both sides
        results: dict[str, Any] = {
            "acks_1": await throughput(address, records, 1),
            "acks_all": await throughput(address, records, "all"),
            "latency": await latency(address, samples),
            "txn": await all_transactions(address, process.pid, txns),
            "start": start,
        }
        if idle_consumers:
            results["idle"] = await idle(address, process.pid, idle_consumers, seconds, clients)
        if compact_records:
            results["compaction"] = await compaction(compact_records)
        results["broker_rss_mib"] = rss_mib(process.pid)
        results["elapsed_s"] = time.perf_counter() - started
    finally:
        stop_broker(process)
    return results


def _run_loop(main: Any) -> Any:
    """``main`` on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run(
    records: int = 20_000,
    samples: int = 300,
    idle_consumers: int = 10_000,
    seconds: float = 5.0,
    clients: int = IDLE_CLIENTS,
    transactions: int = 500,
    starts: int = 10,
    compact_records: int = 0,
) -> dict[str, Any]:
    """Every measurement, in a fresh event loop (uvloop when installed)."""
    result: dict[str, Any] = _run_loop(
        measure(
            records,
            samples,
            idle_consumers,
            seconds,
            clients,
            transactions,
            starts,
            compact_records,
        )
    )
    return result


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
    if "compaction" in results:
        row = results["compaction"]
        lines.append(
            f"compact   {row['records_per_s']:>9,.0f} records/s read by the cleaner "
            f"({row['records']:,.0f} records, {row['removed']:,.0f} removed), the loop's "
            f"longest stall {row['longest_stall_ms']:.1f} ms"
        )
    if "txn" in results:
        for client, row in results["txn"].items():
            if not math.isfinite(row["commits_per_s"]):
                lines.append(f"txn       {client}: not installed, not measured")
                continue
            lines.append(
                f"txn       {client:9} {row['commits_per_s']:>7,.0f} commits/s "
                f"({row['transactions']:,.0f} transactions of "
                f"{row['records_per_transaction']:.0f} records, one at a time), broker CPU "
                f"{row['broker_cpu_us_per_commit']:,.0f} us per commit "
                f"({row['broker_cpu_percent']:.0f} % of a core)"
            )
    if "start" in results:
        start = results["start"]
        lines.append(
            f"start     to a broker answering ApiVersions and Metadata, medians of "
            f"{start['starts']:.0f}: KafkaBroker() on the running loop "
            f"{start['in_process_ms']:.1f} ms, BrokerThread (the fixture) "
            f"{start['fixture_thread_ms']:.1f} ms, python -m aiopurgatory.kafka "
            f"{start['subprocess_listening_ms']:.0f} ms to 'listening on' and "
            f"{start['subprocess_answered_ms']:.0f} ms to answered (interpreter and imports "
            f"included)"
        )
        lines.append(
            f"          cited, not run: Kafka's broker starts in its container in "
            f"{start['cited_jvm_broker_start_ms_low']:,.0f}-"
            f"{start['cited_jvm_broker_start_ms_high']:,.0f} ms (JVM, apache/kafka), "
            f"{start['cited_native_broker_start_ms_low']:.0f}-"
            f"{start['cited_native_broker_start_ms_high']:.0f} ms (GraalVM native, "
            f"apache/kafka-native), creating the container not counted: KIP-974, "
            f"{start['cited_source']}"
        )
    if "idle" in results:
        idle_row = results["idle"]
        polling, parked = idle_row["polling"], idle_row["parked"]
        lines.append(
            f"idle      {idle_row['consumers']:,.0f} consumers long-polling (max wait "
            f"{idle_row['max_wait_ms']:.0f} ms) from {idle_row['clients']:.0f} client processes: "
            f"{polling['answers_per_s']:,.0f} answers/s of "
            f"{idle_row['nominal_answers_per_s']:,.0f} nominal, round trip "
            f"p50 {polling['round_trip_p50_ms']:.0f} ms p99 {polling['round_trip_p99_ms']:.0f} ms"
            + (
                f", {polling['connections_lost']:.0f} connections lost"
                if polling["connections_lost"]
                else ""
            )
        )
        lines.append(
            f"          broker CPU {polling['broker_cpu_percent']:.0f} % of a core, "
            f"{polling['broker_cpu_us_per_answer']:.0f} us per answered fetch "
            f"(clients {polling['clients_cpu_percent']:.0f} %; broker waiting for a CPU "
            f"{polling['broker_run_queue_percent']:.0f} % of the time), "
            f"RSS {polling['rss_mib']:.0f} MiB "
            f"({idle_row['rss_mib_before']:.0f} MiB before)"
        )
        per_answer = polling["broker_cpu_us_per_answer"]
        if per_answer > 0:
            lines.append(
                f"          at that cost one core answers {1e6 / per_answer:,.0f} fetches/s: "
                f"{1e6 / per_answer * idle_row['max_wait_ms'] / 1000:,.0f} consumers polling "
                f"every {idle_row['max_wait_ms']:.0f} ms"
            )
        lines.append(
            f"parked    the same consumers parked (max wait 30 s, none expiring): "
            f"broker CPU {parked['broker_cpu_percent']:.1f} % "
            f"({parked['broker_cpu_us_per_parked_s']:.2f} us per parked fetch-second), "
            f"RSS {parked['rss_mib']:.0f} MiB"
        )
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == [IDLE_CLIENT_COMMAND]:  # the child side of idle()
        address, topic, connections, max_wait_ms = sys.argv[2:6]
        _run_loop(idle_client(address, topic, int(connections), int(max_wait_ms)))
        return
    parser = argparse.ArgumentParser(description="Measure the Kafka-protocol broker.")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--idle", type=int, default=10_000, help="idle consumers (0: skip)")
    parser.add_argument("--seconds", type=float, default=5.0, help="idle measurement time")
    parser.add_argument(
        "--clients", type=int, default=IDLE_CLIENTS, help="processes the idle consumers use"
    )
    parser.add_argument(
        "--transactions", type=int, default=500, help=f"of {TXN_RECORDS} records each"
    )
    parser.add_argument("--starts", type=int, default=10, help="broker starts timed, each way")
    parser.add_argument(
        "--compact-records", type=int, default=1_000_000, help="records compacted (0: skip)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if min(args.records, args.samples, args.clients, args.transactions, args.starts) < 1:
        parser.error("--records, --samples, --clients, --transactions, --starts must be >= 1")
    if args.idle < 0:
        parser.error("--idle must be >= 0")
    if not 0 < args.seconds <= 10:
        parser.error(f"--seconds must be in (0, 10], got {args.seconds}")
    results = run(
        args.records,
        args.samples,
        args.idle,
        args.seconds,
        args.clients,
        args.transactions,
        args.starts,
        args.compact_records,
    )
    print(format_results(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
