"""What the Kafka tests share (a plain module, no tests): raw connections sending
kio-encoded requests (:class:`Wire`, :class:`FlexibleWire`) with the request builders
and callers written on them (``send``, ``fetch_from``, ``metadata_of``), record
batches, unique names, polling, calls bounded in a helper thread, and the three-node
cluster the cluster and failover tests run (``cluster_thread``, ``cluster_broker``)."""

from __future__ import annotations

import contextlib
import datetime
import io
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, Final, Self, TypedDict, TypeVar, Unpack

from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.metadata.v8 import request as metadata
from kio.schema.metadata.v8.response import MetadataResponse
from kio.schema.produce.v8 import request as produce
from kio.schema.produce.v8.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import Records, TZAwareMicros, i8, i16, i32, i32Timedelta, i64

from aiopurgatory.kafka import BrokerThread, KafkaBroker, protocol
from aiopurgatory.kafka.log import TopicPartition

T = TypeVar("T")

WATCHDOG = 15.0
"""Seconds any one wait of a failover test may take."""
NODES = 3
"""The nodes of the cluster the cluster and failover tests run."""
REPLICA_LAG = 0.5
"""That cluster's ``replica_lag`` (Kafka's replica.lag.time.max.ms), in seconds."""


def name(prefix: str) -> str:
    """A topic, group or transactional id of its own: ``prefix-`` and 10 hex digits."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ms(seconds: float) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(seconds=seconds))


# -- raw frames ------------------------------------------------------------------------


def connect(broker: str) -> socket.socket:
    host, port = broker.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def closed_by_broker(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return recv_exactly(sock, size)


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = io.BytesIO()
    while data.tell() < count:
        chunk = sock.recv(count - data.tell())
        assert chunk, "connection closed"
        data.write(chunk)
    return data.getvalue()


def encoded(
    request: Any,
    correlation_id: int,
    *,
    header_type: type[Any] | None = None,
    client_id: str = "wire-test",
    patch: Callable[[bytearray], None] | None = None,
) -> bytes:
    """``request`` as a frame (:func:`aiopurgatory.kafka.protocol.encode_request`): its
    size, then its header (``header_type``; by default the one its schema names) and
    body, the encoded bytes first given to ``patch`` (to write what kio would refuse to
    encode; the size is then that of the patched bytes)."""
    frame = protocol.encode_request(request, correlation_id, client_id, header_type)
    if patch is None:
        return frame
    payload = bytearray(frame[4:])
    patch(payload)
    return struct.pack(">i", len(payload)) + payload


class Wire:
    """A raw connection sending kio-encoded requests (non-flexible versions, header v1);
    ``with Wire(address) as wire:`` closes it at the end."""

    request_header: type[Any] = RequestHeader

    def __init__(self, broker: str) -> None:
        self.sock = connect(broker)
        self.correlation_id = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.sock.close()

    def call(self, request: Any, response_type: type[Any]) -> Any:
        self.send(request)
        return self.receive(response_type)

    def send(self, request: Any) -> None:
        """Send ``request`` without waiting for its answer (:meth:`receive` reads it)."""
        self.correlation_id += 1
        frame = encoded(request, self.correlation_id, header_type=self.request_header)
        self.sock.sendall(frame)

    def receive(self, response_type: type[Any]) -> Any:
        """The answer to the last request sent (requests are answered in order)."""
        self.sock.settimeout(10)
        frame = read_frame(self.sock)
        correlation_id, used = self.response_header(frame)
        assert correlation_id == self.correlation_id
        return entity_reader(response_type)(frame, used)[0]

    def response_header(self, frame: bytes) -> tuple[int, int]:
        """The correlation id of the answer ``frame``, and the bytes its header took."""
        return struct.unpack(">i", frame[:4])[0], 4


class FlexibleWire(Wire):
    """A raw connection for flexible versions: request header v2, response header v1."""

    request_header = RequestHeaderV2

    def response_header(self, frame: bytes) -> tuple[int, int]:
        header, used = entity_reader(ResponseHeaderV1)(frame, 0)
        return header.correlation_id, used


def batch(
    producer_id: int, sequence: int, values: list[bytes], *, epoch: int = 0, attributes: int = 0
) -> bytes:
    """A record batch of ``values`` (offsets from 0), stamped now."""
    now = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC).replace(microsecond=0))
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=v, headers=())
        for i, v in enumerate(values)
    )
    buffer = io.BytesIO()
    write_new_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(epoch),
            base_sequence=i32(sequence),
            records=records,
            attributes=i16(attributes),
        ),
    )
    return buffer.getvalue()


# -- requests and their callers ----------------------------------------------------------


def metadata_request(
    names: list[str] | None, *, auto_create: bool = False, schema: ModuleType = metadata
) -> Any:
    """Metadata of the topics ``names`` (every topic: None), v8 or that of ``schema``
    (a kio ``metadata.vN.request``)."""
    return schema.MetadataRequest(
        topics=None
        if names is None
        else tuple(schema.MetadataRequestTopic(name=TopicName(n)) for n in names),
        allow_auto_topic_creation=auto_create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def metadata_of(wire: Wire, names: list[str] | None) -> Any:
    return wire.call(metadata_request(names), MetadataResponse)


def create(wire: Wire, name: str) -> None:
    """The topic ``name`` created by a Metadata request that may create it."""
    response = wire.call(metadata_request([name], auto_create=True), MetadataResponse)
    assert response.topics[0].error_code is ErrorCode.none


def produce_request(
    topics: list[tuple[str, list[tuple[int, bytes]]]], acks: int = -1, timeout: float = 5.0
) -> produce.ProduceRequest:
    """One Produce v8 of (topic, [(partition, records)]) entries, topics in order."""
    return produce.ProduceRequest(
        acks=i16(acks),
        timeout=ms(timeout),
        topic_data=tuple(
            produce.TopicProduceData(
                name=TopicName(name),
                partition_data=tuple(
                    produce.PartitionProduceData(index=i32(index), records=Records(records))
                    for index, records in parts
                ),
            )
            for name, parts in topics
        ),
    )


def send(
    wire: Wire,
    name: str,
    values: list[bytes],
    *,
    acks: int = -1,
    pid: int = -1,
    sequence: int = -1,
    partition: int = 0,
    timeout: float = 5.0,
) -> Any:
    """``values`` produced in one batch; the partition's answer."""
    request = produce_request(
        [(name, [(partition, batch(pid, sequence, values))])], acks=acks, timeout=timeout
    )
    return wire.call(request, ProduceResponse).responses[0].partition_responses[0]


class FetchOptions(TypedDict, total=False):
    """What :func:`fetch_request` may be told besides the topic and offset."""

    partition: int
    """The partition fetched (0, the default)."""
    epoch: int
    """The leader epoch the client knows (-1, the default: none)."""
    max_wait: float
    min_bytes: int
    max_bytes: int
    partition_max: int
    isolation: int


def fetch_request(name: str, offset: int, **options: Unpack[FetchOptions]) -> fetch.FetchRequest:
    """Fetch v11 of a partition of ``name`` (0 unless told) from ``offset``; by default
    answered at once (no wait, no minimum), 1 MiB at most, read_uncommitted."""
    return fetch.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=ms(options.get("max_wait", 0.0)),
        min_bytes=i32(options.get("min_bytes", 0)),
        max_bytes=i32(options.get("max_bytes", 1 << 20)),
        isolation_level=i8(options.get("isolation", 0)),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            fetch.FetchTopic(
                topic=TopicName(name),
                partitions=(
                    fetch.FetchPartition(
                        partition=i32(options.get("partition", 0)),
                        current_leader_epoch=i32(options.get("epoch", -1)),
                        fetch_offset=i64(offset),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(options.get("partition_max", 1 << 20)),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def fetch_from(wire: Wire, name: str, offset: int, **options: Unpack[FetchOptions]) -> Any:
    """The partition's answer to :func:`fetch_request`."""
    request = fetch_request(name, offset, **options)
    return wire.call(request, FetchResponse).responses[0].partitions[0]


# -- the broker core's stand-in batches ----------------------------------------------------

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)


@dataclass(frozen=True, slots=True)
class Batch:
    size: int
    count: int


# -- the cluster -------------------------------------------------------------------------


def cluster_thread(**options: Any) -> BrokerThread:
    """NODES nodes, every topic replicated on three, in a thread of its own (not started)."""
    return BrokerThread(nodes=NODES, replicas=3, replica_lag=REPLICA_LAG, **options)


def cluster_broker(**options: Any) -> KafkaBroker:
    """The same cluster on the test's loop (``async with``)."""
    return KafkaBroker(nodes=NODES, replicas=3, replica_lag=REPLICA_LAG, **options)


@contextlib.contextmanager
def running(thread: BrokerThread) -> Iterator[BrokerThread]:
    """``thread`` started, and stopped at the end."""
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def address(cluster: BrokerThread, node: int) -> str:
    return cluster.call(lambda broker: broker.node_address(node))


def high_watermarks(broker: KafkaBroker | BrokerThread, topic: str) -> dict[int, int]:
    return {o.partition: o.high_watermark for o in broker.offsets(topic)}


def injected(broker: KafkaBroker | BrokerThread, api: str, error: str = "") -> list[str]:
    """The fault log's lines of requests of ``api`` answered with an injected error
    (``error``, lower case, if given)."""
    lines = broker.fault_lines if isinstance(broker, BrokerThread) else broker.fault_log.lines
    return [
        line
        for line in lines
        if line.startswith(f"effect: injected {api} ")
        and (not error or line.endswith(f": {error}"))
    ]


def wait_for(predicate: Callable[[], bool], what: str = "", timeout: float = WATCHDOG) -> None:
    """Poll ``predicate`` every 20 ms until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)


def started(function: Callable[[], T], what: str = "") -> Callable[[float], T]:
    """``function()`` started in a helper thread; call what is returned with a timeout
    to get its answer (or its exception) within it: for a client's call that may block
    without a bound (kafka-python's transactional calls, a client's close)."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as exc:  # reported to the test's thread
            outcome.append((False, exc))

    helper = threading.Thread(target=run, name=f"bounded {what}", daemon=True)
    helper.start()

    def result(timeout: float) -> T:
        helper.join(timeout)
        assert outcome, f"{what or function} did not return within {timeout:g} s"
        ok, value = outcome[0]
        if not ok:
            raise value
        answer: T = value
        return answer

    return result


def bounded(function: Callable[[], T], what: str = "", timeout: float = WATCHDOG) -> T:
    """``function()``'s answer within ``timeout`` s (see :func:`started`)."""
    return started(function, what)(timeout)


PROMPT: Final = 3.0
"""Seconds within which a client must be answered for it to count as not kept waiting."""


@contextlib.contextmanager
def sockets(address: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` raw connections to ``address``, closed on the way out."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(connect(address))
        yield opened
    finally:
        for sock in opened:
            sock.close()


def answered_promptly(address: str) -> float:
    """Seconds a new connection's ApiVersions took to be answered (at most PROMPT)."""
    from kio.schema.api_versions.v0.request import ApiVersionsRequest
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    with Wire(address) as wire:
        started = time.monotonic()
        wire.send(ApiVersionsRequest())
        wire.sock.settimeout(PROMPT)
        assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
        return time.monotonic() - started


async def aiokafka_read(broker: str, topic: str, count: int) -> list[tuple[int, bytes | None]]:
    """The first ``count`` records of partition 0 of ``topic`` as aiokafka reads them from
    offset 0: (offset, value), within 10 s."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), 10)
    read: list[tuple[int, bytes | None]] = []
    try:
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)

        async def drain() -> None:
            while len(read) < count:
                batches = await consumer.getmany(tp, timeout_ms=200)
                read.extend((m.offset, m.value) for m in batches.get(tp, []))

        await asyncio.wait_for(drain(), 10)
    finally:
        await consumer.stop()
    return read


async def served_over_tls(bootstrap: str, context: ssl.SSLContext) -> None:
    """An aiokafka producer connects over TLS with ``context`` and has one record
    acknowledged (the listener still serves a real client)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=context
    )
    await producer.start()
    try:
        await producer.send_and_wait(name("tls"), b"served")
    finally:
        await producer.stop()
