"""Injected faults on the Kafka-protocol broker (aiopurgatory.kafka.faults): the rules
(errors, delays) as pure data, the error answers (aiopurgatory.kafka.answers) of every
injectable API at every version served, encoded and decoded back with kio, and the
fault log."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v5 import request as list_v5
from kio.schema.metadata.v8 import request as metadata_v8
from kio.schema.offset_for_leader_epoch.v4 import request as epoch_v4
from kio.schema.produce.v8 import request as produce_v8
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

import aiopurgatory as ap
from aiopurgatory.kafka import Limits, cli, protocol
from aiopurgatory.kafka.answers import error_answer
from aiopurgatory.kafka.connection import ClosingConnection
from aiopurgatory.kafka.faults import (
    FAULTS_PURGATORY,
    INJECTABLE,
    OFFSET_FOR_LEADER_EPOCH,
    FaultLog,
    Faults,
    api_key_of,
    error_code_of,
)
from aiopurgatory.kafka.group_api import GroupApi
from aiopurgatory.kafka.txn_api import TxnApi

from ..support.kafka_wire import fetch_request

NOT_LEADER = ErrorCode.not_leader_or_follower

# -- naming APIs and errors -----------------------------------------------------------------


def test_an_api_is_named_by_its_key_or_its_name_in_any_spelling() -> None:
    for spelling in ("Produce", "produce", "PRODUCE", 0):
        assert api_key_of(spelling) == protocol.PRODUCE
    for spelling in ("FindCoordinator", "find_coordinator", "FIND_COORDINATOR", "findcoordinator"):
        assert api_key_of(spelling) == protocol.FIND_COORDINATOR
    assert api_key_of("AddPartitionsToTxn") == protocol.ADD_PARTITIONS_TO_TXN
    with pytest.raises(ValueError, match="no Kafka API is called 'Produse'"):
        api_key_of("Produse")
    with pytest.raises(ValueError, match=r"ElectLeaders \(API 43\) is not served"):
        api_key_of("ElectLeaders")
    with pytest.raises(ValueError, match=r"API 999 \(API 999\) is not served"):
        api_key_of(999)
    for bad in (True, 1.0, None):
        with pytest.raises(ValueError, match="an API is its key or its name"):
            api_key_of(bad)  # type: ignore[arg-type]


def test_an_error_is_a_code_its_number_or_its_name_never_none() -> None:
    for spelling in (NOT_LEADER, 6, "NOT_LEADER_OR_FOLLOWER", "not_leader_or_follower"):
        assert error_code_of(spelling) is NOT_LEADER
    assert error_code_of(-1) is ErrorCode.unknown_server_error
    for bad in ("not_a_leader", 9999, -2):
        with pytest.raises(ValueError, match="no Kafka error code is"):
            error_code_of(bad)
    for none in (ErrorCode.none, 0, "NONE"):
        with pytest.raises(ValueError, match="NONE is no error to inject"):
            error_code_of(none)
    for bad_type in (True, 6.0, None):
        with pytest.raises(ValueError, match="an error is an ErrorCode"):
            error_code_of(bad_type)  # type: ignore[arg-type]


# -- the rules ------------------------------------------------------------------------------


def test_an_injected_error_answers_count_requests_then_is_gone() -> None:
    faults = Faults()
    assert faults.take(protocol.PRODUCE, 0) is None
    faults.inject("Produce", "NOT_LEADER_OR_FOLLOWER", count=2)
    assert len(faults) == 1
    assert faults.pending() == [(protocol.PRODUCE, None, NOT_LEADER, 2)]
    assert faults.take(protocol.FETCH, 0) is None  # another API: untouched
    assert faults.take(protocol.PRODUCE, 0) is NOT_LEADER
    assert faults.take(protocol.PRODUCE, 3) is NOT_LEADER  # any node
    assert faults.take(protocol.PRODUCE, 0) is None
    assert len(faults) == 0
    assert faults.pending() == []


def test_rules_of_one_api_are_taken_in_order_and_per_node() -> None:
    faults = Faults()
    faults.inject("FindCoordinator", "COORDINATOR_LOAD_IN_PROGRESS", node=1)
    faults.inject(protocol.FIND_COORDINATOR, ErrorCode.coordinator_not_available)
    # The same rule again is one rule asking more requests.
    faults.inject(protocol.FIND_COORDINATOR, 15, count=2)
    assert len(faults) == 2
    assert faults.take(protocol.FIND_COORDINATOR, 0) is ErrorCode.coordinator_not_available
    assert faults.take(protocol.FIND_COORDINATOR, 1) is ErrorCode.coordinator_load_in_progress
    assert faults.take(protocol.FIND_COORDINATOR, 1) is ErrorCode.coordinator_not_available
    assert faults.take(protocol.FIND_COORDINATOR, 2) is ErrorCode.coordinator_not_available
    assert faults.take(protocol.FIND_COORDINATOR, 2) is None
    faults.inject("Heartbeat", "REBALANCE_IN_PROGRESS", node=2)
    assert faults.take(protocol.HEARTBEAT, 0) is None  # not that node
    assert faults.take(protocol.HEARTBEAT, None) is None
    assert faults.take(protocol.HEARTBEAT, 2) is ErrorCode.rebalance_in_progress


def test_inject_refuses_bad_input_and_changes_nothing() -> None:
    faults = Faults()
    for api in ("ApiVersions", "SaslHandshake", "CreateTopics", "DescribeConfigs"):
        with pytest.raises(ValueError, match=r"takes no injected error: only .*Produce"):
            faults.inject(api, NOT_LEADER)
    with pytest.raises(ValueError, match="no Kafka API is called"):
        faults.inject("nope", NOT_LEADER)
    with pytest.raises(ValueError, match="NONE is no error"):
        faults.inject("Produce", "none")
    for count in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="count must be an int >= 1"):
            faults.inject("Produce", NOT_LEADER, count=count)  # type: ignore[arg-type]
    for node in (-1, True, "1"):
        with pytest.raises(ValueError, match="a node is a node id >= 0"):
            faults.inject("Produce", NOT_LEADER, node=node)  # type: ignore[arg-type]
    assert len(faults) == 0


def test_the_rules_are_bounded() -> None:
    with pytest.raises(ValueError, match="max_rules must be an int >= 1"):
        Faults(0)
    assert Faults().max_rules == Limits().max_fault_rules == 1000
    faults = Faults(max_rules=3)
    faults.inject("Produce", NOT_LEADER)
    faults.inject("Fetch", NOT_LEADER)
    faults.delay(10)
    with pytest.raises(ValueError, match="3 fault rules are pending already"):
        faults.inject("Metadata", "LEADER_NOT_AVAILABLE")
    with pytest.raises(ValueError, match="3 fault rules are pending already"):
        faults.delay(10, api="Produce")
    faults.inject("Fetch", NOT_LEADER, count=5)  # more of the last rule: no new rule
    faults.delay(20)  # the same delay changed: no new rule
    assert len(faults) == 3
    assert faults.take(protocol.PRODUCE, 0) is NOT_LEADER
    faults.inject("Metadata", "LEADER_NOT_AVAILABLE")  # room again
    faults.clear()
    assert len(faults) == 0
    assert faults.take(protocol.FETCH, 0) is None
    assert faults.delay_for(protocol.FETCH, 0) == 0.0


def test_the_most_specific_delay_applies_and_zero_removes_it() -> None:
    faults = Faults()
    assert faults.delay_for(protocol.PRODUCE, 0) == 0.0
    faults.delay(100)
    faults.delay(200, node=1)
    faults.delay(300, api="produce")
    faults.delay(400, api=protocol.PRODUCE, node=1)
    assert faults.delay_for(protocol.PRODUCE, 1) == pytest.approx(0.4)
    assert faults.delay_for(protocol.PRODUCE, 0) == pytest.approx(0.3)
    assert faults.delay_for(protocol.FETCH, 1) == pytest.approx(0.2)
    assert faults.delay_for(protocol.FETCH, 0) == pytest.approx(0.1)
    assert faults.delay_for(protocol.FETCH, None) == pytest.approx(0.1)
    faults.delay(0, api=protocol.PRODUCE, node=1)
    assert faults.delay_for(protocol.PRODUCE, 1) == pytest.approx(0.3)
    faults.delay(0, node=7)  # none there: nothing to remove
    assert len(faults) == 3
    # Any served API may be delayed, ApiVersions too (a slow broker answers slowly).
    faults.delay(5, api="ApiVersions")
    assert faults.delay_for(protocol.API_VERSIONS, 0) == pytest.approx(0.005)
    for ms in (-1, float("inf"), float("nan"), True, "5"):
        with pytest.raises(ValueError, match="a delay is a finite number of ms >= 0"):
            faults.delay(ms)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not served"):
        faults.delay(5, api="ElectLeaders")
    with pytest.raises(ValueError, match="a node is a node id"):
        faults.delay(5, node=-3)


# -- the answers ----------------------------------------------------------------------------


def error_codes(entity: Any) -> list[ErrorCode]:
    """Every error code in a decoded kio entity, at any depth."""
    found: list[ErrorCode] = []
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if isinstance(value, ErrorCode):
            found.append(value)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    found.extend(error_codes(item))
    return found


def round_trip(api_key: int, version: int, response: Any) -> Any:
    """``response`` encoded as a frame and decoded back by kio."""
    frame = protocol.encode_response(7, response)
    schema = protocol.response_schema(api_key, version)
    header, used = entity_reader(schema.__header_schema__)(frame, 4)
    assert header.correlation_id == 7
    decoded, size = entity_reader(schema)(frame, 4 + used)
    assert 4 + used + size == len(frame)  # nothing left over
    return decoded


TOPICS = (
    SimpleNamespace(
        name="t", topic="t", partitions=(SimpleNamespace(partition=0, partition_index=0),)
    ),
    SimpleNamespace(
        name="u",
        topic="u",
        partitions=(
            SimpleNamespace(partition=2, partition_index=2),
            SimpleNamespace(partition=1, partition_index=1),
        ),
    ),
)
"""Partitions t-0, u-2, u-1 as each API's request names them."""


def request_for(api_key: int) -> Any:
    """A request of ``api_key`` naming t-0, u-2 and u-1 (or group g, keys g1 and g2)."""
    offsets_topics = tuple(
        SimpleNamespace(
            name=topic.name,
            partitions=topic.partitions,
            partition_indexes=tuple(p.partition_index for p in topic.partitions),
        )
        for topic in TOPICS
    )
    requests: dict[int, Any] = {
        protocol.PRODUCE: SimpleNamespace(
            acks=-1,
            topic_data=(
                SimpleNamespace(name="t", partition_data=(SimpleNamespace(index=0),)),
                SimpleNamespace(
                    name="u", partition_data=(SimpleNamespace(index=2), SimpleNamespace(index=1))
                ),
                # Listed again: answered once, as the data path answers it.
                SimpleNamespace(name="t", partition_data=(SimpleNamespace(index=0),)),
            ),
        ),
        protocol.FETCH: SimpleNamespace(topics=TOPICS),
        protocol.LIST_OFFSETS: SimpleNamespace(topics=TOPICS),
        protocol.METADATA: SimpleNamespace(
            topics=(SimpleNamespace(name="t"), SimpleNamespace(name="u"))
        ),
        OFFSET_FOR_LEADER_EPOCH: SimpleNamespace(topics=TOPICS),
        protocol.ADD_PARTITIONS_TO_TXN: SimpleNamespace(
            v3_and_below_topics=(
                SimpleNamespace(name="t", partitions=(0,)),
                SimpleNamespace(name="u", partitions=(2, 1)),
            )
        ),
        protocol.TXN_OFFSET_COMMIT: SimpleNamespace(topics=offsets_topics),
        protocol.OFFSET_COMMIT: SimpleNamespace(topics=offsets_topics),
        protocol.OFFSET_FETCH: SimpleNamespace(
            topics=offsets_topics,
            groups=(SimpleNamespace(group_id="g", topics=offsets_topics),),  # v8+
        ),
    }
    default = SimpleNamespace(member_id="m", coordinator_keys=("g1", "g2"))
    return requests.get(api_key, default)


def partitions_answered(api_key: int, decoded: Any) -> list[tuple[str, int]]:
    """The (topic, partition) pairs a decoded answer lists, in its order."""
    if api_key == protocol.PRODUCE:
        return [(t.name, p.index) for t in decoded.responses for p in t.partition_responses]
    if api_key == protocol.FETCH:
        return [(t.topic, p.partition_index) for t in decoded.responses for p in t.partitions]
    if api_key == OFFSET_FOR_LEADER_EPOCH:
        return [(t.topic, p.partition) for t in decoded.topics for p in t.partitions]
    if api_key == protocol.ADD_PARTITIONS_TO_TXN:
        return [
            (t.name, p.partition_index)
            for t in decoded.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]
    if api_key == protocol.OFFSET_FETCH and hasattr(decoded, "groups"):  # v8+
        (group,) = decoded.groups
        return [(t.name, p.partition_index) for t in group.topics for p in t.partitions]
    return [(t.name, p.partition_index) for t in decoded.topics for p in t.partitions]


PER_PARTITION = {
    protocol.PRODUCE,
    protocol.FETCH,
    protocol.LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    protocol.ADD_PARTITIONS_TO_TXN,
    protocol.TXN_OFFSET_COMMIT,
    protocol.OFFSET_COMMIT,
    protocol.OFFSET_FETCH,
}

EPOCH_VERSIONS = (2, 4)
"""OffsetForLeaderEpoch's versions the broker is to serve (kio's oldest to v4)."""


def test_every_injectable_api_answers_the_error_at_every_version() -> None:
    """Encodable and read back by kio at each version, with the code at every error
    the answer has (Fetch's session-level code aside), every partition asked listed once."""
    code = ErrorCode.coordinator_load_in_progress
    for api_key in sorted(INJECTABLE):
        low, high = protocol.SERVED.get(api_key, EPOCH_VERSIONS)
        request = request_for(api_key)
        for version in range(low, high + 1):
            response = error_answer(api_key, version, request, code, brokers=[(0, "h", 1)])
            decoded = round_trip(api_key, version, response)
            codes = error_codes(decoded)
            if api_key == protocol.FETCH and version >= 7:
                assert decoded.error_code is ErrorCode.none  # the fetch session's
                codes.remove(ErrorCode.none)
            assert codes, (api_key, version)
            assert set(codes) == {code}, (api_key, version)
            if api_key in PER_PARTITION:
                answered = partitions_answered(api_key, decoded)
                assert answered == [("t", 0), ("u", 2), ("u", 1)], (api_key, version)
            if api_key == protocol.METADATA:
                assert [(t.name, t.error_code) for t in decoded.topics] == [
                    ("t", code),
                    ("u", code),
                ]
                assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [(0, "h", 1)]
                assert decoded.controller_id == 0
                assert all(t.partitions == () for t in decoded.topics)
            if api_key == protocol.FIND_COORDINATOR and version >= 4:
                assert [c.key for c in decoded.coordinators] == ["g1", "g2"]


def test_the_group_and_transaction_answers_keep_their_default() -> None:
    """Without a code, ``error_response`` answers UNKNOWN_SERVER_ERROR, as a failing
    handler's answer (today's callers); it needs no coordinator."""
    request = SimpleNamespace(member_id="m")
    for answer in (
        GroupApi.error_response(protocol.HEARTBEAT, 4, request),
        TxnApi.error_response(protocol.END_TXN, 3, request),
    ):
        assert answer.error_code is ErrorCode.unknown_server_error
    assert GroupApi.error_response(protocol.PRODUCE, 8, request) is None
    assert TxnApi.error_response(protocol.PRODUCE, 8, request) is None


def test_kio_requests_are_answered_whole() -> None:
    """Real decoded requests, at the newest versions served."""
    produce = produce_v8.ProduceRequest(
        transactional_id=None,
        acks=i16(1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            produce_v8.TopicProduceData(
                name=TopicName("t"),
                partition_data=(produce_v8.PartitionProduceData(index=i32(3), records=None),),
            ),
        ),
    )
    decoded = round_trip(
        protocol.PRODUCE, 8, error_answer(protocol.PRODUCE, 8, produce, NOT_LEADER)
    )
    (part,) = decoded.responses[0].partition_responses
    assert (part.index, part.error_code, part.base_offset) == (3, NOT_LEADER, -1)

    fetch = fetch_request("t", 5, max_wait=0.5, min_bytes=1)
    decoded = round_trip(protocol.FETCH, 11, error_answer(protocol.FETCH, 11, fetch, NOT_LEADER))
    (data,) = decoded.responses[0].partitions
    assert (data.partition_index, data.error_code, data.records) == (0, NOT_LEADER, b"")

    offsets = list_v5.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=(
            list_v5.ListOffsetsTopic(
                name=TopicName("t"),
                partitions=(
                    list_v5.ListOffsetsPartition(
                        partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)
                    ),
                ),
            ),
        ),
    )
    answer = error_answer(protocol.LIST_OFFSETS, 5, offsets, ErrorCode.fenced_leader_epoch)
    decoded = round_trip(protocol.LIST_OFFSETS, 5, answer)
    assert decoded.topics[0].partitions[0].error_code is ErrorCode.fenced_leader_epoch

    epochs = epoch_v4.OffsetForLeaderEpochRequest(
        replica_id=BrokerId(-1),
        topics=(
            epoch_v4.OffsetForLeaderTopic(
                topic=TopicName("t"),
                partitions=(
                    epoch_v4.OffsetForLeaderPartition(
                        partition=i32(0), current_leader_epoch=i32(2), leader_epoch=i32(1)
                    ),
                ),
            ),
        ),
    )
    answer = error_answer(OFFSET_FOR_LEADER_EPOCH, 4, epochs, NOT_LEADER)
    decoded = round_trip(OFFSET_FOR_LEADER_EPOCH, 4, answer)
    part = decoded.topics[0].partitions[0]
    assert (part.partition, part.error_code, part.leader_epoch, part.end_offset) == (
        0,
        NOT_LEADER,
        -1,
        -1,
    )


def test_metadata_for_all_topics_names_the_topics_given() -> None:
    request = metadata_v8.MetadataRequest(
        topics=None,
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    answer = error_answer(
        protocol.METADATA,
        8,
        request,
        ErrorCode.leader_not_available,
        brokers=[(1, "a", 9092), (2, "b", 9093)],
        topics=["x", "y"],
    )
    decoded = round_trip(protocol.METADATA, 8, answer)
    assert [t.name for t in decoded.topics] == ["x", "y"]
    assert decoded.controller_id == 1
    assert decoded.cluster_id == protocol.CLUSTER_ID
    bare = round_trip(protocol.METADATA, 1, error_answer(protocol.METADATA, 1, request, NOT_LEADER))
    assert (bare.brokers, bare.topics, bare.controller_id) == ((), (), -1)


def test_an_acks_0_produce_closes_the_connection_and_others_are_refused() -> None:
    request = SimpleNamespace(acks=0, topic_data=())
    with pytest.raises(ClosingConnection, match="NOT_LEADER_OR_FOLLOWER injected into an acks=0"):
        error_answer(protocol.PRODUCE, 8, request, NOT_LEADER)
    with pytest.raises(ValueError, match=r"ApiVersions \(API 18\) has no injected error answer"):
        error_answer(protocol.API_VERSIONS, 3, SimpleNamespace(), NOT_LEADER)


# -- the log --------------------------------------------------------------------------------


class Observer:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, float | None, float | None, ap.Outcome, float]] = []

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        self.rows.append(
            (purgatory, op.kind, op.num_keys, op.created, op.deadline, outcome, finished)
        )


def test_the_fault_log_logs_keeps_and_tells_the_observer(caplog: pytest.LogCaptureFixture) -> None:
    observer = Observer()
    now = iter([1.5, 2.5, 3.5])
    faults_log = FaultLog(observer, clock=lambda: next(now), keep=2)
    with caplog.at_level(logging.WARNING, logger="aiopurgatory.kafka"):
        faults_log.record("stop_node", "node=1")
        faults_log.record("leader_change", "t-0 1 -> 2 epoch 3", effect=True)
    assert [r.getMessage() for r in caplog.records] == [
        "fault: stop_node node=1",
        "effect: leader_change t-0 1 -> 2 epoch 3",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert observer.rows == [
        (FAULTS_PURGATORY, "stop_node", 0, 1.5, None, ap.Outcome.COMPLETED, 1.5),
        (FAULTS_PURGATORY, "leader_change", 0, 2.5, None, ap.Outcome.COMPLETED, 2.5),
    ]
    faults_log.record("clear")
    assert list(faults_log.lines) == ["effect: leader_change t-0 1 -> 2 epoch 3", "fault: clear"]


def test_the_fault_log_refuses_bad_events_and_survives_its_observer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faults_log = FaultLog()
    for event in ("", "Stop", "stop node", "x" * 65, 3):
        with pytest.raises(ValueError, match="an event is a lower-case name"):
            faults_log.record(event)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a detail is a string"):
        faults_log.record("stop_node", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        FaultLog(keep=0)
    assert not faults_log.lines

    class Failing:
        def operation_finished(self, *args: object) -> None:
            raise RuntimeError("full disk")

    failing = FaultLog(Failing())
    with caplog.at_level(logging.WARNING, logger="aiopurgatory.kafka"):
        failing.record("isolate", "node=2")
    assert list(failing.lines) == ["fault: isolate node=2"]
    assert "the observer of the fault log raised" in caplog.text


def test_a_trace_recording_shows_the_faults(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from aiopurgatory.trace import TraceRecorder

    with TraceRecorder(tmp_path) as recorder:
        FaultLog(recorder).record("stop_node", "node=1")
    (name,) = [p.name for p in tmp_path.glob("trace-*.parquet")]
    rows = pq.read_table(tmp_path / name).to_pylist()
    assert [(r["purgatory"], r["kind"], r["outcome"], r["deadline_ns"]) for r in rows] == [
        ("faults", "stop_node", "completed", None)
    ]
    assert rows[0]["created_ns"] == rows[0]["finished_ns"]


# -- the limit ------------------------------------------------------------------------------


def test_max_fault_rules_is_a_limit_and_an_option() -> None:
    assert Limits().max_fault_rules == 1000
    with pytest.raises(ValueError, match="max_fault_rules must be > 0"):
        Limits(max_fault_rules=0)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["--max-fault-rules", "5"]).max_fault_rules == 5
    assert "injected faults" in parser.format_help()


def test_every_served_api_and_version_has_one_error_answer_on_both_paths() -> None:
    """Over every API served, at every version: an injected fault (``error_answer``) is
    answered for exactly the injectable APIs, a failing handler
    (``KafkaBroker._error_response``) for exactly the group and transaction APIs; each
    answer decodes with the error at every error code it has, and where both paths
    answer, they give the same answer (one source: each API module's ``error_response``)."""
    from aiopurgatory.kafka import KafkaBroker
    from aiopurgatory.kafka.group_api import GROUP_APIS
    from aiopurgatory.kafka.txn_api import TXN_APIS

    broker = KafkaBroker()
    answered: dict[str, set[int]] = {"fault": set(), "handler": set()}
    try:
        for api_key, (low, high) in sorted(protocol.SERVED.items()):
            request = request_for(api_key)
            for version in range(low, high + 1):
                for code in (ErrorCode.not_coordinator, ErrorCode.unknown_server_error):
                    try:
                        fault = error_answer(api_key, version, request, code, brokers=[(0, "h", 1)])
                    except ValueError:
                        fault = None
                    handler = broker._error_response(api_key, version, request, code)
                    for path, answer in (("fault", fault), ("handler", handler)):
                        if answer is None:
                            continue
                        answered[path].add(api_key)
                        codes = error_codes(round_trip(api_key, version, answer))
                        if api_key == protocol.FETCH and version >= 7:
                            codes.remove(ErrorCode.none)  # the fetch session's
                        assert codes, (path, api_key, version)
                        assert set(codes) == {code}, (path, api_key, version)
                    if handler is not None:
                        assert handler == fault, (api_key, version)
                default = broker._error_response(api_key, version, request)
                assert default == broker._error_response(
                    api_key, version, request, ErrorCode.unknown_server_error
                )
    finally:
        broker.groups.close()
        broker.core.close()
    assert answered["fault"] == INJECTABLE
    assert answered["handler"] == {
        *GROUP_APIS,
        *TXN_APIS,
        protocol.INIT_PRODUCER_ID,
        protocol.CONSUMER_GROUP_HEARTBEAT,
    }
