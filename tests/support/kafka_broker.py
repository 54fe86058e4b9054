"""Kafka broker helpers shared by the broker's test modules: the single-node defaults the
older tests start with, and raw Produce / ListOffsets / OffsetCommit requests over a
:class:`~tests.support.kafka_wire.Wire`.

Here, not in a test module, so that no test module imports another (a test module
is no library: importing one ties two files' edits, and their fixtures, together).
"""

from __future__ import annotations

import contextlib
import datetime
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.schema.join_group.v5 import request as join_v5
from kio.schema.list_offsets.v5 import request as list_offsets
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.schema.offset_commit.v3 import request as commit_v3
from kio.schema.produce.v8 import request as produce
from kio.schema.produce.v8.response import ProduceResponse
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i32, i32Timedelta, i64, i64Timedelta

from aiopurgatory.kafka import BrokerThread, KafkaBroker, Limits, protocol

from .kafka_wire import Wire, create, ms
from .servers import ROOT, start_server

OLD_DEFAULTS = (
    "--partitions",
    "3",
    "--replicas",
    "3",
    "--group-initial-rebalance-delay-ms",
    "3000",
)


def start_broker_process(*options: str) -> tuple[subprocess.Popen[str], str]:
    """``python -m aiopurgatory.kafka`` on OLD_DEFAULTS and then ``options`` (a later
    option wins), on a free port; returns the process and its bootstrap address."""
    return start_server("-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS, *options)


def start_traced_broker(trace: Path) -> tuple[subprocess.Popen[str], str]:
    """The broker process writing its trace to ``trace`` (stop it with SIGTERM, which
    flushes and closes the trace), groups rebalancing after 100 ms."""
    return start_broker_process("--group-initial-rebalance-delay-ms", "100", "--trace", str(trace))


def kafka_cli_help() -> str:
    """What ``python -m aiopurgatory.kafka --help`` prints."""
    command = [sys.executable, "-m", "aiopurgatory.kafka", "--help"]
    return subprocess.check_output(command, cwd=ROOT, text=True, timeout=30)


def producer_id(wire: Wire) -> int:
    """A new idempotent producer's id (InitProducerId v1, no transactional id)."""
    init = wire.call(
        InitProducerIdRequest(transactional_id=None, transaction_timeout=ms(60)),
        InitProducerIdResponse,
    )
    assert init.error_code is ErrorCode.none
    return int(init.producer_id)


def assert_unknown_server_error_at_every_version(
    broker: KafkaBroker, api_key: int, request: Any
) -> None:
    """The broker's answer to ``request`` when its handler fails, at every version of
    ``api_key`` it serves, read back from the encoded frame: UNKNOWN_SERVER_ERROR at the
    top level or in each partition (AddPartitionsToTxn v3 and below's too) or each
    coordinator (FindCoordinator v4+) or each group (OffsetFetch v8+), and no other
    error."""
    low, high = protocol.SERVED[api_key]
    for version in range(low, high + 1):
        response = broker._error_response(api_key, version, request)
        frame = protocol.encode_response(7, response)
        schema = protocol.response_schema(api_key, version)
        _, used = entity_reader(schema.__header_schema__)(frame, 4)
        decoded = entity_reader(schema)(frame, 4 + used)[0]
        codes = [getattr(decoded, "error_code", None)]
        codes += [
            part.error_code for topic in getattr(decoded, "topics", ()) for part in topic.partitions
        ]
        codes += [
            part.partition_error_code
            for topic in getattr(decoded, "results_by_topic_v3_and_below", ())
            for part in topic.results_by_partition
        ]
        codes += [c.error_code for c in getattr(decoded, "coordinators", ())]
        for group in getattr(decoded, "groups", ()):  # OffsetFetch v8+
            codes += [group.error_code]
            codes += [part.error_code for topic in group.topics for part in topic.partitions]
        assert ErrorCode.unknown_server_error in codes, (api_key, version)
        assert set(codes) <= {None, ErrorCode.unknown_server_error}, (api_key, version)


def produced(wire: Wire, request: produce.ProduceRequest) -> list[tuple[ErrorCode, int]]:
    """(error, base offset) of each partition answered, in order."""
    response = wire.call(request, ProduceResponse)
    return [
        (part.error_code, int(part.base_offset))
        for topic_response in response.responses
        for part in topic_response.partition_responses
    ]


def list_offsets_request(entries: list[tuple[str, int, int]]) -> list_offsets.ListOffsetsRequest:
    """One ListOffsets naming (topic, partition, timestamp) entries, topics in order."""
    by_topic: dict[str, list[list_offsets.ListOffsetsPartition]] = {}
    for name, index, timestamp in entries:
        by_topic.setdefault(name, []).append(
            list_offsets.ListOffsetsPartition(partition_index=i32(index), timestamp=i64(timestamp))
        )
    return list_offsets.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=tuple(
            list_offsets.ListOffsetsTopic(name=TopicName(name), partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def offsets(wire: Wire, entries: list[tuple[str, int, int]]) -> list[tuple[ErrorCode, int, int]]:
    """(error, timestamp, offset) answering each entry."""
    response = wire.call(list_offsets_request(entries), ListOffsetsResponse)
    return [
        (part.error_code, int(part.timestamp), int(part.offset))
        for topic_response in response.topics
        for part in topic_response.partitions
    ]


@contextlib.contextmanager
def wire_broker(**limits: Any) -> Iterator[tuple[Any, Wire]]:
    """A broker (``limits``: Limits fields) in a thread, its first rebalance at once,
    and a raw connection to it."""
    thread = BrokerThread(
        partitions=3, replicas=3, initial_rebalance_delay=0.0, limits=Limits(**limits)
    )
    with thread as address:
        wire = Wire(address)
        wire.sock.settimeout(10)  # a watchdog on every answer
        try:
            yield thread.broker, wire
        finally:
            wire.sock.close()


def wire_topic(wire: Wire, topic: str) -> None:
    """Create ``topic`` (the broker's default partitions) by asking for its metadata."""
    create(wire, topic)


def ms_delta(milliseconds: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=milliseconds)


def commit_v3_request(
    group: str, offsets: dict[tuple[str, int], tuple[int, str]], generation: int = -1
) -> commit_v3.OffsetCommitRequest:
    topics: dict[str, list[commit_v3.OffsetCommitRequestPartition]] = {}
    for (topic, index), (offset, metadata) in offsets.items():
        topics.setdefault(topic, []).append(
            commit_v3.OffsetCommitRequestPartition(
                partition_index=i32(index),
                committed_offset=i64(offset),
                committed_metadata=metadata,
            )
        )
    return commit_v3.OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(generation),
        member_id="" if generation < 0 else "made-up-member",
        retention_time=i64Timedelta.parse(ms_delta(-1)),
        topics=tuple(
            commit_v3.OffsetCommitRequestTopic(name=TopicName(name), partitions=tuple(parts))
            for name, parts in topics.items()
        ),
    )


def join_v5_request(
    group: str, member_id: str = "", session_ms: int = 10_000, rebalance_ms: int = 30_000
) -> join_v5.JoinGroupRequest:
    """A JoinGroup v5 of the "consumer" protocol type (one "range" protocol)."""
    return join_v5.JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=i32Timedelta.parse(ms_delta(session_ms)),
        rebalance_timeout=i32Timedelta.parse(ms_delta(rebalance_ms)),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(join_v5.JoinGroupRequestProtocol(name="range", metadata=b"r"),),
    )
