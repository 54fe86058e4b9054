"""The Kafka-protocol broker (aiopurgatory.kafka) driven over loopback by the
three Python Kafka clients people use, with their defaults (consumers use manual
assignment until the broker serves groups), and by hostile raw sockets.

One broker process serves the module; each test uses its own topics.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.schema.produce.v8 import request as produce
from kio.schema.produce.v8.response import ProduceResponse
from kio.schema.types import TopicName
from kio.serial import entity_reader
from kio.static.primitive import Records, i16, i32, i32Timedelta

from aiopurgatory.kafka import BrokerThread

from ..support.kafka_broker import OLD_DEFAULTS, offsets
from ..support.kafka_wire import Wire, batch, closed_by_broker, connect, create, read_frame
from ..support.servers import start_server, stop_server

"""The broker's defaults before it took a single-node Kafka's (1 partition, no simulated
follower, no initial rebalance delay): what these tests were written against, given
explicitly so that they keep covering partitions, followers and the delay."""
PARTITIONS = 3
RECORDS = 1000
PARKED_WAIT_MS = 5000
WAKE_WITHIN = 0.3
"""A parked consumer has a record this soon after its produce was acknowledged."""


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    process, address = start_server(
        "-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS, "--idle-seconds", "30"
    )
    yield address
    assert stop_server(process) == 0


def topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def send_one(bootstrap: str, name: str, value: bytes, partition: int | None = None) -> Any:
    """One record sent with kafka-python and acknowledged (10 s at most); its metadata."""
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    try:
        return producer.send(name, value, partition=partition).get(timeout=10)
    finally:
        producer.close(timeout=5)


def keyed(i: int) -> tuple[bytes, bytes]:
    return f"key-{i % 37}".encode(), str(i).encode()


def check_round_trip(received: list[tuple[int, int, bytes, bytes]]) -> None:
    """(partition, offset, key, value) of what a consumer got: every record exactly once,
    contiguous offsets from 0 on each partition, each key on one partition, in order."""
    values = sorted(int(value) for _, _, _, value in received)
    assert values == list(range(RECORDS))
    by_partition: dict[int, list[tuple[int, int]]] = {}
    key_partition: dict[bytes, int] = {}
    for partition, offset, key, value in received:
        by_partition.setdefault(partition, []).append((offset, int(value)))
        assert key_partition.setdefault(key, partition) == partition
    assert len(by_partition) == PARTITIONS  # 37 keys spread over the 3 partitions
    for records in by_partition.values():
        assert [offset for offset, _ in records] == list(range(len(records)))
        in_order = [value for _, value in records]
        assert in_order == sorted(in_order)  # one producer: a partition keeps its order


# -- aiokafka -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_aiokafka_keyed_round_trip(broker: str) -> None:
    name = topic()
    async with asyncio.timeout(30):
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            sends = [
                await producer.send(name, value=v, key=k) for k, v in map(keyed, range(RECORDS))
            ]
            await asyncio.gather(*sends)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(name, p) for p in range(PARTITIONS)])
            received: list[tuple[int, int, bytes, bytes]] = []
            while len(received) < RECORDS:
                batches = await consumer.getmany(timeout_ms=1000)
                for records in batches.values():
                    received += [(r.partition, r.offset, r.key, r.value) for r in records]
        finally:
            await consumer.stop()
    check_round_trip(received)


async def aiokafka_wait_for_one(
    broker: str, name: str, *, fetch_min_bytes: int = 1, fetch_max_wait_ms: int
) -> tuple[AIOKafkaConsumer, asyncio.Task[float]]:
    """A started consumer on partition 0 of ``name`` and the task noting when a record
    arrived (loop time)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker,
        auto_offset_reset="earliest",
        fetch_min_bytes=fetch_min_bytes,
        fetch_max_wait_ms=fetch_max_wait_ms,
    )
    await consumer.start()
    consumer.assign([AioTopicPartition(name, 0)])

    async def first() -> float:
        while True:
            batches = await consumer.getmany(timeout_ms=10_000)
            if batches:
                return asyncio.get_running_loop().time()

    return consumer, asyncio.create_task(first())


@pytest.mark.anyio
async def test_aiokafka_parked_consumer_wakes_on_produce(broker: str) -> None:
    name = topic()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        consumer = None
        try:
            await producer.partitions_for(name)  # creates the topic
            consumer, arrival = await aiokafka_wait_for_one(
                broker, name, fetch_max_wait_ms=PARKED_WAIT_MS
            )
            await asyncio.sleep(0.5)  # its fetch is parked in the broker by now
            assert not arrival.done()
            await producer.send_and_wait(name, b"wake up", partition=0)
            sent = loop.time()
            latency = await arrival - sent
        finally:
            await producer.stop()
            if consumer is not None:
                await consumer.stop()
    print(f"aiokafka parked consumer woken {latency * 1e3:.1f} ms after the produce")
    assert latency < WAKE_WITHIN, f"woken {latency * 1e3:.0f} ms after the produce"


@pytest.mark.anyio
async def test_aiokafka_min_bytes_waits_for_max_wait(broker: str) -> None:
    name = topic()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            await producer.send_and_wait(name, b"small", partition=0)
        finally:
            await producer.stop()
        started = loop.time()
        consumer, arrival = await aiokafka_wait_for_one(
            broker, name, fetch_min_bytes=1_000_000, fetch_max_wait_ms=1000
        )
        try:
            waited = await arrival - started
        finally:
            await consumer.stop()
    # The record was there all along; the broker held the fetch for min_bytes until
    # max_wait ran out.
    print(f"aiokafka min_bytes fetch answered after {waited * 1e3:.0f} ms (max wait 1000)")
    assert 0.95 <= waited < 3.0


# -- kafka-python (blocking: idempotent producer by default) ------------------------------


def test_kafka_python_keyed_round_trip(broker: str) -> None:
    name = topic()
    producer = kafka.KafkaProducer(bootstrap_servers=broker)
    try:
        futures = [producer.send(name, value=v, key=k) for k, v in map(keyed, range(RECORDS))]
        producer.flush(timeout=20)
        for future in futures:
            future.get(timeout=1)
    finally:
        producer.close(timeout=5)
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker, auto_offset_reset="earliest")
    try:
        consumer.assign([kafka.TopicPartition(name, p) for p in range(PARTITIONS)])
        received: list[tuple[int, int, bytes, bytes]] = []
        deadline = time.monotonic() + 20
        while len(received) < RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                received += [(r.partition, r.offset, r.key, r.value) for r in records]
    finally:
        consumer.close()
    check_round_trip(received)


def blocking_arrival(poll: Callable[[], bool], deadline: float) -> Callable[[], float | None]:
    """Run ``poll`` (True once a record came) in a thread; the result tells when."""
    arrived: list[float] = []

    def run() -> None:
        while time.monotonic() < deadline:
            if poll():
                arrived.append(time.monotonic())
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> float | None:
        thread.join(max(deadline - time.monotonic(), 0.0))
        return arrived[0] if arrived else None

    return result


def test_kafka_python_parked_consumer_wakes_on_produce(broker: str) -> None:
    name = topic()
    producer = kafka.KafkaProducer(bootstrap_servers=broker, linger_ms=0)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=broker, auto_offset_reset="earliest", fetch_max_wait_ms=PARKED_WAIT_MS
    )
    try:
        producer.partitions_for(name)  # creates the topic
        consumer.assign([kafka.TopicPartition(name, 0)])
        arrival = blocking_arrival(
            lambda: bool(consumer.poll(timeout_ms=500)), time.monotonic() + 15
        )
        time.sleep(0.5)  # parked
        producer.send(name, b"wake up", partition=0).get(timeout=10)
        sent = time.monotonic()
        arrived = arrival()
    finally:
        producer.close(timeout=5)
        consumer.close()
    assert arrived is not None
    print(f"kafka-python parked consumer woken {(arrived - sent) * 1e3:.1f} ms after the produce")
    assert arrived - sent < WAKE_WITHIN, f"woken {(arrived - sent) * 1e3:.0f} ms after"


def test_kafka_python_min_bytes_waits_for_max_wait(broker: str) -> None:
    name = topic()
    send_one(broker, name, b"small", partition=0)
    started = time.monotonic()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=broker,
        auto_offset_reset="earliest",
        fetch_min_bytes=1_000_000,
        fetch_max_wait_ms=1000,
    )
    try:
        consumer.assign([kafka.TopicPartition(name, 0)])
        arrived = blocking_arrival(
            lambda: bool(consumer.poll(timeout_ms=500)), time.monotonic() + 10
        )()
    finally:
        consumer.close()
    assert arrived is not None
    print(f"kafka-python min_bytes fetch answered after {(arrived - started) * 1e3:.0f} ms")
    assert 0.95 <= arrived - started < 3.0


# -- confluent-kafka (librdkafka) ---------------------------------------------------------


def confluent_consumer(broker: str, **config: Any) -> confluent_kafka.Consumer:
    # librdkafka wants a group.id even for manual assignment; nothing is committed.
    settings = {"bootstrap.servers": broker, "group.id": "unused", "enable.auto.commit": False}
    return confluent_kafka.Consumer({**settings, **config})


def test_confluent_keyed_round_trip(broker: str) -> None:
    name = topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": broker})
    failures: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(error)

    for k, v in map(keyed, range(RECORDS)):
        producer.produce(name, value=v, key=k, on_delivery=delivered)
    assert producer.flush(20) == 0
    assert failures == []
    consumer = confluent_consumer(broker)
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, p, 0) for p in range(PARTITIONS)])
        received: list[tuple[int, int, bytes, bytes]] = []
        deadline = time.monotonic() + 20
        while len(received) < RECORDS and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=1.0):
                assert message.error() is None, message.error()
                partition, offset = message.partition(), message.offset()
                key, value = message.key(), message.value()
                assert partition is not None
                assert offset is not None
                assert isinstance(key, bytes)
                assert isinstance(value, bytes)
                received.append((partition, offset, key, value))
    finally:
        consumer.close()
    check_round_trip(received)


def confluent_poll(consumer: confluent_kafka.Consumer) -> bool:
    message = consumer.poll(0.5)
    if message is None:
        return False
    assert message.error() is None, message.error()
    return True


def test_confluent_parked_consumer_wakes_on_produce(broker: str) -> None:
    name = topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": broker, "linger.ms": 0})
    producer.list_topics(name, timeout=10)  # creates the topic
    consumer = confluent_consumer(broker, **{"fetch.wait.max.ms": PARKED_WAIT_MS})
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, 0, 0)])
        arrival = blocking_arrival(lambda: confluent_poll(consumer), time.monotonic() + 15)
        time.sleep(0.5)
        acked: list[float] = []
        producer.produce(
            name, b"wake up", partition=0, on_delivery=lambda e, m: acked.append(time.monotonic())
        )
        assert producer.flush(10) == 0
        arrived = arrival()
    finally:
        consumer.close()
    assert arrived is not None
    assert acked
    print(f"confluent parked consumer woken {(arrived - acked[0]) * 1e3:.1f} ms after the produce")
    assert arrived - acked[0] < WAKE_WITHIN, f"woken {(arrived - acked[0]) * 1e3:.0f} ms after"


def test_confluent_min_bytes_waits_for_max_wait(broker: str) -> None:
    name = topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": broker})
    producer.produce(name, b"small", partition=0)
    assert producer.flush(10) == 0
    started = time.monotonic()
    consumer = confluent_consumer(
        broker, **{"fetch.min.bytes": 1_000_000, "fetch.wait.max.ms": 1000}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, 0, 0)])
        arrived = blocking_arrival(lambda: confluent_poll(consumer), time.monotonic() + 10)()
    finally:
        consumer.close()
    assert arrived is not None
    print(f"confluent min_bytes fetch answered after {(arrived - started) * 1e3:.0f} ms")
    assert 0.95 <= arrived - started < 3.0


# -- hostile frames -----------------------------------------------------------------------


def header(api_key: int, version: int, correlation_id: int) -> bytes:
    # Request header v1: api key, version, correlation id, client id (int16 length).
    return struct.pack(">hhih", api_key, version, correlation_id, -1)


def test_hostile_frames_close_only_their_connection(broker: str) -> None:
    silent = [connect(broker) for _ in range(200)]  # hundreds of idle connections
    try:
        huge = connect(broker)
        huge.sendall(struct.pack(">i", 2**31 - 1))  # a 2 GB frame announced
        assert closed_by_broker(huge)
        negative = connect(broker)
        negative.sendall(struct.pack(">i", -5))
        assert closed_by_broker(negative)
        unknown = connect(broker)
        body = header(9999, 0, 1)
        unknown.sendall(struct.pack(">i", len(body)) + body)
        assert closed_by_broker(unknown)  # Kafka closes on an API key it does not know
        malformed = connect(broker)
        body = header(3, 5, 2) + b"\xff"  # Metadata v5 with a truncated body
        malformed.sendall(struct.pack(">i", len(body)) + body)
        assert closed_by_broker(malformed)
        truncated = connect(broker)
        truncated.sendall(struct.pack(">i", 100) + header(18, 0, 3))  # then hangs up
        truncated.close()
        for sock in (huge, negative, unknown, malformed):
            sock.close()
        # The real clients are still served.
        send_one(broker, topic(), b"still serving")
    finally:
        for sock in silent:
            sock.close()


def test_api_versions_above_the_served_range_get_kip_511_answer(broker: str) -> None:
    sock = connect(broker)
    try:
        # ApiVersions v99, a flexible header; the broker cannot parse it, and answers at v0.
        body = header(18, 99, 42) + b"\0"
        sock.sendall(struct.pack(">i", len(body)) + body)
        frame = read_frame(sock)
        correlation_id = struct.unpack(">i", frame[:4])[0]
        response, _ = entity_reader(ApiVersionsResponse)(frame, 4)
        assert correlation_id == 42
        assert response.error_code is ErrorCode.unsupported_version
        served = {int(k.api_key): (k.min_version, k.max_version) for k in response.api_keys}
        assert served[18] == (0, 4)
        assert {0, 1, 2, 3, 22} <= set(served)
        # The connection stays usable: the client retries at a version served.
        body = header(18, 0, 43)
        sock.sendall(struct.pack(">i", len(body)) + body)
        frame = read_frame(sock)
        response, _ = entity_reader(ApiVersionsResponse)(frame, 4)
        assert response.error_code is ErrorCode.none
    finally:
        sock.close()


# -- idempotence, on the wire --------------------------------------------------------------


def test_idempotent_retry_is_not_appended_twice(broker: str) -> None:
    name = topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        init = wire.call(
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
            ),
            InitProducerIdResponse,
        )
        assert init.error_code is ErrorCode.none
        pid = init.producer_id

        def send(sequence: int, values: list[bytes]) -> Any:
            request = produce.ProduceRequest(
                acks=i16(-1),
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
                topic_data=(
                    produce.TopicProduceData(
                        name=TopicName(name),
                        partition_data=(
                            produce.PartitionProduceData(
                                index=i32(0), records=Records(batch(pid, sequence, values))
                            ),
                        ),
                    ),
                ),
            )
            response = wire.call(request, ProduceResponse)
            return response.responses[0].partition_responses[0]

        first = send(0, [b"a", b"b"])
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        retry = send(0, [b"a", b"b"])  # the same batch again: the producer's retry
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
        second = send(2, [b"c"])
        assert (second.error_code, second.base_offset) == (ErrorCode.none, 2)
        gap = send(9, [b"x"])  # a sequence gap: refused, not appended
        assert gap.error_code is ErrorCode.out_of_order_sequence_number
        [(_, _, latest)] = offsets(wire, [(name, 0, -1)])
        assert latest == 3  # a, b, c: nothing twice
    finally:
        wire.sock.close()


# -- the broker in a thread, in process --------------------------------------------------


def test_broker_thread_starts_fast_and_serves() -> None:
    started = time.perf_counter()
    with BrokerThread(partitions=2) as address:
        start_time = time.perf_counter() - started
        metadata = send_one(address, topic(), b"in process")
    assert metadata.offset == 0
    print(f"BrokerThread started in {start_time * 1e3:.1f} ms")
    assert start_time < 1.0


def test_limits_idle_connections_and_connection_count() -> None:
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        *OLD_DEFAULTS,
        "--idle-seconds",
        "0.5",
        "--max-connections",
        "3",
    )
    try:
        idle = [connect(address) for _ in range(3)]
        extra = connect(address)
        assert closed_by_broker(extra)  # beyond --max-connections: closed at once
        started = time.monotonic()
        assert all(closed_by_broker(sock) for sock in idle)  # silent for --idle-seconds
        assert 0.4 <= time.monotonic() - started < 3.0
        for sock in [*idle, extra]:
            sock.close()
        send_one(address, topic(), b"served again")
    finally:
        assert stop_server(process) == 0


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


@pytest.mark.anyio
async def test_rss_stays_bounded_under_a_produce_flood() -> None:
    if sys.platform != "linux":
        pytest.skip("reads the broker's RSS from /proc (Linux)")
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        *OLD_DEFAULTS,
        "--retain-bytes",
        str(2_000_000),
        "--retain-total-bytes",
        str(8_000_000),
    )
    try:
        name = topic()
        value = bytes(range(256)) * 400  # 100 kB
        async with asyncio.timeout(60):
            producer = AIOKafkaProducer(bootstrap_servers=address, linger_ms=5)
            await producer.start()
            try:
                await producer.send_and_wait(name, value)
                warm = rss_mib(process.pid)
                peak = warm
                for _ in range(3):  # 75 MB in all, far beyond what is retained
                    sends = [await producer.send(name, value) for _ in range(250)]
                    await asyncio.gather(*sends)
                    peak = max(peak, rss_mib(process.pid))
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(bootstrap_servers=address)
            await consumer.start()
            try:
                tps = [AioTopicPartition(name, p) for p in range(PARTITIONS)]
                earliest = await consumer.beginning_offsets(tps)
                latest = await consumer.end_offsets(tps)
            finally:
                await consumer.stop()
    finally:
        assert stop_server(process) == 0
    print(f"RSS {warm} MiB warm, {peak} MiB at most during a 75 MB flood (8 MB retained)")
    assert peak - warm < 64
    assert sum(latest.values()) == 751
    assert all(earliest[tp] > 0 for tp in tps)  # the oldest batches were dropped
    retained = sum(latest[tp] - earliest[tp] for tp in tps)
    assert retained * len(value) <= 8_000_000 + 3 * len(value)


def test_exit_prints_the_versions_negotiated_and_how_operations_ended() -> None:
    """On SIGTERM: per client, the API versions it used; per purgatory, its counts.
    (The bench: tests/bench/test_bench_smoke.py runs ``python -m bench kafka --smoke``.)"""
    process, address = start_server("-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS)

    async def work() -> None:
        name = topic()
        producer = AIOKafkaProducer(bootstrap_servers=address, acks="all")
        consumer = AIOKafkaConsumer(bootstrap_servers=address, fetch_max_wait_ms=100)
        await producer.start()
        await consumer.start()
        try:
            await producer.partitions_for(name)
            await producer.send_and_wait(name, b"v", partition=0)  # a DelayedProduce
            consumer.assign([AioTopicPartition(name, 1)])  # empty: its fetches expire
            await consumer.seek_to_beginning()
            await consumer.getmany(timeout_ms=400)
        finally:
            await consumer.stop()
            await producer.stop()

    try:
        asyncio.run(work())
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    negotiated = [line for line in out.splitlines() if line.startswith("negotiated: ")]
    assert any("api=0 version=" in line for line in negotiated)  # Produce
    assert any("api=1 version=11" in line for line in negotiated)  # Fetch
    ended = {}
    for line in out.splitlines():
        if line.startswith("purgatory: "):
            name, *counts = line.removeprefix("purgatory: ").split()
            ended[name] = {k: float(v) for k, v in (c.split("=") for c in counts)}
    assert set(ended) == {"produce", "fetch", "join", "heartbeat", "transaction"}
    assert ended["produce"]["completed"] >= 1
    assert ended["fetch"]["expired"] >= 1  # the consumer's long polls on partition 1
    assert ended["fetch"]["completed"] >= 1  # the followers' fetches, woken by the produce
    assert ended["join"]["completed"] == ended["heartbeat"]["expired"] == 0
