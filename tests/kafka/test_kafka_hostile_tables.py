"""What a peer can make the broker keep (issue 44): producer ids, transactional ids,
group ids and protocol types, the tables of transactional ids and groups, and a check
that every table and string a peer can grow is named in :class:`Limits` with its bound.

Raw frames where no client shows the defect, real clients where one does; every wait
bounded (socket timeouts, the clients' own timeouts, ``asyncio.timeout``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import io
import itertools
import struct
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka
import kafka
from kio.schema.add_offsets_to_txn.v1 import request as add_offsets
from kio.schema.add_offsets_to_txn.v1.response import AddOffsetsToTxnResponse
from kio.schema.add_partitions_to_txn.v1 import request as add_partitions
from kio.schema.add_partitions_to_txn.v1.response import AddPartitionsToTxnResponse
from kio.schema.create_topics.v2 import request as create_v2
from kio.schema.create_topics.v2.response import CreateTopicsResponse
from kio.schema.end_txn.v1 import request as end_txn
from kio.schema.end_txn.v1.response import EndTxnResponse
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.schema.join_group.v5 import request as join_v5_schema
from kio.schema.join_group.v5.response import JoinGroupResponse as JoinGroupResponseV5
from kio.schema.join_group.v7 import request as join_v7
from kio.schema.join_group.v7.response import JoinGroupResponse
from kio.schema.list_groups.v1.request import ListGroupsRequest
from kio.schema.list_groups.v1.response import ListGroupsResponse
from kio.schema.metadata.v8.response import MetadataResponse
from kio.schema.offset_commit.v3.response import OffsetCommitResponse
from kio.schema.sync_group.v3 import request as sync_v3
from kio.schema.sync_group.v3.response import SyncGroupResponse
from kio.schema.txn_offset_commit.v1 import request as txn_commit
from kio.schema.txn_offset_commit.v1.response import TxnOffsetCommitResponse
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i32Timedelta, i64

from aiopurgatory.kafka import BrokerThread, Limits, TopicPartition
from aiopurgatory.kafka.producers import FIRST_PRODUCER_ID

from ..support.kafka_broker import commit_v3_request, produced
from ..support.kafka_wire import (
    FlexibleWire,
    Wire,
    batch,
    closed_by_broker,
    create,
    encoded,
    fetch_from,
    metadata_of,
    metadata_request,
    name,
    produce_request,
    read_frame,
    send,
)
from ..support.kafka_wire import ms as wire_ms

WAIT = 10.0
"""Seconds any one wait of these tests takes at most."""
KAFKA_PYTHON: dict[str, Any] = {
    "request_timeout_ms": 5000,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
    "max_block_ms": 5000,
}
"""kafka-python's timeouts, shortened: a producer refused its id fails within the test."""


def pipelined(wire: Wire, requests: list[Any], response_type: type[Any]) -> list[Any]:
    """``requests`` sent at once on ``wire`` (one ``sendall``), then their answers read in
    order: thousands of requests in well under a second."""
    frames = io.BytesIO()
    first = wire.correlation_id + 1
    for offset, request in enumerate(requests):
        frames.write(encoded(request, first + offset, header_type=wire.request_header))
    wire.correlation_id += len(requests)
    wire.sock.settimeout(WAIT)
    wire.sock.sendall(frames.getvalue())
    answers = []
    for offset in range(len(requests)):
        frame = read_frame(wire.sock)
        correlation_id, used = wire.response_header(frame)
        assert correlation_id == first + offset
        answers.append(entity_reader(response_type)(frame, used)[0])
    return answers


# -- item 4: producer ids are a counter, not a table -----------------------------------

OLD_PRODUCER_CAP = 10_000
"""What ``max_producers`` was by default: the ids a broker handed out in its life."""


def test_producer_ids_never_run_out_and_ids_never_handed_out_are_still_refused() -> None:
    """More InitProducerId than the old lifetime cap (10,000, 340 kB of frames): every
    one gets a new id, and a real idempotent producer (kafka-python) then still gets
    one and writes; a batch carrying an id never handed out is still refused."""
    topic = name("t")
    with BrokerThread() as bootstrap, Wire(bootstrap) as wire:
        request = InitProducerIdRequest(transactional_id=None, transaction_timeout=wire_ms(60))
        answers = pipelined(wire, [request] * (OLD_PRODUCER_CAP + 1), InitProducerIdResponse)
        assert {answer.error_code for answer in answers} == {ErrorCode.none}
        ids = [int(answer.producer_id) for answer in answers]
        assert len(set(ids)) == len(ids)
        producer = kafka.KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **KAFKA_PYTHON
        )
        try:
            sent = producer.send(topic, b"v", partition=0).get(timeout=WAIT)
            assert sent.offset == 0
        finally:
            producer.close(timeout=WAIT)
        # Never handed out (beyond every id given so far): refused, nothing kept for it.
        stranger = max(ids) + 1000
        assert produced(wire, produce_request([(topic, [(0, batch(stranger, 0, [b"x"]))])])) == [
            (ErrorCode.unknown_producer_id, -1)
        ]
        assert min(ids) >= FIRST_PRODUCER_ID


# -- item 8: transactional ids and the group ids of transactions, bounded ----------------

ID_CHARS = 255
"""The default of both ``max_transactional_id_chars`` and ``max_group_id_chars``."""


class TxnWire:
    """The transaction APIs over a raw connection (v1 of each), for one producer."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    def init(self, transactional_id: str) -> tuple[ErrorCode, int]:
        answer = self.wire.call(
            InitProducerIdRequest(
                transactional_id=TransactionalId(transactional_id),
                transaction_timeout=wire_ms(60),
            ),
            InitProducerIdResponse,
        )
        return answer.error_code, int(answer.producer_id)

    def add_partition(
        self, transactional_id: str, pid: int, topic: str, partition: int = 0
    ) -> ErrorCode:
        answer = self.wire.call(
            add_partitions.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=TransactionalId(transactional_id),
                v3_and_below_producer_id=ProducerId(pid),
                v3_and_below_producer_epoch=i16(0),
                v3_and_below_topics=(
                    add_partitions.AddPartitionsToTxnTopic(
                        name=TopicName(topic), partitions=(i32(partition),)
                    ),
                ),
            ),
            AddPartitionsToTxnResponse,
        )
        (topic_result,) = answer.results_by_topic_v3_and_below
        (result,) = topic_result.results_by_partition
        code: ErrorCode = result.partition_error_code
        return code

    def add_offsets(self, transactional_id: str, pid: int, group: str) -> ErrorCode:
        answer = self.wire.call(
            add_offsets.AddOffsetsToTxnRequest(
                transactional_id=TransactionalId(transactional_id),
                producer_id=ProducerId(pid),
                producer_epoch=i16(0),
                group_id=GroupId(group),
            ),
            AddOffsetsToTxnResponse,
        )
        code: ErrorCode = answer.error_code
        return code

    def commit_offset(
        self,
        transactional_id: str,
        pid: int,
        group: str,
        topic: str,
        partitions: tuple[int, ...] = (0,),
    ) -> ErrorCode:
        answer = self.wire.call(
            txn_commit.TxnOffsetCommitRequest(
                transactional_id=TransactionalId(transactional_id),
                group_id=GroupId(group),
                producer_id=ProducerId(pid),
                producer_epoch=i16(0),
                topics=(
                    txn_commit.TxnOffsetCommitRequestTopic(
                        name=TopicName(topic),
                        partitions=tuple(
                            txn_commit.TxnOffsetCommitRequestPartition(
                                partition_index=i32(index),
                                committed_offset=i64(0),
                                committed_metadata="",
                            )
                            for index in partitions
                        ),
                    ),
                ),
            ),
            TxnOffsetCommitResponse,
        )
        (topic_result,) = answer.topics
        (code,) = {result.error_code for result in topic_result.partitions}
        return ErrorCode(code)

    def end(self, transactional_id: str, pid: int, commit: bool) -> ErrorCode:
        answer = self.wire.call(
            end_txn.EndTxnRequest(
                transactional_id=TransactionalId(transactional_id),
                producer_id=ProducerId(pid),
                producer_epoch=i16(0),
                committed=commit,
            ),
            EndTxnResponse,
        )
        code: ErrorCode = answer.error_code
        return code


def listed_groups(wire: Wire) -> set[str]:
    answer = wire.call(ListGroupsRequest(), ListGroupsResponse)
    return {str(group.group_id) for group in answer.groups}


def test_long_transactional_and_group_ids_are_refused_and_nothing_is_kept() -> None:
    """A transactional id one character beyond ``max_transactional_id_chars`` is refused
    INVALID_REQUEST by InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
    TxnOffsetCommit; a group id beyond ``max_group_id_chars`` INVALID_GROUP_ID by
    AddOffsetsToTxn and TxnOffsetCommit, so the transaction's commit makes no group
    (ListGroups does not list it). Ids of the bound itself are served."""
    topic = name("t")
    long_txn, long_group = "x" * (ID_CHARS + 1), "g" * (ID_CHARS + 1)
    tid, group = "x" * ID_CHARS, "g" * ID_CHARS
    thread = BrokerThread()
    with thread as bootstrap, Wire(bootstrap) as wire:
        thread.create_topic(topic)
        txn = TxnWire(wire)
        assert txn.init(long_txn)[0] is ErrorCode.invalid_request
        error, pid = txn.init(tid)
        assert error is ErrorCode.none
        assert txn.add_partition(long_txn, pid, topic) is ErrorCode.invalid_request
        assert txn.add_offsets(long_txn, pid, group) is ErrorCode.invalid_request
        assert txn.commit_offset(long_txn, pid, group, topic) is ErrorCode.invalid_request
        assert txn.end(long_txn, pid, True) is ErrorCode.invalid_request
        assert txn.add_partition(tid, pid, topic) is ErrorCode.none
        assert txn.add_offsets(tid, pid, long_group) is ErrorCode.invalid_group_id
        assert txn.commit_offset(tid, pid, long_group, topic) is ErrorCode.invalid_group_id
        assert txn.add_offsets(tid, pid, group) is ErrorCode.none
        assert txn.commit_offset(tid, pid, group, topic) is ErrorCode.none
        assert txn.end(tid, pid, True) is ErrorCode.none
        assert listed_groups(wire) == {group}
        kept = thread.call(lambda broker: list(broker.transactions.transactions))
        assert kept == [tid]
        assert thread.transaction(tid).groups == frozenset()  # ended


# -- item 9: JoinGroup's protocol type, bounded and counted ------------------------------


def join_v7_request(group: str, protocol_type: str = "consumer") -> Any:
    """A new member's JoinGroup v7 (flexible: compact strings) with ``protocol_type``."""
    return join_v7.JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        member_id="",
        group_instance_id=None,
        protocol_type=protocol_type,
        protocols=(join_v7.JoinGroupRequestProtocol(name="range", metadata=b"r"),),
    )


def test_a_long_protocol_type_is_refused_and_one_kept_is_counted() -> None:
    """JoinGroup v7 with a protocol type one character beyond ``max_group_id_chars`` is
    refused INVALID_REQUEST and leaves no group; one of the bound itself joins, and its
    length is counted in the bytes the groups hold (``max_group_bytes``)."""
    thread = BrokerThread(initial_rebalance_delay=0.0)
    with thread as bootstrap, FlexibleWire(bootstrap) as wire:
        wire.sock.settimeout(WAIT)
        refused = wire.call(join_v7_request("g", "p" * (ID_CHARS + 1)), JoinGroupResponse)
        assert refused.error_code is ErrorCode.invalid_request
        assert thread.list_groups() == []
        joined = wire.call(join_v7_request("g", "p" * ID_CHARS), JoinGroupResponse)
        assert joined.error_code is ErrorCode.none
        assert joined.protocol_type == "p" * ID_CHARS
        held = thread.call(lambda broker: broker.groups.held_bytes)
        client_id = "wire-test"  # kafka_wire's frames say so
        member = len(joined.member_id) + len(client_id) + len("range") + len(b"r")
        assert held == member + ID_CHARS


# -- item 10: idle transactional ids make room for new ones ------------------------------


def test_idle_transactional_ids_make_room_and_open_transactions_are_never_dropped() -> None:
    """A table of 3 transactional ids filled with idle ones: a real transactional
    producer (confluent-kafka) still starts and commits, in place of the least recently
    used idle id. Ids with a transaction open are never dropped: when every id has one,
    a new id is refused COORDINATOR_NOT_AVAILABLE, until one of them ends."""
    topic = name("t")
    thread = BrokerThread(max_transactional_ids=3)
    with thread as bootstrap, Wire(bootstrap) as wire:
        thread.create_topic(topic)
        txn = TxnWire(wire)
        pids = {}
        for i in range(3):
            error, pids[f"idle-{i}"] = txn.init(f"idle-{i}")
            assert error is ErrorCode.none
        assert txn.init("idle-0")[0] is ErrorCode.none  # used again: idle-1 is the oldest
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": "real"}
        )
        producer.init_transactions(WAIT)
        producer.begin_transaction()
        producer.produce(topic, b"v")
        producer.commit_transaction(WAIT)
        assert thread.transaction("real").state == "CompleteCommit"

        def kept() -> list[str]:
            return thread.call(lambda broker: sorted(broker.transactions.transactions))

        assert kept() == ["idle-0", "idle-2", "real"]
        # Forgotten as if it had expired: its producer is told so, as by Kafka.
        assert txn.end("idle-1", pids["idle-1"], True) is ErrorCode.invalid_producer_id_mapping
        # Open transactions take the idle ids' places, then hold theirs.
        opened = {}
        for i in range(3):
            error, pid = txn.init(f"open-{i}")
            assert error is ErrorCode.none
            assert txn.add_partition(f"open-{i}", pid, topic) is ErrorCode.none
            opened[f"open-{i}"] = pid
        assert kept() == ["open-0", "open-1", "open-2"]
        assert txn.init("one-more")[0] is ErrorCode.coordinator_not_available
        assert kept() == ["open-0", "open-1", "open-2"]
        assert {thread.transaction(tid).state for tid in opened} == {"Ongoing"}
        # One ends: its id is idle, and the new one takes its place.
        assert txn.end("open-1", opened["open-1"], False) is ErrorCode.none
        assert txn.init("one-more")[0] is ErrorCode.none
        assert kept() == ["one-more", "open-0", "open-2"]


# -- item 11: groups without members make room for consumer groups -----------------------


def commit_error(wire: Wire, group: str, topic: str) -> ErrorCode:
    """A standalone OffsetCommit (generation -1, no member) of ``topic``'s partition 0."""
    answer = wire.call(commit_v3_request(group, {(topic, 0): (1, "")}), OffsetCommitResponse)
    code: ErrorCode = answer.topics[0].partitions[0].error_code
    return code


def test_standalone_commits_cannot_lock_consumer_groups_out() -> None:
    """A table of 3 groups filled by standalone commits: one more standalone commit is
    still refused (COORDINATOR_NOT_AVAILABLE: commits never drop anyone's offsets), but
    a real consumer group (kafka-python) joins and consumes, in place of the least
    recently used group without members."""
    topic, group = name("t"), name("g")
    thread = BrokerThread(max_groups=3)
    with thread as bootstrap, Wire(bootstrap) as wire:
        thread.create_topic(topic)
        for i in range(3):
            assert commit_error(wire, f"standalone-{i}", topic) is ErrorCode.none
        assert commit_error(wire, "standalone-0", topic) is ErrorCode.none  # used again
        assert commit_error(wire, "one-more", topic) is ErrorCode.coordinator_not_available
        assert sorted(thread.list_groups()) == [f"standalone-{i}" for i in range(3)]
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, **KAFKA_PYTHON)
        try:
            producer.send(topic, b"v", partition=0).get(timeout=WAIT)
        finally:
            producer.close(timeout=WAIT)
        consumer = kafka.KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=5000,
            retry_backoff_ms=50,
        )
        try:
            values: list[bytes] = []
            deadline = time.monotonic() + WAIT
            while not values:
                assert time.monotonic() < deadline, "the consumer group never consumed"
                for records in consumer.poll(timeout_ms=200).values():
                    values.extend(record.value for record in records)
            assert values == [b"v"]
            consumer.commit()
        finally:
            consumer.close()
        assert thread.committed(group) == {(topic, 0): 1}
        # standalone-1 was the least recently used: its place and offsets went.
        assert sorted(thread.list_groups()) == sorted([group, "standalone-0", "standalone-2"])


# -- item E: every table and string a peer can make the broker keep, bounded -------------

KEPT: dict[str, tuple[str, ...] | str] = {
    # The group coordinator.
    "GroupCoordinator.groups": ("max_groups", "max_group_id_chars"),
    "GroupCoordinator.idle": "a subset of GroupCoordinator.groups",
    "Group.group_id": ("max_group_id_chars",),
    "Group.leader": "one of its members' ids (Member.member_id)",
    "Group.protocol_name": "one of its members' protocol names (Member.protocols)",
    "Group.protocol_type": ("max_group_id_chars",),
    "Group.members": ("max_members", "max_group_bytes"),
    "Group.static": ("max_members", "max_group_id_chars"),
    "Group.offsets": ("max_committed_offsets", "offset_metadata_max_bytes"),
    "Group.kind": "'classic' or 'consumer' (KIP-848)",
    # The consumer-type groups' coordinator (KIP-848): its groups are entries of the
    # classic table; what its members hold is bounded in test_kafka_consumer_protocol.
    "ConsumerGroupCoordinator.table": "a subset of GroupCoordinator.groups (with members)",
    "ConsumerGroupCoordinator.partitions": "BrokerCore.topics itself",
    "ConsumerGroupCoordinator.topic_ids": "BrokerCore.topic_ids itself",
    "Member.member_id": ("max_group_bytes",),
    "Member.client_id": ("max_group_bytes",),
    "Member.group_instance_id": ("max_group_id_chars",),
    "Member.protocol_type": ("max_group_id_chars", "max_group_bytes"),
    "Member.protocols": ("max_member_metadata_bytes", "max_group_bytes"),
    "Member.assignment": ("max_member_metadata_bytes", "max_group_bytes"),
    # The transaction coordinator.
    "TransactionCoordinator.transactions": ("max_transactional_ids", "max_transactional_id_chars"),
    "TransactionCoordinator.idle": "a subset of TransactionCoordinator.transactions",
    "TransactionCoordinator.by_producer": "one per transactional id (transactions)",
    "TransactionCoordinator.open_firsts": "one per partition of an open transaction that "
    "wrote there (Transaction.first_offsets)",
    "TransactionCoordinator.aborted": "one per abort marker still in the log (pruned with "
    "it: Partition.entries)",
    "Transaction.transactional_id": ("max_transactional_id_chars",),
    "Transaction.partitions": ("max_transaction_partitions",),
    "Transaction.groups": ("max_transaction_partitions", "max_group_id_chars"),
    "Transaction.first_offsets": "a subset of Transaction.partitions",
    "Transaction.pending": ("max_transaction_offsets", "max_group_id_chars"),
    # Producers.
    "ProducerTable.states": ("max_producer_states",),
    "ProducerState.recent": "PRODUCER_SEQUENCES_KEPT (5) per state",
    # Topics and their logs.
    "BrokerCore.topics": ("max_topics",),
    "BrokerCore.partitions": ("max_topics", "max_partitions"),
    "BrokerCore.topic_retain_ms": "one per topic (BrokerCore.topics)",
    "BrokerCore.topic_ids": "one per topic (BrokerCore.topics)",
    "BrokerCore.topic_names": "one per topic (BrokerCore.topics)",
    "BrokerCore.max_message_bytes": "one per topic (BrokerCore.topics)",
    "BrokerCore.min_insync": "one per topic (BrokerCore.topics)",
    "AdminApi.overrides": "one per topic, of the known configs, values normalised",
    "Topology.placements": "one per topic (BrokerCore.topics)",
    "Partition.entries": ("retain_bytes", "retain_total_bytes"),
    "Partition._bases": "one per entry (Partition.entries)",
    "Partition._positions": "one per entry (Partition.entries)",
    "BrokerCore._arrivals": "one per entry retained (Partition.entries)",
    "StoredBatch.data": ("max_request_bytes",),
    "Partition.segments": "one per segment, at most one per entry (Partition.entries)",
    "Cleaner.topics": "one per topic with overrides (BrokerCore.topics)",
    "TopicSettings.values": "the known configs of one topic, values normalised",
    "Cleaner.checkpoints": "one per partition of a compacted topic (BrokerCore.partitions)",
    "Cleaner._horizons": "one per partition of a compacted topic (BrokerCore.partitions)",
    "Cleaner._waiters": "one per advance() waiting: the test's",
    "Partition.epoch_history": "one per leader change: the test's doing (a node stopped)",
    "Partition.follower_leos": "one per follower replica (--replicas)",
    "Topics.followers": "one per follower replica: topics (BrokerCore.topics) by --replicas",
    "Nodes.followers": "one per follower replica: topics (BrokerCore.topics) by --replicas",
    # Connections and caches.
    "KafkaBroker.connections": ("max_connections",),
    "Nodes.connections": "one per node, the node's connections (KafkaBroker.connections)",
    "Nodes._accepted": "the connections accepted and not yet done: KafkaBroker.connections "
    "and those whose task has not started yet (closed at once past max_connections)",
    "ByteBudget._requests": "one waiter per connection at most (KafkaBroker.connections)",
    "ByteBudget._answers": "one waiter per connection at most (KafkaBroker.connections)",
    "LruCache._items": ("fetch_cache_entries",),
    "Encoded.body": ("fetch_cache_entries",),  # an empty fetch answer kept, up to 2 KiB
    "KafkaBroker.negotiated": "1000 keys at most, client ids cut at 64 characters",
    # The operator's and the test's, not a peer's.
    "KafkaBroker.handlers": "fixed at start",
    "Topics._listeners": "fixed at start (one per table keyed by topic)",
    "KafkaBroker.host": "the operator's",
    "KafkaBroker.advertised_host": "the operator's",
    "Nodes.host": "the operator's",
    "Nodes.advertised_host": "the operator's",
    "Nodes.ports": "one per node (--nodes, max_nodes)",
    "Nodes.servers": "one per node (--nodes, max_nodes)",
    "Nodes._reachable": "one per node (--nodes, max_nodes)",
    "Topology.states": "one per node (--nodes, max_nodes)",
    "Faults._errors": "the test's faults (max_fault_rules)",
    "Faults._delays": "the test's faults (max_fault_rules)",
    "FaultLog.lines": "the last lines only (a deque with a maxlen)",
}
"""Every table (a dict, set, list or deque) and string held by the broker's objects, by
``Class.attribute``: the :class:`Limits` fields bounding it (each one filled just past
its bound below), or why no field is needed (derived from a bounded table, or not the
peer's to grow). :func:`kept_by` finds them in a live broker: a table or string added to
the broker without a line here fails :func:`test_every_table_a_peer_grows_is_bounded`."""

CONTAINERS: tuple[type[Any], ...] = (dict, set, frozenset, list, collections.deque)


def kept_by(broker: Any) -> set[str]:
    """``Class.attribute`` of every table and string reachable from ``broker`` through
    the objects of :mod:`aiopurgatory.kafka` (their attributes, and the first items of
    their tables), enums aside."""

    def ours(value: object) -> bool:
        return type(value).__module__.startswith("aiopurgatory.kafka") and not isinstance(
            value, enum.Enum
        )

    found: set[str] = set()
    seen: set[int] = set()
    todo: list[object] = [broker]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        names = set(getattr(obj, "__dict__", ()))
        for klass in type(obj).__mro__:
            slots = getattr(klass, "__slots__", ())
            names.update([slots] if isinstance(slots, str) else slots)
        for attribute in names:
            value = getattr(obj, attribute, None)
            if isinstance(value, (str, bytes, bytearray, *CONTAINERS)):
                found.add(f"{type(obj).__name__}.{attribute}")
            items: list[object] = [value]
            if isinstance(value, dict):
                items += [*itertools.islice(value, 20), *itertools.islice(value.values(), 20)]
            elif isinstance(value, CONTAINERS):
                items += list(itertools.islice(value, 20))
            for item in items:
                parts = item if isinstance(item, tuple) else (item,)
                todo.extend(part for part in parts if ours(part))
    return found


Fill = Callable[[BrokerThread, Wire, str], None]
"""Fills a table (or sends a string) just past its bound, on a broker started with the
fill's limits (``bootstrap`` its address), and checks the refusal or the eviction."""


def join_v5(
    group: str,
    *,
    instance: str | None = None,
    protocol_type: str = "consumer",
    metadata: bytes = b"r",
) -> Any:
    """A new member's JoinGroup v5, answered at once in a new group (no rebalance delay)."""
    return join_v5_schema.JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        member_id="",
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocols=(join_v5_schema.JoinGroupRequestProtocol(name="range", metadata=metadata),),
    )


def fill_groups(thread: BrokerThread, wire: Wire, topic: str) -> None:
    assert [commit_error(wire, f"g{i}", topic) for i in range(3)] == [
        ErrorCode.none,
        ErrorCode.none,
        ErrorCode.coordinator_not_available,
    ]
    assert sorted(thread.list_groups()) == ["g0", "g1"]


def fill_group_id_chars(thread: BrokerThread, wire: Wire, topic: str) -> None:
    limit = 8
    codes = [
        wire.call(join_v5("g" * (limit + 1)), JoinGroupResponseV5).error_code,
        commit_error(wire, "g" * (limit + 1), topic),
        wire.call(join_v5("g", instance="i" * (limit + 1)), JoinGroupResponseV5).error_code,
        wire.call(join_v5("g", protocol_type="p" * (limit + 1)), JoinGroupResponseV5).error_code,
    ]
    assert (
        codes
        == [ErrorCode.invalid_group_id, ErrorCode.invalid_group_id]
        + [ErrorCode.invalid_request] * 2
    )
    assert thread.list_groups() == []
    txn = TxnWire(wire)
    error, pid = txn.init("tx")
    assert error is ErrorCode.none
    assert txn.add_offsets("tx", pid, "g" * (limit + 1)) is ErrorCode.invalid_group_id
    at_limit = join_v5("g" * limit, instance="i" * limit, protocol_type="p" * limit)
    assert wire.call(at_limit, JoinGroupResponseV5).error_code is ErrorCode.none


def fill_members(thread: BrokerThread, wire: Wire, topic: str) -> None:
    assert wire.call(join_v5("g"), JoinGroupResponseV5).error_code is ErrorCode.none
    second = wire.call(join_v5("g"), JoinGroupResponseV5)
    assert second.error_code is ErrorCode.group_max_size_reached
    assert thread.call(lambda broker: len(broker.groups.groups["g"].members)) == 1


def fill_member_metadata(thread: BrokerThread, wire: Wire, topic: str) -> None:
    limit = 16  # "range" and its metadata
    big = join_v5("g", metadata=b"m" * (limit - len("range") + 1))
    assert wire.call(big, JoinGroupResponseV5).error_code is ErrorCode.invalid_request
    joined = wire.call(join_v5("g", metadata=b"m" * (limit - 5)), JoinGroupResponseV5)
    assert joined.error_code is ErrorCode.none
    sync = sync_v3.SyncGroupRequest(
        group_id=GroupId("g"),
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments=(
            sync_v3.SyncGroupRequestAssignment(
                member_id=joined.member_id, assignment=b"a" * (limit + 1)
            ),
        ),
    )
    assert wire.call(sync, SyncGroupResponse).error_code is ErrorCode.invalid_request


def fill_group_bytes(thread: BrokerThread, wire: Wire, topic: str) -> None:
    # Each member holds its id, client id, protocol type, "range" and 30 bytes: the
    # second does not fit in 80.
    metadata = b"m" * 30
    assert wire.call(join_v5("g1", metadata=metadata), JoinGroupResponseV5).error_code is (
        ErrorCode.none
    )
    refused = wire.call(join_v5("g2", metadata=metadata), JoinGroupResponseV5)
    assert refused.error_code is ErrorCode.coordinator_not_available
    assert thread.list_groups() == ["g1"]


def fill_committed_offsets(thread: BrokerThread, wire: Wire, topic: str) -> None:
    both = {(topic, i): (1, "") for i in range(2)}
    answer = wire.call(commit_v3_request("g", both), OffsetCommitResponse)
    codes = {part.error_code for part in answer.topics[0].partitions}
    assert codes == {ErrorCode.coordinator_not_available}
    assert thread.list_groups() == []


def fill_offset_metadata(thread: BrokerThread, wire: Wire, topic: str) -> None:
    for metadata, code in (("m" * 5, ErrorCode.offset_metadata_too_large), ("m" * 4, None)):
        answer = wire.call(
            commit_v3_request("g", {(topic, 0): (1, metadata)}), OffsetCommitResponse
        )
        assert answer.topics[0].partitions[0].error_code is (code or ErrorCode.none)


def fill_transactional_ids(thread: BrokerThread, wire: Wire, topic: str) -> None:
    txn = TxnWire(wire)
    error, pid = txn.init("open")
    assert error is ErrorCode.none
    assert txn.add_partition("open", pid, topic) is ErrorCode.none
    assert txn.init("one-more")[0] is ErrorCode.coordinator_not_available


def fill_transactional_id_chars(thread: BrokerThread, wire: Wire, topic: str) -> None:
    txn = TxnWire(wire)
    assert txn.init("x" * 9)[0] is ErrorCode.invalid_request
    assert txn.init("x" * 8)[0] is ErrorCode.none


def fill_transaction_partitions(thread: BrokerThread, wire: Wire, topic: str) -> None:
    txn = TxnWire(wire)
    error, pid = txn.init("tx")
    assert error is ErrorCode.none
    assert txn.add_partition("tx", pid, topic, 0) is ErrorCode.none
    assert txn.add_partition("tx", pid, topic, 1) is ErrorCode.invalid_request
    assert txn.add_offsets("tx", pid, "g") is ErrorCode.invalid_request
    assert thread.transaction("tx").partitions == frozenset({TopicPartition(topic, 0)})


def fill_transaction_offsets(thread: BrokerThread, wire: Wire, topic: str) -> None:
    txn = TxnWire(wire)
    error, pid = txn.init("tx")
    assert error is ErrorCode.none
    assert txn.add_partition("tx", pid, topic) is ErrorCode.none
    assert txn.add_offsets("tx", pid, "g") is ErrorCode.none
    assert txn.commit_offset("tx", pid, "g", topic, (0, 1)) is ErrorCode.invalid_request
    assert txn.commit_offset("tx", pid, "g", topic, (0,)) is ErrorCode.none  # left open


def fill_producer_states(thread: BrokerThread, wire: Wire, topic: str) -> None:
    request = InitProducerIdRequest(transactional_id=None, transaction_timeout=wire_ms(60))
    pids = [int(a.producer_id) for a in pipelined(wire, [request] * 3, InitProducerIdResponse)]
    for pid in pids:
        assert send(wire, topic, [b"v"], pid=pid, sequence=0).error_code is ErrorCode.none
    assert thread.call(lambda broker: len(broker.producers)) == 2
    # The least recently written was forgotten: its next batch, Kafka's expired answer.
    assert send(wire, topic, [b"v"], pid=pids[0], sequence=1).error_code is (
        ErrorCode.unknown_producer_id
    )


def fill_topics(thread: BrokerThread, wire: Wire, topic: str) -> None:
    # The fill's own topic is the first; one more fits, not two.
    answer = wire.call(metadata_request(["u1", "u2"], auto_create=True), MetadataResponse)
    codes = [t.error_code for t in answer.topics]
    assert codes == [ErrorCode.none, ErrorCode.unknown_topic_or_partition]
    assert sorted(thread.topics) == sorted([topic, "u1"])


def fill_partitions(thread: BrokerThread, wire: Wire, topic: str) -> None:
    request = create_v2.CreateTopicsRequest(
        topics=(
            create_v2.CreatableTopic(
                name=TopicName("wide"),
                num_partitions=i32(3),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=wire_ms(5),
    )
    answer = wire.call(request, CreateTopicsResponse)
    assert answer.topics[0].error_code is ErrorCode.invalid_partitions
    assert "wide" not in thread.topics


def fill_retention(thread: BrokerThread, wire: Wire, topic: str) -> None:
    for _ in range(8):
        assert send(wire, topic, [b"v" * 100]).error_code is ErrorCode.none
    assert thread.offsets(topic)[0].log_start > 0  # the oldest batches went
    retained = thread.call(lambda broker: broker.core.retained_bytes)
    assert retained <= 600


def fill_request_bytes(thread: BrokerThread, wire: Wire, topic: str) -> None:
    with Wire(thread.bootstrap) as big:
        big.sock.sendall(struct.pack(">i", 4097) + b"\0" * 64)
        assert closed_by_broker(big.sock)


def fill_connections(thread: BrokerThread, wire: Wire, topic: str) -> None:
    with Wire(thread.bootstrap) as second, Wire(thread.bootstrap) as third:
        assert metadata_of(second, [topic]).topics[0].error_code is ErrorCode.none
        assert closed_by_broker(third.sock)


def fill_fetch_cache(thread: BrokerThread, wire: Wire, topic: str) -> None:
    for max_bytes in (1000, 2000, 3000):
        assert fetch_from(wire, topic, 0, partition_max=max_bytes).error_code is ErrorCode.none
    decoded, answers = thread.call(
        lambda broker: (len(broker._decoded_fetches), len(broker.data_api._empty_answers))
    )
    assert decoded == 2  # three frames
    assert 1 <= answers <= 2


FILLS: dict[tuple[str, ...], tuple[dict[str, Any], Fill]] = {
    ("max_groups",): ({"max_groups": 2}, fill_groups),
    ("max_group_id_chars",): ({"max_group_id_chars": 8}, fill_group_id_chars),
    ("max_members",): ({"max_members": 1}, fill_members),
    ("max_member_metadata_bytes",): ({"max_member_metadata_bytes": 16}, fill_member_metadata),
    ("max_group_bytes",): (
        {"max_group_bytes": 80, "max_member_metadata_bytes": 40},
        fill_group_bytes,
    ),
    ("max_committed_offsets",): ({"max_committed_offsets": 1}, fill_committed_offsets),
    ("offset_metadata_max_bytes",): ({"offset_metadata_max_bytes": 4}, fill_offset_metadata),
    ("max_transactional_ids",): ({"max_transactional_ids": 1}, fill_transactional_ids),
    ("max_transactional_id_chars",): (
        {"max_transactional_id_chars": 8},
        fill_transactional_id_chars,
    ),
    ("max_transaction_partitions",): (
        {"max_transaction_partitions": 1},
        fill_transaction_partitions,
    ),
    ("max_transaction_offsets",): ({"max_transaction_offsets": 1}, fill_transaction_offsets),
    ("max_producer_states",): ({"max_producer_states": 2}, fill_producer_states),
    ("max_topics",): ({"max_topics": 2}, fill_topics),
    ("max_partitions",): ({"max_partitions": 2}, fill_partitions),
    ("retain_bytes", "retain_total_bytes"): (
        {"retain_bytes": 500, "retain_total_bytes": 600},
        fill_retention,
    ),
    ("max_request_bytes",): (
        {"max_request_bytes": 4096, "max_inflight_bytes": 4096},
        fill_request_bytes,
    ),
    ("max_connections",): ({"max_connections": 2}, fill_connections),
    ("fetch_cache_entries",): ({"fetch_cache_entries": 2}, fill_fetch_cache),
}
"""Per the :class:`Limits` fields it checks: the limits its broker starts with (small,
so the fill is quick) and the fill."""


def test_every_table_a_peer_grows_is_bounded() -> None:
    """Every table and string the broker holds is in :data:`KEPT`, bounded by the
    :class:`Limits` fields named there or derived from one that is; each field named is
    filled just past its bound with raw frames (:data:`FILLS`), which must refuse or
    evict. The brokers' tables after the fills are exactly those of :data:`KEPT`: a new
    one fails here until it is named with its bound, and a stale line fails too."""
    fields = {field.name for field in dataclasses.fields(Limits)}
    named = {field for bound in KEPT.values() if isinstance(bound, tuple) for field in bound}
    filled = {field for covered in FILLS for field in covered}
    assert named <= fields, named - fields
    assert named == filled, (named - filled, filled - named)
    found: set[str] = set()
    for limits, fill in FILLS.values():
        thread = BrokerThread(partitions=2, initial_rebalance_delay=0.0, **limits)
        with thread as bootstrap, Wire(bootstrap) as wire:
            wire.sock.settimeout(WAIT)
            topic = name("t")
            create(wire, topic)
            fill(thread, wire, topic)
            found |= thread.call(kept_by)
    assert found == set(KEPT), (found - set(KEPT), set(KEPT) - found)
