"""Failover with a real client: confluent-kafka (librdkafka) against three nodes in one
process (issue 37). An idempotent acks=all producer keeps every acknowledged record,
once and in order, through its leader's stop and restart; a consumer group keeps its
committed offsets through its coordinator's stop; librdkafka validates its position
with the new leader (KIP-320: Fetch's current_leader_epoch, OffsetForLeaderEpoch; it
does so only with a broker serving Metadata v9+, as this one does); injected errors
are retried as its docs say, or surface as the documented error; a transaction in
flight when its coordinator stops commits (or aborts) whole.

librdkafka's timeouts are kept short (socket, backoffs, metadata refresh) and every
wait is bounded here: a test fails, it never hangs. What a test measures it prints
(``pytest -s`` shows it). librdkafka's own log lines go to the ``tests.librdkafka``
logger, not stderr.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.faults import OFFSET_FOR_LEADER_EPOCH

from ..support.kafka_wire import (
    WATCHDOG,
    bounded,
    cluster_thread,
    high_watermarks,
    injected,
    name,
    running,
    wait_for,
)

LIBRDKAFKA_LOG = logging.getLogger("tests.librdkafka")

FAST: dict[str, Any] = {
    "socket.timeout.ms": 3000,
    "socket.connection.setup.timeout.ms": 3000,
    "topic.metadata.refresh.interval.ms": 1000,
    "metadata.max.age.ms": 3000,
    "retry.backoff.ms": 50,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 200,
    "logger": LIBRDKAFKA_LOG,
}
"""librdkafka's timeouts, short, for every client here."""
CONSUMER: dict[str, Any] = {
    **FAST,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "session.timeout.ms": 6000,  # the broker's group.min.session.timeout.ms
    "heartbeat.interval.ms": 300,
    "fetch.wait.max.ms": 100,
}


@pytest.fixture
def cluster() -> Iterator[BrokerThread]:
    with running(cluster_thread()) as thread:
        yield thread


def producer_of(bootstrap: str, config: dict[str, Any]) -> confluent_kafka.Producer:
    """A producer with the short timeouts (FAST) and ``config``."""
    return confluent_kafka.Producer({**FAST, "bootstrap.servers": bootstrap, **config})


def member_of(
    bootstrap: str, group: str, config: dict[str, Any] | None = None
) -> confluent_kafka.Consumer:
    """A consumer of ``group`` with the short timeouts (CONSUMER) and ``config``."""
    return confluent_kafka.Consumer(
        {**CONSUMER, "bootstrap.servers": bootstrap, "group.id": group, **(config or {})}
    )


def polled(consumer: confluent_kafka.Consumer) -> bytes | None:
    """The value of the record ``consumer`` polls within 0.1 s (None: none came)."""
    message = consumer.poll(0.1)
    if message is None:
        return None
    assert message.error() is None, message.error()
    value = message.value()
    assert isinstance(value, bytes)
    return value


def finish(producer: confluent_kafka.Producer) -> None:
    """Flush within bounds; drop what is left (a failing test leaves nothing behind)."""
    if producer.flush(WATCHDOG) > 0:
        producer.purge()
        producer.flush(1)


def requests(cluster: BrokerThread, client_id: str, api_key: int) -> int:
    """How many ``api_key`` requests ``client_id`` sent (any version)."""

    def count(broker: KafkaBroker) -> int:
        return sum(
            n
            for (cid, key, _), n in broker.negotiated.items()
            if (cid, key) == (client_id, api_key)
        )

    return cluster.call(count)


def fields(message: confluent_kafka.Message) -> tuple[int, int, bytes, int]:
    """(partition, offset, value, leader epoch: -1 if unknown) of a delivered or
    consumed record."""
    partition, offset, value = message.partition(), message.offset(), message.value()
    epoch = message.leader_epoch()
    assert partition is not None
    assert offset is not None
    assert isinstance(value, bytes)
    return partition, offset, value, -1 if epoch is None else epoch


def produce_all(bootstrap: str, topic: str, values: dict[int, list[bytes]]) -> None:
    """Write ``values`` (partition to values) with an idempotent acks=all producer."""
    producer = producer_of(bootstrap, {"enable.idempotence": True, "acks": "all"})
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: confluent_kafka.Message) -> None:
        if err is not None:
            failed.append(err)

    try:
        for partition, listed in values.items():
            for value in listed:
                producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
        assert producer.flush(WATCHDOG) == 0
        assert failed == []
    finally:
        finish(producer)


def read_partitions(
    bootstrap: str, topic: str, ends: dict[int, int], isolation: str = "read_uncommitted"
) -> dict[int, list[tuple[int, bytes, int]]]:
    """(offset, value, leader epoch) of each record of each partition up to ``ends``
    (its high watermark, or last stable offset), read from the start."""
    consumer = member_of(bootstrap, name("reader"), {"isolation.level": isolation})
    got: dict[int, list[tuple[int, bytes, int]]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + WATCHDOG

        def done() -> bool:
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            return all(tp.offset >= ends[tp.partition] for tp in positions)

        while not done():
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} only"
            for message in consumer.consume(500, 0.1):
                assert message.error() is None, message.error()
                partition, offset, value, epoch = fields(message)
                got[partition].append((offset, value, epoch))
    finally:
        bounded(consumer.close)
    return got


# -- 1. an idempotent acks=all producer through its leader's stop and restart -----------


def test_idempotent_producer_loses_and_duplicates_nothing_across_a_leader_stop(
    cluster: BrokerThread,
) -> None:
    topic = name("fo")
    cluster.create_topic(topic, 4)  # leaders round the nodes: partitions 0 and 3 share one
    partitions = range(4)
    victim = cluster.leader(topic, 0)
    moved = [p for p in partitions if cluster.leader(topic, p) == victim]
    assert moved == [0, 3]
    acked: dict[int, list[tuple[int, int, float]]] = {p: [] for p in partitions}
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            failed.append(err)
        else:
            partition, offset, value, _ = fields(msg)
            acked[partition].append((offset, int(value), time.monotonic()))

    producer = producer_of(
        cluster.bootstrap,
        {
            "client.id": "fo-producer",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 20000,
        },
    )
    sent = [0] * 4

    def pump(until: Callable[[], bool], seconds: float) -> None:
        """Send one record to each partition every few ms, until ``until()`` or for
        ``seconds``; ``until`` is asked every 50 ms."""
        deadline = time.monotonic() + seconds
        asked = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() - asked > 0.05:
                asked = time.monotonic()
                if until():
                    return
            for p in partitions:
                producer.produce(
                    topic, value=str(sent[p]).encode(), partition=p, on_delivery=delivered
                )
                sent[p] += 1
            producer.poll(0.004)

    def never() -> bool:
        return False

    def warmed_up() -> bool:
        return all(len(acked[p]) >= 100 for p in partitions)

    try:
        pump(warmed_up, WATCHDOG)
        assert warmed_up()

        async def stop(broker: KafkaBroker) -> dict[int, int]:
            await broker.stop_node(victim)
            # Where the new leader's log starts: what is acknowledged beyond it was
            # appended by the new leader.
            return {p: o.log_end for p, o in enumerate(broker.offsets(topic))}

        stopped = time.monotonic()
        cut = cluster.call(stop)
        assert all(cluster.leader(topic, p) not in (victim, -1) for p in moved)

        def new_leader_acked() -> bool:
            return all(any(off >= cut[p] for off, _, _ in acked[p]) for p in moved)

        pump(new_leader_acked, WATCHDOG)
        assert new_leader_acked(), "no acknowledgement from the new leader"
        first = min(at for p in moved for off, _, at in acked[p] if off >= cut[p]) - stopped
        pump(never, 0.3)
        cluster.start_node(victim)

        def back_in_sync() -> bool:
            return all(victim in cluster.isr(topic, p) for p in moved)

        pump(back_in_sync, WATCHDOG)
        assert back_in_sync()
        pump(never, 0.3)
        assert producer.flush(WATCHDOG) == 0
    finally:
        finish(producer)
    assert failed == []
    ends = high_watermarks(cluster, topic)
    got = read_partitions(cluster.bootstrap, topic, ends)
    total_acked = total_read = lost = duplicated = 0
    for p in partitions:
        # Every record sent was acknowledged, in the order sent, at increasing offsets.
        assert [value for _, value, _ in acked[p]] == list(range(sent[p]))
        offsets = [off for off, _, _ in acked[p]]
        assert offsets == sorted(set(offsets))
        values = [int(value) for _, value, _ in got[p]]
        lost += len(set(range(sent[p])) - set(values))
        duplicated += len(values) - len(set(values))
        assert values == list(range(sent[p])), f"partition {p}"
        assert [off for off, _, _ in got[p]] == offsets  # read where acknowledged
        total_acked += len(acked[p])
        total_read += len(values)
    # The records appended by the new leader carry its epoch (KIP-320's source).
    for p in moved:
        assert cluster.leader_epoch(topic, p) == 1
        assert {epoch for off, _, epoch in got[p] if off >= cut[p]} == {1}
        assert {epoch for off, _, epoch in got[p] if off < cut[p]} == {0}
    assert (lost, duplicated) == (0, 0)
    assert total_acked == total_read == sum(sent)
    print(
        f"\nFIGURES producer failover: stop_node -> first ack on the new leader {first:.3f} s;"
        f" acknowledged {total_acked}, read back {total_read}, lost {lost},"
        f" duplicated {duplicated}; cut {cut}"
    )
    assert first < 5.0


# -- 2. a consumer group through its coordinator's stop --------------------------------


def test_consumer_group_keeps_its_offsets_when_its_coordinator_stops(cluster: BrokerThread) -> None:
    topic, group = name("fo"), name("g")
    cluster.create_topic(topic, 2)
    coordinator = cluster.coordinator(group)
    first = {p: [f"{p}:{i}".encode() for i in range(30)] for p in range(2)}
    produce_all(cluster.bootstrap, topic, first)
    consumer = member_of(cluster.bootstrap, group, {"client.id": "fo-member"})
    seen: list[bytes] = []

    def read_until(count: int) -> None:
        deadline = time.monotonic() + WATCHDOG
        while len(seen) < count:
            assert time.monotonic() < deadline, f"read {len(seen)} of {count}"
            value = polled(consumer)
            if value is not None:
                seen.append(value)

    def commit() -> int:
        """Commit the positions (synchronously); retried while librdkafka says the error
        is retriable (its docs: the commit may be retried). Returns the attempts."""
        for attempt in range(1, 50):
            try:
                consumer.commit(asynchronous=False)
                return attempt
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                time.sleep(0.1)
        raise AssertionError("the commit never went through")

    try:
        consumer.subscribe([topic])
        read_until(25)
        commit()
        positions = {
            tp.partition: tp.offset
            for tp in consumer.position(consumer.assignment())
            if tp.offset >= 0  # a partition not fetched from yet has no position
        }
        assert sum(positions.values()) == 25
        assert {tp.partition: o for tp, o in cluster.committed(group).items()} == positions
        stopped = time.monotonic()
        cluster.stop_node(coordinator)
        assert cluster.coordinator(group) != coordinator
        second = {p: [f"{p}:{i}".encode() for i in range(30, 50)] for p in range(2)}
        produce_all(cluster.bootstrap, topic, second)
        read_until(100)
        resumed = time.monotonic() - stopped
        attempts = commit()
        committed = {tp.partition: o for tp, o in cluster.committed(group).items()}
        assert committed == {0: 50, 1: 50}
        assert len(consumer.assignment()) == 2  # no rebalance took them away
    finally:
        bounded(consumer.close)
    # Everything committed before the stop stayed read: librdkafka kept its positions
    # (at-least-once would allow re-reading what was read but not committed; nothing was).
    assert len(seen) == len(set(seen)) == 100
    assert set(seen) == {
        v for values in (first, second) for listed in values.values() for v in listed
    }
    # A new member of the group starts at the committed offsets: only what comes next.
    produce_all(cluster.bootstrap, topic, {0: [b"late-0"], 1: [b"late-1"]})
    consumer = member_of(cluster.bootstrap, group)
    seen.clear()
    try:
        consumer.subscribe([topic])
        read_until(2)
        assert sorted(seen) == [b"late-0", b"late-1"]
        assert consumer.poll(0.3) is None
    finally:
        bounded(consumer.close)
    print(
        f"\nFIGURES group failover: coordinator node {coordinator} stopped; all 100 read"
        f" once in {resumed:.3f} s; commit after the stop took {attempts} attempt(s)"
    )


# -- KIP-320: a consumer validates its position with the new leader --------------------


def test_consumer_validates_its_position_with_the_new_leader(cluster: BrokerThread) -> None:
    """librdkafka fetches with the leader epoch it knows and, once Metadata shows a new
    one, asks the new leader OffsetForLeaderEpoch before fetching from it. The first such
    answer is an injected NOT_LEADER_OR_FOLLOWER: it asks again."""
    topic = name("fo")
    cluster.create_topic(topic, 1)
    produce_all(cluster.bootstrap, topic, {0: [b"%d" % i for i in range(50)]})
    consumer = member_of(cluster.bootstrap, name("g"), {"client.id": "fo-kip320"})
    got: list[tuple[int, int]] = []

    def read_until(count: int) -> None:
        deadline = time.monotonic() + WATCHDOG
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count}"
            for message in consumer.consume(100, 0.1):
                assert message.error() is None, message.error()
                _, _, value, epoch = fields(message)
                got.append((int(value), epoch))

    try:
        consumer.assign([TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        read_until(50)
        assert requests(cluster, "fo-kip320", OFFSET_FOR_LEADER_EPOCH) == 0
        cluster.inject("OffsetForLeaderEpoch", "NOT_LEADER_OR_FOLLOWER", 1)
        stopped = time.monotonic()
        cluster.stop_node(cluster.leader(topic))
        produce_all(cluster.bootstrap, topic, {0: [b"%d" % i for i in range(50, 100)]})
        read_until(100)
        resumed = time.monotonic() - stopped
    finally:
        bounded(consumer.close)
    assert [value for value, _ in got] == list(range(100))  # nothing re-read or skipped
    assert {epoch for value, epoch in got if value < 50} == {0}
    assert {epoch for value, epoch in got if value >= 50} == {1}
    asked = requests(cluster, "fo-kip320", OFFSET_FOR_LEADER_EPOCH)
    assert len(injected(cluster, "OffsetForLeaderEpoch", "not_leader_or_follower")) == 1
    assert asked >= 2  # the injected answer, then the one it validated with
    print(
        f"\nFIGURES KIP-320: OffsetForLeaderEpoch asked {asked} times (1 injected error);"
        f" reading resumed {resumed:.3f} s after the stop"
    )


# -- 3. injected errors ------------------------------------------------------------------


def test_produce_not_leader_is_retried_without_duplicates(cluster: BrokerThread) -> None:
    topic = name("fo")
    cluster.create_topic(topic, 1)
    leader = cluster.leader(topic)
    producer = producer_of(cluster.bootstrap, {"enable.idempotence": True, "acks": "all"})
    reports: list[tuple[KafkaError | None, int]] = []

    def delivered(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        reports.append((err, fields(msg)[1] if err is None else -1))

    try:
        producer.produce(topic, b"warm-up", on_delivery=delivered)
        assert producer.flush(WATCHDOG) == 0
        cluster.inject("Produce", "NOT_LEADER_OR_FOLLOWER", 3, node=leader)
        for i in range(5):
            producer.produce(topic, b"%d" % i, on_delivery=delivered)
        assert producer.flush(WATCHDOG) == 0
    finally:
        finish(producer)
    assert reports == [(None, offset) for offset in range(6)]
    retried = len(injected(cluster, "Produce", "not_leader_or_follower"))
    assert retried == 3
    got = read_partitions(cluster.bootstrap, topic, {0: 6})
    assert [value for _, value, _ in got[0]] == [b"warm-up"] + [b"%d" % i for i in range(5)]
    print(
        f"\nFIGURES Produce NOT_LEADER_OR_FOLLOWER x3: {retried} injected answers, then acked once"
    )


def test_retriable_errors_on_coordinator_metadata_and_fetch_are_retried(
    cluster: BrokerThread,
) -> None:
    topic, group = name("fo"), name("g")
    cluster.create_topic(topic, 1)
    values = [b"%d" % i for i in range(20)]
    produce_all(cluster.bootstrap, topic, {0: values})
    leader = cluster.leader(topic)
    cluster.inject("FindCoordinator", "COORDINATOR_NOT_AVAILABLE", 2)
    cluster.inject("Metadata", "LEADER_NOT_AVAILABLE", 2)
    cluster.inject("Fetch", "NOT_LEADER_OR_FOLLOWER", 2, node=leader)
    consumer = member_of(cluster.bootstrap, group)
    seen: list[bytes] = []
    started = time.monotonic()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WATCHDOG
        while len(seen) < len(values):
            assert time.monotonic() < deadline, f"read {len(seen)}"
            value = polled(consumer)
            if value is not None:
                seen.append(value)
        consumer.commit(asynchronous=False)
    finally:
        bounded(consumer.close)
    took = time.monotonic() - started
    assert seen == values
    assert {tp.partition: o for tp, o in cluster.committed(group).items()} == {0: 20}
    counts = {
        "FindCoordinator": len(injected(cluster, "FindCoordinator", "coordinator_not_available")),
        "Metadata": len(injected(cluster, "Metadata", "leader_not_available")),
        "Fetch": len(injected(cluster, "Fetch", "not_leader_or_follower")),
    }
    assert counts == {"FindCoordinator": 2, "Metadata": 2, "Fetch": 2}
    print(f"\nFIGURES retriable errors: injected answers {counts}; all read in {took:.3f} s")


def test_non_retriable_errors_surface_as_the_documented_errors(cluster: BrokerThread) -> None:
    """A Produce refused with TOPIC_AUTHORIZATION_FAILED fails its message in the
    delivery report (not retried, nothing written); an OffsetCommit refused with
    GROUP_AUTHORIZATION_FAILED raises KafkaException from a synchronous commit."""
    topic, group = name("fo"), name("g")
    cluster.create_topic(topic, 1)
    produce_all(cluster.bootstrap, topic, {0: [b"kept"]})
    producer = producer_of(cluster.bootstrap, {"acks": "all"})
    reports: list[KafkaError | None] = []
    try:
        cluster.inject("Produce", "TOPIC_AUTHORIZATION_FAILED", 1)
        producer.produce(topic, b"refused", on_delivery=lambda err, _msg: reports.append(err))
        assert producer.flush(WATCHDOG) == 0
        # librdkafka keeps the topic's error and refuses produce() at once (the
        # documented KafkaException) until a metadata refresh clears it.
        refusals: list[int] = []
        deadline = time.monotonic() + WATCHDOG
        while True:
            try:
                producer.produce(topic, b"after", on_delivery=lambda err, _msg: reports.append(err))
                break
            except KafkaException as exc:
                refusals.append(exc.args[0].code())
                assert time.monotonic() < deadline, "the topic's error never cleared"
                producer.poll(0.05)
        assert producer.flush(WATCHDOG) == 0
    finally:
        finish(producer)
    refused, after = reports
    assert refused is not None
    assert after is None
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert not refused.retriable()
    assert not refused.fatal()
    assert set(refusals) <= {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert len(injected(cluster, "Produce", "topic_authorization_failed")) == 1
    got = read_partitions(cluster.bootstrap, topic, {0: 2})
    assert [value for _, value, _ in got[0]] == [b"kept", b"after"]

    consumer = member_of(cluster.bootstrap, group)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        wait_for(lambda: consumer.poll(0.1) is not None, what="a record")
        cluster.inject("OffsetCommit", "GROUP_AUTHORIZATION_FAILED", 1)
        with pytest.raises(KafkaException) as raised:
            consumer.commit(asynchronous=False)
        error = raised.value.args[0]
        assert error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        assert not error.retriable()
        consumer.commit(asynchronous=False)  # the next one goes through
    finally:
        bounded(consumer.close)
    assert len(injected(cluster, "OffsetCommit", "group_authorization_failed")) == 1
    assert {tp.partition: o for tp, o in cluster.committed(group).items()} == {0: 1}
    print(
        f"\nFIGURES non-retriable: Produce -> delivery report {refused.name()}, then"
        f" produce() raised it {len(refusals)} times until the next metadata refresh;"
        f" OffsetCommit -> KafkaException {error.name()}"
    )


# -- 4. a transaction in flight when its coordinator stops -----------------------------


def test_transaction_in_flight_commits_or_aborts_whole_across_a_coordinator_stop(
    cluster: BrokerThread,
) -> None:
    topic, tid = name("fo"), name("tx")
    cluster.create_topic(topic, 2)
    producer = producer_of(
        cluster.bootstrap, {"transactional.id": tid, "transaction.timeout.ms": 30000}
    )
    committed = [b"c%d" % i for i in range(20)]
    aborted = [b"a%d" % i for i in range(10)]
    outcome: dict[str, float] = {}
    try:
        producer.init_transactions(WATCHDOG)
        # A transaction committed after its coordinator's node stopped.
        first = cluster.coordinator(tid)
        producer.begin_transaction()
        for i, value in enumerate(committed[:10]):
            producer.produce(topic, value, partition=i % 2)
        assert producer.flush(WATCHDOG) == 0
        assert cluster.transaction(tid).state == "Ongoing"
        for i, value in enumerate(committed[10:]):
            producer.produce(topic, value, partition=i % 2)  # in flight at the stop
        cluster.stop_node(first)
        assert cluster.coordinator(tid) != first
        started = time.monotonic()
        producer.commit_transaction(WATCHDOG)
        outcome["commit"] = time.monotonic() - started
        assert cluster.transaction(tid).state == "CompleteCommit"
        cluster.start_node(first)
        # A transaction aborted after its (new) coordinator's node stopped.
        second = cluster.coordinator(tid)
        producer.begin_transaction()
        for i, value in enumerate(aborted):
            producer.produce(topic, value, partition=i % 2)
        assert producer.flush(WATCHDOG) == 0
        cluster.stop_node(second)
        started = time.monotonic()
        producer.abort_transaction(WATCHDOG)
        outcome["abort"] = time.monotonic() - started
        assert cluster.transaction(tid).state == "CompleteAbort"
    finally:
        finish(producer)
    ends = {p: cluster.last_stable_offset(topic, p) for p in range(2)}
    assert ends == high_watermarks(cluster, topic)  # none open
    read = read_partitions(cluster.bootstrap, topic, ends, "read_committed")
    visible = sorted(value for p in read for _, value, _ in read[p])
    assert visible == sorted(committed)  # all of the first, none of the second
    read = read_partitions(cluster.bootstrap, topic, ends)
    written = sorted(value for p in read for _, value, _ in read[p])
    assert written == sorted(committed + aborted)  # the aborted were written whole too
    print(
        f"\nFIGURES transactions: coordinator {first} stopped -> commit_transaction"
        f" {outcome['commit']:.3f} s; coordinator {second} stopped -> abort_transaction"
        f" {outcome['abort']:.3f} s"
    )
