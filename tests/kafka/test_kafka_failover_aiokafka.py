"""Failover with aiokafka against a 3-node cluster in one process (issue 37): an
idempotent acks=all producer across the stop and restart of its partitions' leader, a
consumer group across the stop of its coordinator's node, injected errors retried (and
one that is not), and transactions in flight when their coordinator's node stops.

Each test runs the cluster on its own loop (``KafkaBroker(nodes=3)``) and bounds every
wait with ``asyncio.timeout`` (no pytest-timeout here), so a test fails, never hangs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.errors import (
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    TopicAuthorizationFailedError,
)

from aiopurgatory.kafka import KafkaBroker

from ..support.kafka_wire import WATCHDOG, cluster_broker, high_watermarks, injected, name

pytestmark = pytest.mark.anyio

FOLLOWER_DELAY = 0.02
"""Seconds a follower waits after a fetch that brought data: the followers lag the
leader, so a leader that stops leaves records not replicated (truncated, then sent
again by the producer's retries)."""


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 20 ms until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 1):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    pytest.fail(f"not within {timeout:g} s: {what}")


async def read_all(
    bootstrap: str, topic: str, ends: dict[int, int], *, isolation: str = "read_uncommitted"
) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of ``topic``'s partitions from the start until each
    partition's position reaches its end in ``ends`` (no group: assigned)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    try:
        tps = [AioTopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
        for tp in tps:
            while await consumer.position(tp) < ends[tp.partition]:
                batches = await consumer.getmany(tp, timeout_ms=200)
                read[tp.partition].extend(
                    (record.offset, record.value or b"") for record in batches.get(tp, [])
                )
        return read
    finally:
        await consumer.stop()


# -- 1. an idempotent producer across the stop and restart of its leader ---------------


FIGURES: dict[str, list[float]] = collections.defaultdict(list)
"""What the tests measured, printed at the end of each (-s shows it)."""


async def test_idempotent_producer_survives_its_leader_stopping_and_restarting() -> None:
    async with asyncio.timeout(WATCHDOG), cluster_broker(follower_delay=FOLLOWER_DELAY) as broker:
        topic, partitions = name("idem"), 4
        broker.create_topic(topic, partitions)
        victim = broker.leader(topic, 0)
        moving = [p for p in range(partitions) if broker.leader(topic, p) == victim]
        assert len(moving) == 2  # leaders round 3 nodes: partitions 0 and 3
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            retry_backoff_ms=20,
            request_timeout_ms=5000,
        )
        await producer.start()
        acked: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        """Per partition, (sequence, offset) of each record acknowledged, in ack order."""
        ack_times: dict[int, list[tuple[float, int]]] = {p: [] for p in range(partitions)}
        failed: list[BaseException] = []
        stop_sending = asyncio.Event()

        def on_done(partition: int, seq: int, future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                failed.append(asyncio.CancelledError())
            elif future.exception() is not None:
                failed.append(future.exception())  # type: ignore[arg-type]
            else:
                acked[partition].append((seq, future.result().offset))
                ack_times[partition].append((time.monotonic(), future.result().offset))

        async def send_continuously() -> int:
            seq = 0
            while not stop_sending.is_set():
                for p in range(partitions):
                    value = f"{seq}".encode()
                    future = await producer.send(topic, value, partition=p)
                    future.add_done_callback(lambda f, p=p, s=seq: on_done(p, s, f))
                seq += 1
                await asyncio.sleep(0.002)
            return seq

        sender = asyncio.create_task(send_continuously())
        try:
            await wait_until(lambda: all(len(a) >= 50 for a in acked.values()), "50 acks each")
            hw_before = high_watermarks(broker, topic)
            stopped = time.monotonic()
            await broker.stop_node(victim)
            # What the new leaders hold: an ack at or above it is the new leader's.
            new_start = {p: broker.offsets(topic)[p].log_end for p in moving}
            assert all(broker.leader(topic, p) != victim for p in moving)
            assert all(new_start[p] >= hw_before[p] for p in moving)  # HW kept
            await wait_until(
                lambda: all(any(o >= new_start[p] for _, o in ack_times[p]) for p in moving),
                "an ack from each new leader",
            )
            firsts = [
                min(t for t, o in ack_times[p] if o >= new_start[p]) - stopped for p in moving
            ]
            count = {p: len(acked[p]) for p in moving}
            await wait_until(
                lambda: all(len(acked[p]) >= count[p] + 50 for p in moving), "50 more acks"
            )
            await broker.start_node(victim)
            await wait_until(
                lambda: all(victim in broker.isr(topic, p) for p in moving),
                "the restarted node back in sync",
            )
            count = {p: len(acked[p]) for p in moving}
            await wait_until(
                lambda: all(len(acked[p]) >= count[p] + 50 for p in moving), "50 more acks"
            )
        finally:
            stop_sending.set()
            sent = await sender
            await producer.flush()
            await producer.stop()
        assert not failed, failed[:3]
        ends = high_watermarks(broker, topic)
        read = await read_all(broker.bootstrap, topic, ends)
    total_acked = total_read = lost = duplicated = 0
    for p in range(partitions):
        values = [int(value) for _, value in read[p]]
        sequences = [seq for seq, _ in acked[p]]
        assert sequences == sorted(sequences)  # acknowledged in the order sent
        assert sequences == list(range(sent))  # every send acknowledged (none failed)
        counts = collections.Counter(values)
        lost += sum(1 for seq in sequences if counts[seq] == 0)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        assert values == sequences, f"partition {p}: read back != acknowledged"
        # The offsets the producer was told are where the records are.
        assert [o for o, _ in read[p]] == [o for _, o in acked[p]]
        total_acked += len(sequences)
        total_read += len(values)
    assert (lost, duplicated) == (0, 0)
    truncated = sum(
        int(m.group(1))
        for line in broker.fault_log.lines
        if (m := re.search(r"; (\d+) offsets not replicated truncated", line))
    )
    first_ack_ms = min(firsts) * 1000
    FIGURES["first_ack_ms"].append(first_ack_ms)
    print(
        f"\nstop_node -> first ack on the new leader: {first_ack_ms:.0f} ms"
        f" (per moved partition: {[round(f * 1000) for f in firsts]});"
        f" acknowledged {total_acked}, read back {total_read},"
        f" lost {lost}, duplicated {duplicated}; offsets truncated (sent again) {truncated}"
    )


# -- 2. a consumer group across the stop of its coordinator's node ---------------------


async def produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for value in values:
            await producer.send(topic, value, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def group_member(broker: KafkaBroker, topic: str, group: str, **options: Any) -> AIOKafkaConsumer:
    """A member of ``group`` reading ``topic`` from the start, committing by hand."""
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        retry_backoff_ms=20,
        **options,
    )


async def consume(consumer: AIOKafkaConsumer, count: int) -> list[tuple[int, int, bytes]]:
    """The next ``count`` records (partition, offset, value) the consumer gets."""
    got: list[tuple[int, int, bytes]] = []
    while len(got) < count:
        batches = await consumer.getmany(timeout_ms=200, max_records=count - len(got))
        for tp, records in batches.items():
            got.extend((tp.partition, r.offset, r.value or b"") for r in records)
    return got


async def test_consumer_group_survives_its_coordinators_node_stopping() -> None:
    async with asyncio.timeout(WATCHDOG), cluster_broker() as broker:
        topic, group = name("grp"), name("g")
        broker.create_topic(topic, 2)
        coordinator = broker.coordinator(group)
        await produce(broker.bootstrap, topic, [b"a%d" % i for i in range(10)], 0)
        await produce(broker.bootstrap, topic, [b"b%d" % i for i in range(10)], 1)
        consumer = group_member(
            broker, topic, group, heartbeat_interval_ms=100, session_timeout_ms=6000
        )
        await consumer.start()
        try:
            before = await consume(consumer, 12)
            await consumer.commit()
            committed = broker.committed(group)
            assert sum(committed.values()) == 12
            generation = broker.group(group).generation
            await broker.stop_node(coordinator)
            assert broker.coordinator(group) != coordinator
            after = await consume(consumer, 8)
            await consumer.commit()  # to the new coordinator
            assert sum(broker.committed(group).values()) == 20
            # One member all along: nothing to rebalance, nothing re-read.
            assert broker.group(group).generation == generation
        finally:
            await consumer.stop()
        # Committed offsets kept across the move: a new member starts from them.
        await produce(broker.bootstrap, topic, [b"a10", b"a11"], 0)
        late = group_member(broker, topic, group)
        await late.start()
        try:
            rest = await consume(late, 2)
            assert await late.getmany(timeout_ms=300) == {}
        finally:
            await late.stop()
    seen = [(p, o) for p, o, _ in before + after]
    assert len(seen) == len(set(seen)) == 20  # each record once, none re-read
    assert sorted(v for _, _, v in before + after) == sorted(
        [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
    )
    assert [(p, o, v) for p, o, v in rest] == [(0, 10, b"a10"), (0, 11, b"a11")]


# -- 3. injected errors: retried as documented, or raised --------------------------------


@contextlib.asynccontextmanager
async def first_written(
    broker: KafkaBroker, topic: str
) -> AsyncIterator[tuple[int, AIOKafkaProducer]]:
    """``topic`` created (one partition); its leader, and an idempotent producer that
    wrote b"first" to it, stopped at the end."""
    broker.create_topic(topic, 1)
    leader = broker.leader(topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        enable_idempotence=True,
        acks="all",
        retry_backoff_ms=20,
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"first", partition=0)
        yield leader, producer
    finally:
        await producer.stop()


async def test_retriable_errors_injected_are_retried_and_the_client_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with asyncio.timeout(WATCHDOG), cluster_broker() as broker:
        topic, group = name("retry"), name("g")
        async with first_written(broker, topic) as (leader, producer):
            # Produce: NOT_LEADER_OR_FOLLOWER three times, from the leader itself.
            broker.inject("Produce", "NOT_LEADER_OR_FOLLOWER", 3, node=leader)
            sent = await producer.send_and_wait(topic, b"second", partition=0)
            assert sent.offset == 1  # written once, after the three refusals
            assert len(injected(broker, "Produce", "not_leader_or_follower")) == 3
            # Metadata: the topic's LEADER_NOT_AVAILABLE, twice, to a producer that
            # must learn the topic's leader before it sends.
            fresh = name("retry")
            broker.create_topic(fresh, 1)
            broker.inject("Metadata", "LEADER_NOT_AVAILABLE", 2)
            await producer.send_and_wait(fresh, b"after metadata", partition=0)
            assert len(injected(broker, "Metadata", "leader_not_available")) == 2
        retried = [r for r in caplog.records if "retrying" in r.getMessage()]
        assert len(retried) >= 3  # aiokafka's warning per Produce answer retried
        # FindCoordinator: COORDINATOR_NOT_AVAILABLE twice; Fetch: NOT_LEADER_OR_FOLLOWER
        # twice, from the leader itself.
        broker.inject("FindCoordinator", "COORDINATOR_NOT_AVAILABLE", 2)
        broker.inject("Fetch", "NOT_LEADER_OR_FOLLOWER", 2, node=leader)
        consumer = group_member(broker, topic, group)
        await consumer.start()
        try:
            got = await consume(consumer, 2)
            await consumer.commit()
        finally:
            await consumer.stop()
        assert [(o, v) for _, o, v in got] == [(0, b"first"), (1, b"second")]
        assert broker.committed(group) == {(topic, 0): 2}
        assert len(injected(broker, "FindCoordinator", "coordinator_not_available")) == 2
        assert len(injected(broker, "Fetch", "not_leader_or_follower")) == 2
        assert broker.faults.pending() == []  # every injected answer was taken
        assert [o.high_watermark for o in broker.offsets(topic)] == [2]  # no duplicate
    counts = {
        api: len(injected(broker, api, error))
        for api, error in [
            ("Produce", "not_leader_or_follower"),
            ("Metadata", "leader_not_available"),
            ("FindCoordinator", "coordinator_not_available"),
            ("Fetch", "not_leader_or_follower"),
        ]
    }
    print(f"\ninjected answers taken (each followed by a retry that succeeded): {counts}")


async def test_non_retriable_errors_injected_surface_as_aiokafka_exceptions() -> None:
    async with asyncio.timeout(WATCHDOG), cluster_broker() as broker:
        topic = name("fatal")
        async with first_written(broker, topic) as (leader, producer):
            broker.inject("Produce", "TOPIC_AUTHORIZATION_FAILED", 1, node=leader)
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, b"refused", partition=0)
            broker.inject("Produce", "MESSAGE_TOO_LARGE", 1, node=leader)
            with pytest.raises(MessageSizeTooLargeError):
                await producer.send_and_wait(topic, b"refused too", partition=0)
            # aiokafka spent the refused batches' sequence numbers and keeps its
            # producer id: the broker sees a gap (as Kafka's would), and the
            # partition refuses this producer from now on.
            with pytest.raises(OutOfOrderSequenceNumber):
                await producer.send_and_wait(topic, b"gap", partition=0)
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all"
        )
        await producer.start()
        try:
            after = await producer.send_and_wait(topic, b"after", partition=0)
        finally:
            await producer.stop()
        # Answered once each: not retried.
        assert len(injected(broker, "Produce", "topic_authorization_failed")) == 1
        assert len(injected(broker, "Produce", "message_too_large")) == 1
        assert after.offset == 1
        broker.inject("Fetch", "TOPIC_AUTHORIZATION_FAILED", 1, node=leader)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=20
        )
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            with pytest.raises(TopicAuthorizationFailedError):
                await consumer.getmany(tp, timeout_ms=2000)
            records = await consumer.getmany(tp, timeout_ms=2000)
        finally:
            await consumer.stop()
        assert [r.value for r in records[tp]] == [b"first", b"after"]
        assert len(injected(broker, "Fetch", "topic_authorization_failed")) == 1


# -- 4. a transaction in flight when its coordinator's node stops ------------------------


async def test_transaction_in_flight_when_its_coordinator_stops_is_whole_or_none() -> None:
    async with asyncio.timeout(WATCHDOG), cluster_broker() as broker:
        topic = name("txn")
        broker.create_topic(topic, 2)
        transactional_id = name("tx")
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            transactional_id=transactional_id,
            retry_backoff_ms=20,
        )
        await producer.start()
        try:
            # Committed: the coordinator's node stops between the sends and the commit.
            first = broker.coordinator(transactional_id)
            await producer.begin_transaction()
            for i in range(10):
                await producer.send_and_wait(topic, b"c%d" % i, partition=i % 2)
            await broker.stop_node(first)
            assert broker.coordinator(transactional_id) not in (first, -1)
            assert broker.transaction(transactional_id).state == "Ongoing"
            started = time.monotonic()
            await producer.commit_transaction()
            commit_s = time.monotonic() - started
            await broker.start_node(first)
            # Aborted: the (new) coordinator's node stops mid-transaction too.
            second = broker.coordinator(transactional_id)
            await producer.begin_transaction()
            for i in range(10):
                await producer.send_and_wait(topic, b"a%d" % i, partition=i % 2)
            await broker.stop_node(second)
            assert broker.coordinator(transactional_id) not in (first, second, -1)
            started = time.monotonic()
            await producer.abort_transaction()
            abort_s = time.monotonic() - started
            # And the producer goes on: one more committed, on the third coordinator.
            async with producer.transaction():
                await producer.send_and_wait(topic, b"last", partition=0)
        finally:
            # Bounded on its own: the watchdog cancels once, and a stop that waits
            # for a coordinator would otherwise hold the test past it.
            async with asyncio.timeout(5.0):
                await producer.stop()
        ends = high_watermarks(broker, topic)
        assert all(broker.last_stable_offset(topic, p) == ends[p] for p in ends)
        committed = await read_all(broker.bootstrap, topic, ends, isolation="read_committed")
        everything = await read_all(broker.bootstrap, topic, ends)
    values = sorted(v for p in committed for _, v in committed[p])
    assert values == sorted([b"c%d" % i for i in range(10)] + [b"last"])
    uncommitted = sorted(v for p in everything for _, v in everything[p])
    assert uncommitted == sorted(values + [b"a%d" % i for i in range(10)])
    print(
        f"\nFIGURES transactions: coordinator {first} stopped -> commit_transaction"
        f" {commit_s * 1000:.0f} ms; coordinator {second} stopped -> abort_transaction"
        f" {abort_s * 1000:.0f} ms; read_committed {len(values)} of"
        f" {len(uncommitted)} records"
    )
