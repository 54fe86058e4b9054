"""What a peer can make the broker keep (issue 44): producer ids, transactional ids,
group ids and protocol types, the tables of transactional ids and groups, and a check
that every table and string a peer can grow is named in :class:`Limits` with its bound.

Raw frames where no client shows the defect, real clients where one does; every wait
bounded (socket timeouts, the clients' own timeouts, ``asyncio.timeout``).
"""

from __future__ import annotations

import datetime
import io
import time
from typing import Any

import confluent_kafka
import kafka
from kio.schema.add_offsets_to_txn.v1 import request as add_offsets
from kio.schema.add_offsets_to_txn.v1.response import AddOffsetsToTxnResponse
from kio.schema.add_partitions_to_txn.v1 import request as add_partitions
from kio.schema.add_partitions_to_txn.v1.response import AddPartitionsToTxnResponse
from kio.schema.end_txn.v1 import request as end_txn
from kio.schema.end_txn.v1.response import EndTxnResponse
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.schema.join_group.v7 import request as join_v7
from kio.schema.join_group.v7.response import JoinGroupResponse
from kio.schema.list_groups.v1.request import ListGroupsRequest
from kio.schema.list_groups.v1.response import ListGroupsResponse
from kio.schema.offset_commit.v3.response import OffsetCommitResponse
from kio.schema.txn_offset_commit.v1 import request as txn_commit
from kio.schema.txn_offset_commit.v1.response import TxnOffsetCommitResponse
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i32Timedelta, i64

from aiopurgatory.kafka import BrokerThread
from aiopurgatory.kafka.producers import FIRST_PRODUCER_ID

from .kafka_wire import FlexibleWire, Wire, batch, encoded, name, produce_request, read_frame
from .kafka_wire import ms as wire_ms
from .test_kafka_broker_data import produced
from .test_kafka_broker_groups import commit_v3_request

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

    def add_partition(self, transactional_id: str, pid: int, topic: str) -> ErrorCode:
        answer = self.wire.call(
            add_partitions.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=TransactionalId(transactional_id),
                v3_and_below_producer_id=ProducerId(pid),
                v3_and_below_producer_epoch=i16(0),
                v3_and_below_topics=(
                    add_partitions.AddPartitionsToTxnTopic(
                        name=TopicName(topic), partitions=(i32(0),)
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

    def commit_offset(self, transactional_id: str, pid: int, group: str, topic: str) -> ErrorCode:
        answer = self.wire.call(
            txn_commit.TxnOffsetCommitRequest(
                transactional_id=TransactionalId(transactional_id),
                group_id=GroupId(group),
                producer_id=ProducerId(pid),
                producer_epoch=i16(0),
                topics=(
                    txn_commit.TxnOffsetCommitRequestTopic(
                        name=TopicName(topic),
                        partitions=(
                            txn_commit.TxnOffsetCommitRequestPartition(
                                partition_index=i32(0),
                                committed_offset=i64(0),
                                committed_metadata="",
                            ),
                        ),
                    ),
                ),
            ),
            TxnOffsetCommitResponse,
        )
        (topic_result,) = answer.topics
        (result,) = topic_result.partitions
        code: ErrorCode = result.error_code
        return code

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
        for i in range(3):
            assert txn.init(f"idle-{i}")[0] is ErrorCode.none
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
