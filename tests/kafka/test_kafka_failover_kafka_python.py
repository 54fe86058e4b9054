"""Failover of a three-node cluster (``BrokerThread(nodes=3, replicas=3)``) as a real
client sees it: kafka-python (the package ``kafka``), synchronous, run in the test's
thread against the broker's own thread.

1. An idempotent acks=all producer sends sequence numbers to six partitions while the
   leader of two of them is stopped (its last answers held back, so that what it had
   appended is in flight and sent again to the new leader) and later started again:
   every acknowledged record is read back once, in order per partition; the time from
   ``stop_node`` to the first acknowledgement by the new leader is measured.
2. A consumer group outlives the stop of its coordinator's node: its committed offsets
   are kept, it commits on the new coordinator, and a new member resumes at the last
   commit (kafka-python is at-least-once: nothing committed is read again).
3. Injected errors are retried as kafka-python's docs promise (retriable errors on
   Produce, Metadata, FindCoordinator, JoinGroup, OffsetCommit, OffsetFetch, Fetch,
   ListOffsets and InitProducerId, three each): the records are produced, consumed once
   in order and committed, and ``fault_lines`` shows each injected answer. A
   non-retriable one (TOPIC_AUTHORIZATION_FAILED on Produce) is not retried: the send
   fails with TopicAuthorizationFailedError and nothing is written.
4. Transactions across their coordinator's stop: an EndTxn (commit or abort) handled by
   the coordinator whose node stops before its answer leaves is retried on the new one
   and the transaction ends whole; a transaction open when its coordinator stops ends
   whole too, committed or aborted (kafka-python 3.0.12 cannot add a partition after
   the stop, so the coordinator aborts it at its timeout): a read_committed consumer
   sees all of a transaction or none of it.

Every test runs under a hard timeout (SIGALRM, as pytest-timeout's signal method: the
suite has no pytest-timeout) and bounds each wait itself: kafka-python's transactional
calls, which take no timeout, run in a helper thread joined with one. ``-s`` shows the
figures measured (failover time, records, retries seen).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kafka
import kafka.errors
import pytest

from aiopurgatory.kafka import BrokerThread, TopicPartition

from ..support.helpers import watchdog
from ..support.kafka_wire import (
    NODES,
    WATCHDOG,
    bounded,
    cluster_thread,
    high_watermarks,
    injected,
    name,
    running,
    started,
    wait_for,
)

HARD_TIMEOUT = 45.0
"""Seconds a test may run at all, its cluster's start and stop included."""
CLIENT = {
    "request_timeout_ms": 5000,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
    "metadata_max_age_ms": 5000,
}
"""kafka-python's timeouts and backoffs, shortened so that a failover takes well under
a test's budget (its defaults are 30 s requests and 30 s reconnect backoff)."""


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    """Fail the test (TimeoutError in its thread) once it has run HARD_TIMEOUT s."""
    with watchdog(HARD_TIMEOUT):
        yield


@pytest.fixture
def cluster(hard_timeout: None) -> Iterator[BrokerThread]:
    with running(cluster_thread(initial_rebalance_delay=0)) as thread:
        yield thread


def producer(cluster: BrokerThread, **options: Any) -> Any:
    return kafka.KafkaProducer(
        bootstrap_servers=cluster.bootstrap,
        acks="all",
        enable_idempotence=True,
        **{**CLIENT, "linger_ms": 2, "delivery_timeout_ms": 20000, **options},
    )


def consumer(cluster: BrokerThread, *topics: str, **options: Any) -> Any:
    return kafka.KafkaConsumer(
        *topics,
        bootstrap_servers=cluster.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        # A group leader whose metadata did not have the topic yet when it assigned
        # ("No partition metadata for topic") assigns nothing and rejoins only once its
        # metadata is refreshed: within 1 s, not CLIENT's 5 (on 3.13, loaded, the test's
        # 15 s ran out first).
        **{**CLIENT, "metadata_max_age_ms": 1000, **options},
    )


def read_all(
    cluster: BrokerThread, topic: str, **options: Any
) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record of ``topic`` up to its high watermarks, by
    partition, read by a consumer assigned every partition."""
    ends = high_watermarks(cluster, topic)
    reader = consumer(cluster, **options)
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        reader.assign([kafka.TopicPartition(topic, p) for p in ends])
        deadline = time.monotonic() + WATCHDOG
        while any(
            reader.position(kafka.TopicPartition(topic, p), timeout_ms=5000) < end
            for p, end in ends.items()
        ):
            assert time.monotonic() < deadline, f"read {got} of {ends}"
            for tp, records in reader.poll(timeout_ms=200).items():
                got[tp.partition].extend((r.offset, r.value) for r in records)
    finally:
        reader.close(autocommit=False, timeout_ms=5000)
    return got


# -- 1. an idempotent producer across a leader's stop and restart --------------------------


class RetryCount(logging.Handler):
    """Counts the batches kafka-python's sender says it retries (its WARNING)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if ", retrying (" in record.getMessage():
            self.count += 1


def test_idempotent_producer_loses_and_duplicates_nothing_across_a_leader_stop(
    cluster: BrokerThread,
) -> None:
    topic, partitions = name("fo"), 6
    cluster.create_topic(topic, partitions)
    victim = cluster.leader(topic, 0)
    moved = [p for p in range(partitions) if cluster.leader(topic, p) == victim]
    assert len(moved) == 2  # six partitions' leaders round three nodes

    lock = threading.Lock()
    acked: list[tuple[int, int, int, float]] = []  # (partition, offset, seq, when)
    failed: list[tuple[int, BaseException]] = []

    def on_ack(seq: int) -> Callable[[Any], None]:
        def record(metadata: Any) -> None:
            with lock:
                acked.append((metadata.partition, metadata.offset, seq, time.monotonic()))

        return record

    def on_error(seq: int) -> Callable[[BaseException], None]:
        def record(exc: BaseException) -> None:
            with lock:
                failed.append((seq, exc))

        return record

    sender = producer(cluster)
    seq = 0
    retries = RetryCount()
    sender_log = logging.getLogger("kafka.producer.sender")
    sender_log.addHandler(retries)

    def send_for(seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        nonlocal seq
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until():
            partition = seq % partitions
            future = sender.send(topic, str(seq).encode(), partition=partition)
            future.add_callback(on_ack(seq)).add_errback(on_error(seq))
            seq += 1
            time.sleep(0.002)

    stopped_at = 0.0
    first_after = -1  # the first sequence number sent once stop_node had returned

    def new_leader_acked() -> bool:
        # A record sent once stop_node has returned (the old leader's listener and
        # connections closed) can only be acknowledged by the new leader; an earlier one
        # might have been by the old (its answer read late).
        with lock:
            return any(p in moved and n >= first_after >= 0 for p, _, n, _ in acked)

    try:
        send_for(0.5)
        sender.flush(timeout=WATCHDOG)
        assert len(acked) == seq
        # The victim's answers held back: what it takes (appended, replicated: acks=all)
        # is in flight when it stops, and is sent again to the new leader, which must
        # not append it twice.
        cluster.delay(2000, api="Produce", node=victim)
        send_for(0.2)
        held = seq - len(acked)
        stopped_at = time.monotonic()
        cluster.stop_node(victim)
        gone_at = time.monotonic()
        first_after = seq
        cluster.clear_faults()
        send_for(WATCHDOG, until=new_leader_acked)
        assert new_leader_acked(), "no acknowledgement from a new leader"
        with lock:
            first = min(w for p, _, n, w in acked if p in moved and n >= first_after)
        failover = first - stopped_at
        assert all(cluster.leader_epoch(topic, p) == 1 for p in moved)
        new_leaders = {cluster.leader(topic, p) for p in moved}
        assert victim not in new_leaders
        assert -1 not in new_leaders
        send_for(0.3)
        cluster.start_node(victim)
        wait_for(
            lambda: all(victim in cluster.isr(topic, p) for p in moved),
            "the restarted node back in the ISR",
        )
        send_for(0.3)
        sender.flush(timeout=WATCHDOG)
    finally:
        sender.close(timeout=5)
        sender_log.removeHandler(retries)

    assert failed == []
    assert len(acked) == seq
    assert held > 0
    assert retries.count > 0  # what the victim held was sent again
    by_partition: dict[int, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for partition, offset, number, _ in sorted(acked):
        by_partition[partition].append((offset, str(number).encode()))
    got = read_all(cluster, topic)
    lost = sum(len(set(by_partition[p]) - set(got[p])) for p in range(partitions))
    duplicated = sum(len(got[p]) - len({v for _, v in got[p]}) for p in range(partitions))
    print(
        f"\nfailover: {failover * 1000:.0f} ms from stop_node({victim}) to the first ack"
        f" by a new leader (stop_node took {(gone_at - stopped_at) * 1000:.0f} ms)"
        f"; {held} records unanswered at the stop, {retries.count} batches retried;"
        f" acknowledged {len(acked)}, read back {sum(map(len, got.values()))},"
        f" lost {lost}, duplicated {duplicated}"
    )
    for p in range(partitions):
        assert got[p] == by_partition[p], f"partition {p}"
        values = [int(v) for _, v in got[p]]
        assert values == sorted(values), f"partition {p} out of order"
    assert lost == 0
    assert duplicated == 0


# -- 2. a consumer group across its coordinator's stop --------------------------------------


def key_coordinated_by(cluster: BrokerThread, prefix: str, node: int) -> str:
    """A group or transactional id (``prefix-...``) that ``node`` coordinates."""
    for _ in range(200):
        key = name(prefix)
        if cluster.coordinator(key) == node:
            return key
    raise AssertionError(f"no key of 200 is coordinated by node {node}")


def leading_nothing_of(cluster: BrokerThread, topic: str) -> int:
    """A node that leads no partition of ``topic`` (it has fewer than NODES)."""
    leaders = {cluster.leader(topic, p) for p in range(cluster.topics[topic])}
    return min(set(range(NODES)) - leaders)


def produce_values(cluster: BrokerThread, topic: str, values: range, partitions: int) -> None:
    """``values`` acknowledged (acks=all), value ``v`` in partition ``v % partitions``."""
    sender = producer(cluster)
    try:
        futures = [sender.send(topic, str(v).encode(), partition=v % partitions) for v in values]
        for future in futures:
            future.get(timeout=WATCHDOG)
    finally:
        sender.close(timeout=5)


def poll_values(reader: Any, count: int, linger: float = 0.3) -> list[int]:
    """Values polled until ``count`` are read (within WATCHDOG s), then ``linger`` s more
    (to see any extra)."""
    values: list[int] = []
    deadline = time.monotonic() + WATCHDOG
    while len(values) < count:
        assert time.monotonic() < deadline, f"read {values}, wanted {count}"
        for records in reader.poll(timeout_ms=200).values():
            values.extend(int(r.value) for r in records)
    end = time.monotonic() + linger
    while time.monotonic() < end:
        for records in reader.poll(timeout_ms=100).values():
            values.extend(int(r.value) for r in records)
    return values


def test_consumer_group_keeps_its_offsets_across_its_coordinators_stop(
    cluster: BrokerThread,
) -> None:
    topic, partitions = name("grp"), 2
    cluster.create_topic(topic, partitions)
    coordinator = leading_nothing_of(cluster, topic)  # the test is the coordinator's
    group = key_coordinated_by(cluster, "g", coordinator)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    produce_values(cluster, topic, range(20), partitions)

    first = consumer(cluster, topic, group_id=group, enable_auto_commit=False)
    try:
        assert sorted(poll_values(first, 20)) == list(range(20))
        first.commit(timeout_ms=5000)
        assert cluster.committed(group) == dict.fromkeys(tps, 10)

        cluster.stop_node(coordinator)
        assert cluster.coordinator(group) != coordinator
        produce_values(cluster, topic, range(20, 40), partitions)
        # The member goes on where it was: nothing before its position is read again.
        assert sorted(poll_values(first, 20)) == list(range(20, 40))
        first.commit(timeout_ms=5000)  # to the new coordinator
        assert cluster.committed(group) == dict.fromkeys(tps, 20)
    finally:
        first.close(autocommit=False, timeout_ms=5000)

    produce_values(cluster, topic, range(40, 44), partitions)
    second = consumer(cluster, topic, group_id=group, enable_auto_commit=False)
    try:
        # A new member starts at the committed offsets: only what came after the last
        # commit (kafka-python's at-least-once re-reads only what was not committed).
        assert sorted(poll_values(second, 4)) == list(range(40, 44))
    finally:
        second.close(autocommit=False, timeout_ms=5000)
    assert cluster.committed(group) == dict.fromkeys(tps, 20)


# -- 3. injected errors -------------------------------------------------------------------

RETRIED = [
    ("Produce", "NOT_LEADER_OR_FOLLOWER"),
    ("Produce", "REQUEST_TIMED_OUT"),
    ("Metadata", "LEADER_NOT_AVAILABLE"),
    ("FindCoordinator", "COORDINATOR_NOT_AVAILABLE"),
    ("JoinGroup", "COORDINATOR_LOAD_IN_PROGRESS"),
    ("OffsetCommit", "COORDINATOR_NOT_AVAILABLE"),
    ("OffsetFetch", "COORDINATOR_LOAD_IN_PROGRESS"),
    ("Fetch", "NOT_LEADER_OR_FOLLOWER"),
    ("ListOffsets", "LEADER_NOT_AVAILABLE"),
    ("InitProducerId", "COORDINATOR_LOAD_IN_PROGRESS"),
]


@pytest.mark.parametrize(("api", "error"), RETRIED, ids=[f"{a}-{e}" for a, e in RETRIED])
def test_retriable_errors_are_retried(cluster: BrokerThread, api: str, error: str) -> None:
    topic, group, count = name("inj"), name("g"), 3
    cluster.create_topic(topic, 1)
    cluster.inject(api, error, count)
    produce_values(cluster, topic, range(5), 1)
    reader = consumer(cluster, topic, group_id=group, enable_auto_commit=False)
    try:
        assert poll_values(reader, 5) == list(range(5))  # once each, in order
        reader.commit(timeout_ms=5000)
    finally:
        reader.close(autocommit=False, timeout_ms=5000)
    assert cluster.committed(group) == {TopicPartition(topic, 0): 5}
    answered = injected(cluster, api)
    print(f"\n{api} {error} x{count}: {len(answered)} answered so, then served")
    assert len(answered) == count, cluster.fault_lines
    assert all(line.endswith(f": {error.lower()}") for line in answered), answered
    assert cluster.offsets(topic)[0].log_end == 5


def test_a_non_retriable_produce_error_fails_the_send(cluster: BrokerThread) -> None:
    """TOPIC_AUTHORIZATION_FAILED is not retried: the send fails with kafka-python's
    TopicAuthorizationFailedError and nothing is written. kafka-python 3.0.12 then holds
    the idempotent producer in its fatal state (its transaction manager classifies any
    non-retriable error of a non-transactional idempotent producer FATAL), so a later
    send fails too, on any topic; a new producer is needed. Either is accepted for the
    later send, so that a client that keeps the producer passes as well."""
    topic = name("auth")
    cluster.create_topic(topic, 1)
    sender = producer(cluster)
    try:
        sender.send(topic, b"0").get(timeout=WATCHDOG)
        cluster.inject("Produce", "TOPIC_AUTHORIZATION_FAILED")
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            sender.send(topic, b"1").get(timeout=WATCHDOG)
        assert len(injected(cluster, "Produce")) == 1  # not retried
        try:
            sender.send(topic, b"2").get(timeout=WATCHDOG)
            later = [(1, b"2")]
        except kafka.errors.TopicAuthorizationFailedError:
            later = []  # the producer's fatal state
    finally:
        sender.close(timeout=5)
    print(f"\nthe send after TOPIC_AUTHORIZATION_FAILED: {'ok' if later else 'failed too'}")
    assert len(injected(cluster, "Produce")) == 1
    fresh = producer(cluster)
    try:
        fresh.send(topic, b"3").get(timeout=WATCHDOG)
    finally:
        fresh.close(timeout=5)
    assert read_all(cluster, topic)[0] == [(0, b"0"), *later, (len(later) + 1, b"3")]


# -- 4. a transaction across its coordinator's stop -----------------------------------------


def values_of(records: dict[int, list[tuple[int, bytes]]]) -> list[int]:
    return sorted(int(v) for rows in records.values() for _, v in rows)


def transactional(cluster: BrokerThread, topic: str, **options: Any) -> tuple[Any, str, int]:
    """A producer whose transactional id is coordinated by a node leading no partition
    of ``topic`` (the test is the coordinator's), initialized; and that id and node."""
    coordinator = leading_nothing_of(cluster, topic)
    tid = key_coordinated_by(cluster, "tx", coordinator)
    sender = producer(cluster, transactional_id=tid, transaction_timeout_ms=3000, **options)
    bounded(sender.init_transactions, "init_transactions")
    return sender, tid, coordinator


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_an_end_txn_in_flight_when_its_coordinator_stops_ends_the_transaction_whole(
    cluster: BrokerThread, end: str
) -> None:
    topic = name("txn")
    cluster.create_topic(topic, 2)
    sender, tid, coordinator = transactional(cluster, topic)
    try:
        bounded(sender.begin_transaction, "begin_transaction")
        for v in range(10):
            sender.send(topic, str(v).encode(), partition=v % 2).get(timeout=WATCHDOG)
        # The coordinator handles the EndTxn (the markers written) and then stops before
        # its answer leaves: the client learns of the end from the new coordinator only.
        cluster.delay(5000, api="EndTxn", node=coordinator)
        finish = sender.commit_transaction if end == "commit" else sender.abort_transaction
        ended = started(finish, f"{end}_transaction")
        done = "CompleteCommit" if end == "commit" else "CompleteAbort"
        wait_for(lambda: cluster.transaction(tid).state == done, f"the coordinator's {end}")
        cluster.stop_node(coordinator)
        assert cluster.coordinator(tid) != coordinator
        ended(WATCHDOG)  # retried on the new coordinator, which answers the retry NONE
        assert cluster.transaction(tid).state == done
        assert len(injected(cluster, "EndTxn")) == 0

        bounded(sender.begin_transaction, "begin_transaction")  # and it goes on
        sender.send(topic, b"10", partition=0).get(timeout=WATCHDOG)
        bounded(sender.commit_transaction, "commit_transaction")
    finally:
        sender.close(timeout=5)
    expected = list(range(11)) if end == "commit" else [10]
    assert values_of(read_all(cluster, topic, isolation_level="read_committed")) == expected
    everything = read_all(cluster, topic, isolation_level="read_uncommitted")
    assert values_of(everything) == list(range(11))


def test_a_transaction_open_when_its_coordinator_stops_is_committed_or_aborted_whole(
    cluster: BrokerThread,
) -> None:
    """The coordinator stops between two sends of a transaction: the second partition
    is added on the new coordinator. kafka-python 3.0.12 does not get there: its sender
    drops an AddPartitionsToTxn whose coordinator it cannot reach (``await_ready``
    raises, the request is neither sent nor retried: sender.py, _maybe_send_transactional
    _request), so the record waits and the transaction with it, until the coordinator
    aborts it at its timeout (3 s). Whichever way it ends, it ends whole. (The records
    held expire at the delivery timeout, 3 s: kafka-python's close raises while any
    record is held, and leaves the producer's thread running.)"""
    topic = name("txn")
    cluster.create_topic(topic, 2)
    sender, tid, coordinator = transactional(
        cluster, topic, request_timeout_ms=2000, delivery_timeout_ms=3000
    )
    try:
        bounded(sender.begin_transaction, "begin_transaction")
        for v in range(5):  # partition 0, added on the first coordinator
            sender.send(topic, str(v).encode(), partition=0).get(timeout=WATCHDOG)
        assert cluster.transaction(tid).state == "Ongoing"
        cluster.stop_node(coordinator)
        assert cluster.coordinator(tid) != coordinator
        futures = [sender.send(topic, str(v).encode(), partition=1) for v in range(5, 10)]
        try:
            for future in futures:
                future.get(timeout=5)
        except kafka.errors.KafkaTimeoutError:
            outcome = "aborted at the transaction timeout (the client stuck)"
        else:
            bounded(sender.commit_transaction, "commit_transaction")
            outcome = "committed by the client"
    finally:
        sender.close(timeout=5)
    if outcome.startswith("committed"):
        assert cluster.transaction(tid).state == "CompleteCommit"
        expected = list(range(10))
    else:
        wait_for(lambda: cluster.transaction(tid).state == "CompleteAbort", "the abort")
        expected = []
    print(f"\ntransaction open at the coordinator's stop: {outcome}")
    assert values_of(read_all(cluster, topic, isolation_level="read_committed")) == expected
