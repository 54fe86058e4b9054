"""A Kafka-protocol broker on aiopurgatory, for the Kafka clients people use.

    python examples/kafka_broker/server.py --host 127.0.0.1 --port 9092

``--port 0`` picks a free port; the first line printed is ``listening on HOST:PORT``.
aiokafka, kafka-python and confluent-kafka connect to it with their defaults
(``bootstrap_servers="HOST:PORT"``). State lives in memory: a restart starts empty.

The log and the delayed operations are the broker simulator's core
(:class:`aiopurgatory.demo.broker.BrokerCore`): this module only speaks the wire
protocol around it. Each partition's log holds the producers' v2 record batches as
they arrived; the broker assigns offsets by rewriting a batch's base offset, which
the batch's CRC does not cover. One purgatory per kind of delayed operation, as
Kafka's ReplicaManager keeps them:

* ``fetch``: a Fetch is a ``DelayedFetch`` over every partition it reads, answered as
  soon as ``min_bytes`` are readable (up to the high watermark), at ``max_wait_ms``
  otherwise, at once on an error; a produce to any of its partitions re-checks it;
* ``produce``: acks=all is a ``DelayedProduce``, answered once the high watermark
  covers its batches or REQUEST_TIMED_OUT at the request's ``timeout_ms``.

The wire format is kio's (generated from Kafka's own message schemas); see README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import datetime
import functools
import io
import logging
import re
import signal
import struct
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final

from crc32c import crc32c
from kio import index as kio_index
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_int8, read_int16, read_int32, read_int64, read_uint32
from kio.static.constants import EntityType

import aiopurgatory as ap
from aiopurgatory.demo.broker import BrokerCore, Partition, TopicPartition
from aiopurgatory.demo.groups import GroupCoordinator

log = logging.getLogger("kafka_broker")

NODE_ID: Final = 0
CLUSTER_ID: Final = "aiopurgatory-kafka-broker"
LEADER_EPOCH: Final = 0

# API keys (Kafka's numbering) and the versions served. Each range starts at kio's
# oldest schema (the versions Kafka 4 still serves) and stops before versions whose
# semantics this broker does not model (Fetch by topic id from v13, for example).
API_VERSIONS: Final = 18
PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
INIT_PRODUCER_ID: Final = 22
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
SERVED: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 8),
    FETCH: (4, 11),
    LIST_OFFSETS: (1, 5),
    METADATA: (1, 8),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 7),
    FIND_COORDINATOR: (0, 3),
    JOIN_GROUP: (0, 7),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 4),
    SYNC_GROUP: (0, 5),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 6),
    DELETE_TOPICS: (1, 5),
    INIT_PRODUCER_ID: (0, 4),
}

# The v2 record batch header (Kafka's message format documentation): byte offsets of
# the fields the broker reads or rewrites; the CRC32C covers attributes to the end.
BATCH_BASE_OFFSET: Final = 0
BATCH_LENGTH: Final = 8
BATCH_LEADER_EPOCH: Final = 12
BATCH_MAGIC: Final = 16
BATCH_CRC: Final = 17
BATCH_ATTRIBUTES: Final = 21
BATCH_LAST_OFFSET_DELTA: Final = 23
BATCH_MAX_TIMESTAMP: Final = 35
BATCH_PRODUCER_ID: Final = 43
BATCH_PRODUCER_EPOCH: Final = 51
BATCH_BASE_SEQUENCE: Final = 53
BATCH_HEADER_BYTES: Final = 61
LOG_OVERHEAD: Final = 12
"""Base offset and length: the bytes of a batch before what its length counts."""
TRANSACTIONAL: Final = 0x10

EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
FOLLOWER_MAX_WAIT: Final = 60.0
"""A follower's fetch waits this long for data before asking again (a produce or a
topic deletion answers it sooner)."""
PRODUCER_SEQUENCES_KEPT: Final = 5
"""Batches per producer and partition whose retries are recognised (Kafka keeps 5)."""
FIRST_PRODUCER_ID: Final = 1000
"""InitProducerId hands out ids from here up, one after the other: the ids handed out
are ``FIRST_PRODUCER_ID <= id < next_producer_id``."""
TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
MAX_REPLICAS: Final = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Every resource a client can make the broker hold, bounded."""

    max_request_bytes: int = 16 * 1024 * 1024
    """A frame announcing more closes its connection (Kafka's socket.request.max.bytes)."""
    max_connections: int = 1024
    idle_seconds: float = 600.0
    """A connection sending no complete request for this long is closed
    (Kafka's connections.max.idle.ms)."""
    retain_bytes: int = 64 * 1024 * 1024
    """Per partition: the oldest batches below the high watermark go beyond this."""
    retain_total_bytes: int = 512 * 1024 * 1024
    """All partitions: the oldest batches anywhere go beyond this; while the followers
    have not replicated enough to drop any, produces are refused (KAFKA_STORAGE_ERROR)."""
    max_inflight_bytes: int = 64 * 1024 * 1024
    """Request frames being read or handled and fetch answers being sent, over all
    connections: beyond it, connections wait (Kafka's queued.max.request.bytes)."""
    budget_wait_seconds: float = 30.0
    """A request frame, or a fetch's answer, waits at most this long for room in
    max_inflight_bytes; then its connection is closed (the client reconnects and
    retries, as after its own request timeout, 30 s in Kafka's clients)."""
    max_fetch_bytes: int = 16 * 1024 * 1024
    """A fetch's max_bytes is capped at this (more is fetched by the next request)."""
    max_topics: int = 1000
    max_partitions: int = 64
    """Per topic."""
    max_producers: int = 10_000
    """Producer ids handed out by InitProducerId (a batch carrying any other id is refused,
    UNKNOWN_PRODUCER_ID)."""
    max_producer_states: int = 50_000
    """Idempotent producers' states kept, one per producer id and partition written to
    (up to 2 kB each); beyond it the least recently written is forgotten, and that
    producer's next batch there is answered UNKNOWN_PRODUCER_ID (clients then bump their
    epoch and go on), as Kafka answers a producer whose state expired."""
    max_wait_seconds: float = 30.0
    """A fetch's max_wait_ms and a produce's timeout_ms are capped at this."""
    max_groups: int = 1000
    max_members: int = 1000
    """Per group."""
    max_committed_offsets: int = 100_000
    """Per group."""
    offset_metadata_max_bytes: int = 4096
    """A committed offset's metadata beyond this (in characters, as Kafka counts it) is
    refused OFFSET_METADATA_TOO_LARGE (Kafka's offset.metadata.max.bytes)."""
    offsets_retention_minutes: int = 7 * 24 * 60
    """An empty group's committed offsets are dropped this long after it became empty
    (or after its last standalone commit), and the group with them; a group with
    neither members nor offsets goes at once (Kafka's offsets.retention.minutes)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"{field.name} must be > 0, got {value!r}")
        if self.max_inflight_bytes < self.max_request_bytes:
            raise ValueError("max_inflight_bytes must be >= max_request_bytes")


LIMIT_HELP: Final = {
    "budget_wait_seconds": "a request frame or a fetch answer waits this long at most for "
    "room in the in-flight bytes, then its connection is closed",
    "max_producers": "producer ids InitProducerId hands out; a batch with another id is "
    "refused (UNKNOWN_PRODUCER_ID)",
    "max_producer_states": "idempotent producers' states (one per producer id and partition, "
    "up to 2 kB each); beyond it the least recently written is forgotten",
    "offset_metadata_max_bytes": "a committed offset's metadata beyond this many characters "
    "is refused OFFSET_METADATA_TOO_LARGE",
    "offsets_retention_minutes": "an empty group's committed offsets, and the group, are "
    "dropped this long after it became empty or after its last standalone commit",
}
"""``--help`` for the limits whose name alone does not say what is refused."""


@dataclasses.dataclass(slots=True)
class StoredBatch:
    """A producer's record batch as stored: its bytes with the base offset assigned."""

    data: bytes
    count: int
    max_timestamp: int
    timestamp_so_far: int
    """The largest max timestamp of this batch and of every batch before it in its
    partition. Batches' own timestamps need not increase (producers set them), this
    does: the first batch whose own max timestamp reaches a time is the first whose
    running maximum does, found by bisection (Kafka's time index keeps the same)."""

    @property
    def size(self) -> int:
        return len(self.data)


def _timestamp_so_far(batch: StoredBatch) -> int:
    return batch.timestamp_so_far


class BadBatch(Exception):
    """A record batch the broker will not store: answered CORRUPT_MESSAGE."""


@dataclasses.dataclass(slots=True)
class IncomingBatch:
    data: bytearray
    count: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


def split_batches(records: bytes) -> list[IncomingBatch]:
    """The v2 batches in a produce request's records, each checked (magic, CRC)."""
    batches = []
    view = memoryview(records)
    at = 0
    while at < len(view):
        if len(view) - at < BATCH_HEADER_BYTES:
            raise BadBatch("truncated batch header")
        length, _ = read_int32(view, at + BATCH_LENGTH)
        end = at + LOG_OVERHEAD + length
        if length < BATCH_HEADER_BYTES - LOG_OVERHEAD or end > len(view):
            raise BadBatch(f"batch length {length} does not fit the records")
        magic, _ = read_int8(view, at + BATCH_MAGIC)
        if magic != 2:
            raise BadBatch(f"record batch magic {magic}, only v2 (magic 2) is served")
        crc, _ = read_uint32(view, at + BATCH_CRC)
        if crc != crc32c(view[at + BATCH_ATTRIBUTES : end]):
            raise BadBatch("record batch CRC mismatch")
        attributes, _ = read_int16(view, at + BATCH_ATTRIBUTES)
        if attributes & TRANSACTIONAL:
            raise BadBatch("transactional batches are not served")
        delta, _ = read_int32(view, at + BATCH_LAST_OFFSET_DELTA)
        if delta < 0:
            raise BadBatch(f"last offset delta {delta} < 0")
        batches.append(
            IncomingBatch(
                data=bytearray(view[at:end]),
                count=delta + 1,
                max_timestamp=read_int64(view, at + BATCH_MAX_TIMESTAMP)[0],
                producer_id=read_int64(view, at + BATCH_PRODUCER_ID)[0],
                producer_epoch=read_int16(view, at + BATCH_PRODUCER_EPOCH)[0],
                base_sequence=read_int32(view, at + BATCH_BASE_SEQUENCE)[0],
            )
        )
        at = end
    if not batches:
        raise BadBatch("no record batch")
    return batches


@dataclasses.dataclass(slots=True)
class ProducerState:
    """An idempotent producer's recent batches on one partition (Kafka's producer state)."""

    epoch: int
    last_sequence: int
    recent: collections.deque[tuple[int, int, int]]
    """(first sequence, last sequence, base offset) of its last batches."""


# -- kio glue: decode a request, build and encode a response of any served version ---


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


def make(cls: Any, **values: object) -> Any:
    """``cls(**values)`` without the fields this version of the schema lacks."""
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


@functools.cache
def response_module(api_key: int, version: int) -> Any:
    return kio_index.load_payload_module(api_key, version, EntityType.response)


# kio resolves a schema by importing its module by name on every call: once is enough.
@functools.cache
def request_schema(api_key: int, version: int) -> Any:
    return kio_index.load_request_schema(api_key, version)


@functools.cache
def response_schema(api_key: int, version: int) -> Any:
    return kio_index.load_response_schema(api_key, version)


def ms(value: datetime.timedelta) -> float:
    return value.total_seconds()


ZERO: Final = datetime.timedelta(0)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The frame (size prefix, response header, body) answering ``correlation_id``."""
    header_type = type(response).__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_type)(buffer, header_type(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


class ByteBudget:
    """Bytes held by requests and answers in flight, over all connections, bounded.

    ``acquire`` waits until the bytes fit, first come first served, at most ``timeout``
    seconds (TimeoutError); a single reservation larger than the whole budget is let
    through alone, so nothing waits forever. Answers (``answer=True``) are served
    before request frames: an answer finishes work already admitted and then frees
    what it holds, a frame admits more, so while answers wait no new request is read
    and the bytes in flight cannot grow past the budget by the requests those answers
    are for.

    The rule that keeps the budget from deadlocking is the caller's: a connection
    holding bytes never waits for more (see :meth:`KafkaBroker._reserve_answer`), so
    every holder is handling, reading or writing, each bounded by its own timeout,
    and releases.
    """

    __slots__ = ("_answers", "_requests", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._answers: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._requests: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, count: int) -> bool:
        return self.used == 0 or self.used + count <= self.limit

    def try_acquire(self, count: int, *, answer: bool = False) -> bool:
        """Take ``count`` bytes if they fit now without passing anyone waiting before
        (every waiter, or only answers for an answer); False otherwise."""
        ahead = self._answers if answer else self._answers or self._requests
        if ahead or not self._fits(count):
            return False
        self.used += count
        return True

    async def acquire(self, count: int, timeout: float | None, *, answer: bool = False) -> None:
        """Take ``count`` bytes, waiting at most ``timeout`` seconds (TimeoutError)."""
        if self.try_acquire(count, answer=answer):
            return
        queue = self._answers if answer else self._requests
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, waiter)
        queue.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException:  # cancelled, or the timeout (itself a cancellation)
            if waiter.done() and not waiter.cancelled():
                self.release(count)  # granted, but nobody will use it
            else:
                # Still queued: leave. (``_grant`` drops the entries of waiters that
                # are done, so a waiter cancelled before it was served may be gone.)
                with contextlib.suppress(ValueError):
                    queue.remove(entry)
                self._grant()  # those behind it may fit now that it left the head
            raise

    def release(self, count: int) -> None:
        self.used -= count
        self._grant()

    def _grant(self) -> None:
        while True:
            queue = self._answers or self._requests
            if not queue:
                return
            count, waiter = queue[0]
            if waiter.done():  # cancelled: it removes nothing more itself
                queue.popleft()
                continue
            if not self._fits(count):
                return
            queue.popleft()
            self.used += count
            waiter.set_result(None)


@dataclasses.dataclass(slots=True)
class ConnectionState:
    """What a connection's handlers share: the client id, the budget it holds."""

    client_id: str = ""
    held: int = 0


_connection: contextvars.ContextVar[ConnectionState] = contextvars.ContextVar("connection")
"""The state of the connection whose task is running (each connection is a task)."""


class ClosingConnection(Exception):
    """What Kafka answers by closing the connection (a request it cannot parse)."""


Handler = Callable[[Any, int], Coroutine[Any, Any, Any]]


class KafkaBroker:
    """The wire front end: connections, request dispatch, and the API handlers."""

    def __init__(
        self,
        *,
        partitions: int = 3,
        replicas: int = 3,
        follower_delay: float = 0.0,
        limits: Limits | None = None,
        advertised_host: str = "127.0.0.1",
        initial_rebalance_delay: float = 3.0,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        self.limits = limits or Limits()
        if not 1 <= partitions <= self.limits.max_partitions:
            raise ValueError(
                f"partitions must be between 1 and {self.limits.max_partitions}, got {partitions!r}"
            )
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas!r}")
        if not follower_delay >= 0:
            raise ValueError(f"follower_delay must be >= 0 seconds, got {follower_delay!r}")
        self.default_partitions = partitions
        self.replicas = replicas
        self.follower_delay = follower_delay
        # Kafka's replication factor counts the leader: replicas - 1 followers per
        # partition, simulated in process; the HW is the lowest follower's log end.
        self.core: BrokerCore[StoredBatch] = BrokerCore(
            followers=replicas - 1,
            retain_bytes=self.limits.retain_bytes,
            retain_total_bytes=self.limits.retain_total_bytes,
            observer=observer,
        )
        self.budget = ByteBudget(self.limits.max_inflight_bytes)
        self.followers: set[asyncio.Task[None]] = set()
        # Kafka's GroupCoordinator: the join and heartbeat purgatories.
        self.groups = GroupCoordinator(
            initial_rebalance_delay=initial_rebalance_delay,
            max_groups=self.limits.max_groups,
            max_members=self.limits.max_members,
            max_offsets=self.limits.max_committed_offsets,
            max_metadata_bytes=self.limits.offset_metadata_max_bytes,
            offsets_retention=self.limits.offsets_retention_minutes * 60.0,
            observer=observer,
        )
        self.advertised_host = advertised_host
        self.advertised_port = 0
        self.producers: collections.OrderedDict[tuple[TopicPartition, int], ProducerState] = (
            collections.OrderedDict()
        )
        """Per (partition, producer id), least recently written first (the next to go)."""
        self.next_producer_id = FIRST_PRODUCER_ID
        self.connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.negotiated: dict[tuple[str, int, int], int] = {}
        """(client id, API key, version) to the number of requests: what each client
        chose from ApiVersions (bounded, client ids are the clients' to choose)."""
        self.handlers: dict[int, Handler] = {
            API_VERSIONS: self.api_versions,
            METADATA: self.metadata,
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            INIT_PRODUCER_ID: self.init_producer_id,
            FIND_COORDINATOR: self.find_coordinator,
            JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat,
            LEAVE_GROUP: self.leave_group,
            OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch,
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
        }
        self._server: asyncio.Server | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._connection, host, port)
        sockname = self._server.sockets[0].getsockname()
        self.advertised_port = sockname[1]
        return sockname[0], sockname[1]

    async def aclose(self) -> None:
        """Stop listening, answer nothing more: parked requests end with their connections."""
        if self._server is not None:
            self._server.close()
        # Closing the purgatories ends every parked fetch and produce (PurgatoryClosed),
        # closing the sockets ends every read: the handlers return on their own (a
        # cancelled one upsets asyncio's stream callback on Python 3.11).
        for task in self.followers:
            task.cancel()
        await asyncio.gather(*self.followers, return_exceptions=True)
        self.core.close()
        self.groups.close()
        for writer in self.connections.values():
            writer.close()
        tasks = list(self.connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    # -- connections --------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.connections) >= self.limits.max_connections:
            writer.close()
            return
        self.connections[task] = writer
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ap.PurgatoryClosed):
            pass
        except ClosingConnection as exc:
            log.info("closing a connection: %s", exc)
        finally:
            self.connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One request at a time per connection, as Kafka processes them: the answers
        # go back in request order, and a parked fetch holds only its own connection.
        state = ConnectionState()
        _connection.set(state)  # this connection's task has its own context
        try:
            while True:
                async with asyncio.timeout(self.limits.idle_seconds):
                    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
                if not 8 <= size <= self.limits.max_request_bytes:
                    raise ClosingConnection(f"frame size {size} outside [8, max request bytes]")
                await self.budget.acquire(size, self.limits.budget_wait_seconds)
                state.held += size
                async with asyncio.timeout(self.limits.idle_seconds):
                    frame = await reader.readexactly(size)
                response = await self._dispatch(frame)
                if response is not None:
                    writer.write(response)
                    # A client that stops reading cannot hold its answer's budget forever.
                    async with asyncio.timeout(self.limits.idle_seconds):
                        await writer.drain()
                del frame, response
                self.budget.release(state.held)
                state.held = 0
        finally:
            self.budget.release(state.held)
            state.held = 0

    async def _dispatch(self, frame: bytes) -> bytes | None:
        api_key, _ = read_int16(frame, 0)
        version, _ = read_int16(frame, 2)
        correlation_id, _ = read_int32(frame, 4)
        handler = self.handlers.get(api_key)
        if handler is None:
            raise ClosingConnection(f"API key {api_key} is not served")
        low, high = SERVED[api_key]
        if api_key == API_VERSIONS and version > high:
            # KIP-511: a client newer than the broker gets the error at version 0, with
            # the versions served, and retries with one of them.
            return encode_response(correlation_id, self._api_versions_response(0, True))
        if not low <= version <= high:
            raise ClosingConnection(f"API key {api_key} version {version} is not served")
        schema = request_schema(api_key, version)
        try:
            header, used = entity_reader(schema.__header_schema__)(frame, 0)
            request, _ = entity_reader(schema)(frame, used)
        except Exception as exc:  # kio raises several kinds on a malformed body
            raise ClosingConnection(f"malformed request (API {api_key} v{version}): {exc}") from exc
        self._count(header.client_id or "", api_key, version)
        _connection.get().client_id = (header.client_id or "")[:64]
        try:
            response = await handler(request, version)
        except (ClosingConnection, ap.PurgatoryClosed):
            raise
        except Exception as exc:
            # A bug must not take the connection (and the client's other requests) with
            # it, nor leave the request unanswered: Kafka answers UNKNOWN_SERVER_ERROR.
            # The group coordinator changes nothing until a request is validated, and
            # undoes a new member whose registration fails, so no group is left wedged.
            log.exception("API %d v%d failed", api_key, version)
            response = self._error_response(api_key, version, request)
            if response is None:
                raise ClosingConnection(f"API {api_key} v{version} failed: {exc!r}") from exc
        if response is None:
            return None
        return encode_response(correlation_id, response)

    def _error_response(self, api_key: int, version: int, request: Any) -> Any:
        """UNKNOWN_SERVER_ERROR answering ``request`` (the group APIs; None for others)."""
        error = ErrorCode.unknown_server_error
        cls = response_schema(api_key, version)
        mod = response_module(api_key, version)
        if api_key == JOIN_GROUP:
            return make(
                cls,
                throttle_time=ZERO,
                error_code=error,
                generation_id=-1,
                protocol_type=None,
                protocol_name="" if version < 7 else None,
                leader="",
                member_id=request.member_id,
                members=(),
            )
        if api_key in (SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, FIND_COORDINATOR):
            return make(
                cls,
                throttle_time=ZERO,
                error_code=error,
                error_message=None,
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
                members=(),
                node_id=-1,
                host="",
                port=-1,
            )
        if api_key == OFFSET_COMMIT:
            errors = {
                (topic.name, part.partition_index): error
                for topic in request.topics
                for part in topic.partitions
            }
            return self._offset_commit_response(version, request, errors)
        if api_key == OFFSET_FETCH:
            topics = () if request.topics is None else request.topics
            return make(
                cls,
                throttle_time=ZERO,
                error_code=error,
                topics=tuple(
                    make(
                        mod.OffsetFetchResponseTopic,
                        name=topic.name,
                        partitions=tuple(
                            make(
                                mod.OffsetFetchResponsePartition,
                                partition_index=index,
                                committed_offset=-1,
                                committed_leader_epoch=-1,
                                metadata="",
                                error_code=error,
                            )
                            for index in topic.partition_indexes
                        ),
                    )
                    for topic in topics
                ),
            )
        return None

    def _count(self, client_id: str, api_key: int, version: int) -> None:
        key = (client_id[:64], api_key, version)
        if key in self.negotiated or len(self.negotiated) < 1000:
            self.negotiated[key] = self.negotiated.get(key, 0) + 1

    # -- ApiVersions, Metadata ----------------------------------------------------------

    def _api_versions_response(self, version: int, unsupported: bool = False) -> Any:
        mod = response_module(API_VERSIONS, version)
        keys = tuple(
            make(mod.ApiVersion, api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(SERVED.items())
        )
        return make(
            response_schema(API_VERSIONS, version),
            error_code=ErrorCode.unsupported_version if unsupported else ErrorCode.none,
            api_keys=keys,
            throttle_time=ZERO,
        )

    async def api_versions(self, request: Any, version: int) -> Any:
        return self._api_versions_response(version)

    def _ensure_topic(self, name: str, create: bool) -> ErrorCode:
        if name in self.core.topics:
            return ErrorCode.none
        if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            return ErrorCode.invalid_topic_exception
        if not create or len(self.core.topics) >= self.limits.max_topics:
            return ErrorCode.unknown_topic_or_partition
        self.create_topic(name, self.default_partitions)
        return ErrorCode.none

    def create_topic(self, name: str, partitions: int) -> None:
        """Create the topic's partitions in the core and start their followers."""
        self.core.create_topic(name, partitions)
        for index in range(partitions):
            for replica in range(self.replicas - 1):
                task = asyncio.create_task(self._follow(TopicPartition(name, index), replica))
                self.followers.add(task)
                task.add_done_callback(self.followers.discard)

    def delete_topic(self, name: str) -> bool:
        """Delete the topic: waiting fetches and produces are answered, followers stop."""
        if not self.core.delete_topic(name):
            return False
        for key in [key for key in self.producers if key[0].topic == name]:
            del self.producers[key]
        return True

    async def _follow(self, tp: TopicPartition, replica: int) -> None:
        """A follower replica of ``tp``: fetches from the leader as Kafka's followers do,
        parked in the leader's own fetch purgatory, and reports its log end offset with
        each fetch (which moves the HW, which completes acks=all produces)."""
        offset = 0
        partition = self.core.partitions[tp]
        # Until the topic is deleted (a topic created again under its name has its own).
        while self.core.partitions.get(tp) is partition:
            op = self.core.fetch(
                {tp: offset}, min_bytes=1, max_wait=FOLLOWER_MAX_WAIT, replica=replica
            )
            fetched = (await op).get(tp, [])
            if fetched and self.follower_delay:
                await asyncio.sleep(self.follower_delay)  # a slow disk, a slow network
            offset += sum(batch.count for batch in fetched)

    async def metadata(self, request: Any, version: int) -> Any:
        mod = response_module(METADATA, version)
        if request.topics is None:
            names = list(self.core.topics)
        else:
            names = [topic.name for topic in request.topics]
        # Kafka creates a topic a client asks for, unless the client says not to (v4+).
        create = getattr(request, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            error = self._ensure_topic(name, create)
            count = self.core.topics.get(name, 0) if error is ErrorCode.none else 0
            partitions = tuple(
                make(
                    mod.MetadataResponsePartition,
                    error_code=ErrorCode.none,
                    partition_index=i,
                    leader_id=NODE_ID,
                    leader_epoch=LEADER_EPOCH,
                    replica_nodes=(NODE_ID,),
                    isr_nodes=(NODE_ID,),
                    offline_replicas=(),
                )
                for i in range(count)
            )
            topics.append(
                make(
                    mod.MetadataResponseTopic,
                    error_code=error,
                    name=name,
                    is_internal=False,
                    partitions=partitions,
                )
            )
        broker = make(
            mod.MetadataResponseBroker,
            node_id=NODE_ID,
            host=self.advertised_host,
            port=self.advertised_port,
            rack=None,
        )
        return make(
            response_schema(METADATA, version),
            throttle_time=ZERO,
            brokers=(broker,),
            cluster_id=CLUSTER_ID,
            controller_id=NODE_ID,
            topics=tuple(topics),
        )

    # -- Produce ------------------------------------------------------------------------

    def _sequence_error(
        self, tp: TopicPartition, batch: IncomingBatch, pending_last: int | None = None
    ) -> tuple[ErrorCode, int | None]:
        """Kafka's idempotence check: (error, base offset of the original if a retry).
        ``pending_last``: the producer's last sequence in earlier batches of this request."""
        if batch.producer_id < 0:
            return ErrorCode.none, None
        if not FIRST_PRODUCER_ID <= batch.producer_id < self.next_producer_id:
            # Never handed out: state kept for it would be a table any client could grow
            # (InitProducerId is bounded by max_producers, ids in batches were not).
            return ErrorCode.unknown_producer_id, None
        state = self.producers.get((tp, batch.producer_id))
        last = batch.base_sequence + batch.count - 1
        if pending_last is not None:
            if batch.base_sequence != (pending_last + 1) & 0x7FFFFFFF:
                return ErrorCode.out_of_order_sequence_number, None
            return ErrorCode.none, None
        if state is None:
            if batch.base_sequence != 0:
                # No state for a producer that has written before (forgotten beyond
                # max_producer_states): Kafka's answer for an expired producer state,
                # which the clients recover from by bumping their epoch.
                return ErrorCode.unknown_producer_id, None
            return ErrorCode.none, None
        if batch.producer_epoch > state.epoch:
            if batch.base_sequence != 0:
                return ErrorCode.out_of_order_sequence_number, None
            return ErrorCode.none, None
        if batch.producer_epoch < state.epoch:
            return ErrorCode.invalid_producer_epoch, None
        for first, end, base in state.recent:
            if (first, end) == (batch.base_sequence, last):
                return ErrorCode.none, base  # a retry of a batch already appended
        if batch.base_sequence != (state.last_sequence + 1) & 0x7FFFFFFF:
            return ErrorCode.out_of_order_sequence_number, None
        return ErrorCode.none, None

    def _remember_sequence(self, tp: TopicPartition, batch: IncomingBatch, base: int) -> None:
        if batch.producer_id < 0:
            return
        key = (tp, batch.producer_id)
        state = self.producers.get(key)
        if state is None or batch.producer_epoch != state.epoch:
            state = ProducerState(
                batch.producer_epoch, -1, collections.deque(maxlen=PRODUCER_SEQUENCES_KEPT)
            )
            self.producers[key] = state
        self.producers.move_to_end(key)
        while len(self.producers) > self.limits.max_producer_states:
            self.producers.popitem(last=False)  # the least recently written
        state.last_sequence = batch.base_sequence + batch.count - 1
        state.recent.append((batch.base_sequence, state.last_sequence, base))

    async def produce(self, request: Any, version: int) -> Any:
        acks = request.acks
        topics = request.topic_data
        # The whole request is checked before anything changes (Kafka's parser refuses a
        # null array before the request is handled): a request refused halfway must not
        # leave the sequences of batches it never appended, or the producer's retry of
        # such a batch would be acknowledged as a duplicate and never stored.
        if topics is None or any(topic.partition_data is None for topic in topics):
            raise ClosingConnection("produce request with a null array")
        listed = collections.Counter(
            TopicPartition(topic.name, data.index)
            for topic in topics
            for data in topic.partition_data
        )
        results: dict[TopicPartition, tuple[ErrorCode, int]] = {}
        plans: dict[TopicPartition, list[tuple[IncomingBatch, StoredBatch, int]]] = {}
        """Per partition, the batches to append: each as sent, as stored, its offset."""
        covers: dict[TopicPartition, int] = {}
        """The log end offset each partition's HW must reach for acks=all: past the
        batches appended, or past the originals of retried ones."""
        order: list[TopicPartition] = []
        for topic in topics:
            for data in topic.partition_data:
                tp = TopicPartition(topic.name, data.index)
                if tp in results:
                    continue  # answered once
                order.append(tp)
                if listed[tp] > 1:
                    results[tp] = (ErrorCode.invalid_request, -1)  # listed twice: neither taken
                elif acks in (0, 1, -1):
                    results[tp] = self._produce_partition(tp, data.records, plans, covers)
                else:
                    results[tp] = (ErrorCode.invalid_required_acks, -1)
        # Validated: append, then remember the sequences of exactly what was appended.
        appends = {tp: [stored for _, stored, _ in plan] for tp, plan in plans.items() if plan}
        if appends:
            self.core.append(appends)
        for tp, plan in plans.items():
            for batch, _, base in plan:
                self._remember_sequence(tp, batch, base)
        if acks == 0:
            return None
        if acks == -1 and covers:
            timeout = min(max(ms(request.timeout), 0.0), self.limits.max_wait_seconds)
            required = {self.core.partitions[tp]: end for tp, end in covers.items()}
            outcome = await self.core.acknowledge(required, timeout)
            for tp, error in outcome.items():
                if error:  # REQUEST_TIMED_OUT, or UNKNOWN_TOPIC_OR_PARTITION if deleted
                    results[tp] = (ErrorCode(int(error)), results[tp][1])
        return self._produce_response(version, order, results)

    def _produce_partition(
        self,
        tp: TopicPartition,
        records: bytes | None,
        plans: dict[TopicPartition, list[tuple[IncomingBatch, StoredBatch, int]]],
        covers: dict[TopicPartition, int],
    ) -> tuple[ErrorCode, int]:
        """Check the partition's batches and plan their append (the caller appends once
        the whole request is checked): (error, base offset)."""
        partition = self.core.partitions.get(tp)
        if partition is None:
            return ErrorCode.unknown_topic_or_partition, -1
        if self.core.over_retention():
            # Full, and nothing replicated enough to drop: the producer retries later.
            return ErrorCode.kafka_storage_error, -1
        try:
            batches = split_batches(records or b"")
        except BadBatch as exc:
            log.info("refusing a batch for %s: %s", tp, exc)
            return ErrorCode.corrupt_message, -1
        # Check every batch before changing anything: a refused batch leaves no trace.
        originals: list[int | None] = []
        expected: dict[int, int] = {}  # producer id -> last sequence, within this request
        for batch in batches:
            error, original = self._sequence_error(tp, batch, expected.get(batch.producer_id))
            if error is not ErrorCode.none:
                return error, -1
            originals.append(original)
            if batch.producer_id >= 0:
                expected[batch.producer_id] = batch.base_sequence + batch.count - 1
        plan: list[tuple[IncomingBatch, StoredBatch, int]] = []
        next_offset = partition.leo
        # The newest batch is never dropped: it carries the partition's running maximum.
        so_far = partition.entries[-1].timestamp_so_far if partition.entries else -1
        first_base: int | None = None
        end = 0
        for batch, original in zip(batches, originals, strict=True):
            if original is not None:
                # A retry: answered with the original's offset, appended nothing; its
                # acks=all still waits until the original is replicated.
                first_base = original if first_base is None else first_base
                end = max(end, original + batch.count)
                continue
            # Offsets are the broker's to assign: the producer sent 0.
            struct.pack_into(">q", batch.data, BATCH_BASE_OFFSET, next_offset)
            struct.pack_into(">i", batch.data, BATCH_LEADER_EPOCH, LEADER_EPOCH)
            so_far = max(so_far, batch.max_timestamp)
            stored = StoredBatch(bytes(batch.data), batch.count, batch.max_timestamp, so_far)
            plan.append((batch, stored, next_offset))
            first_base = next_offset if first_base is None else first_base
            next_offset += batch.count
            end = next_offset
        plans[tp] = plan
        covers[tp] = end
        assert first_base is not None
        return ErrorCode.none, first_base

    def _produce_response(
        self,
        version: int,
        order: Iterable[TopicPartition],
        results: Mapping[TopicPartition, tuple[ErrorCode, int]],
    ) -> Any:
        mod = response_module(PRODUCE, version)
        by_topic: dict[str, list[Any]] = {}
        for tp in order:
            error, base = results[tp]
            partition = self.core.partitions.get(tp)
            by_topic.setdefault(tp.topic, []).append(
                make(
                    mod.PartitionProduceResponse,
                    index=tp.partition,
                    error_code=error,
                    base_offset=base,
                    log_append_time=None,
                    log_start_offset=partition.log_start if partition else -1,
                    record_errors=(),
                    error_message=None,
                )
            )
        return make(
            response_schema(PRODUCE, version),
            responses=tuple(
                make(mod.TopicProduceResponse, name=name, partition_responses=tuple(parts))
                for name, parts in by_topic.items()
            ),
            throttle_time=ZERO,
        )

    # -- Fetch --------------------------------------------------------------------------

    async def fetch(self, request: Any, version: int) -> Any:
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, int] = {}
        limits: dict[TopicPartition, int] = {}
        order: list[TopicPartition] = []
        for topic in request.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                if tp in offsets or tp in errors:
                    continue
                order.append(tp)
                partition = self.core.partitions.get(tp)
                if partition is None:
                    errors[tp] = ErrorCode.unknown_topic_or_partition
                elif not partition.in_range(part.fetch_offset):
                    errors[tp] = ErrorCode.offset_out_of_range
                else:
                    offsets[tp] = part.fetch_offset
                    limits[tp] = max(part.partition_max_bytes, 0)
        read: dict[TopicPartition, list[StoredBatch]] = {}
        if offsets:
            max_wait = min(max(ms(request.max_wait), 0.0), self.limits.max_wait_seconds)
            max_bytes = min(
                getattr(request, "max_bytes", None) or self.limits.max_fetch_bytes,
                self.limits.max_fetch_bytes,
            )
            # An error answers the whole fetch at once (min_bytes 0), as Kafka does.
            op = self.core.fetch(
                offsets,
                min_bytes=0 if errors else max(request.min_bytes, 0),
                max_wait=max_wait,
                partition_max_bytes=limits,
                max_bytes=max(max_bytes, 0),
            )
            read = await op
            # The answer's bytes count against the in-flight budget until it is sent.
            await self._reserve_answer(
                sum(batch.size for batches in read.values() for batch in batches)
            )
        return self._fetch_response(version, order, errors, offsets, read)

    async def _reserve_answer(self, size: int) -> None:
        """Hold ``size`` bytes of the in-flight budget for this connection's answer.

        The connection holds its request's frame already, and must never wait for more
        while it does: four fetches each holding a quarter of the budget, each waiting
        for a few bytes more, would wait for one another forever, and with them every
        connection queued behind. So the answer is charged first against what the
        request holds (a 16 MiB request padded with empty topics pays for its own small
        answer); what goes beyond is taken at once if it fits. Otherwise the connection
        gives back everything it holds and then waits, among the answers, which go
        before new requests, for its whole answer: a connection that waits holds
        nothing, so no waiter blocks another's release, and the wait is bounded
        (``budget_wait_seconds``, then the connection is closed).
        """
        state = _connection.get()
        if size <= state.held or self.budget.try_acquire(size - state.held, answer=True):
            state.held = max(state.held, size)
            return
        self.budget.release(state.held)
        state.held = 0
        await self.budget.acquire(size, self.limits.budget_wait_seconds, answer=True)
        state.held = size

    def _fetch_response(
        self,
        version: int,
        order: Iterable[TopicPartition],
        errors: Mapping[TopicPartition, ErrorCode],
        offsets: Mapping[TopicPartition, int],
        read: Mapping[TopicPartition, list[StoredBatch]],
    ) -> Any:
        mod = response_module(FETCH, version)
        by_topic: dict[str, list[Any]] = {}
        for tp in order:
            partition = self.core.partitions.get(tp)
            error = errors.get(tp, ErrorCode.none)
            if error is ErrorCode.none and (
                partition is None or not partition.in_range(offsets[tp])
            ):
                # Deleted, or passed by retention, while the fetch waited.
                error = (
                    ErrorCode.unknown_topic_or_partition
                    if partition is None
                    else ErrorCode.offset_out_of_range
                )
            batches = read.get(tp, []) if error is ErrorCode.none else []
            by_topic.setdefault(tp.topic, []).append(
                make(
                    mod.PartitionData,
                    partition_index=tp.partition,
                    error_code=error,
                    high_watermark=partition.hw if partition else -1,
                    last_stable_offset=partition.hw if partition else -1,
                    log_start_offset=partition.log_start if partition else -1,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=b"".join(batch.data for batch in batches),
                )
            )
        return make(
            response_schema(FETCH, version),
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            session_id=0,  # fetch sessions declined (KIP-227): every fetch is a full one
            responses=tuple(
                make(mod.FetchableTopicResponse, topic=name, partitions=tuple(parts))
                for name, parts in by_topic.items()
            ),
        )

    # -- ListOffsets, InitProducerId ----------------------------------------------------

    @staticmethod
    def _offset_for(partition: Partition[StoredBatch], timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) answering a ListOffsets query on ``partition``.

        By timestamp, as Kafka answers it: the first batch (up to the high watermark)
        whose max timestamp is at or after the one asked for, and that timestamp; by
        bisection over the batches' running maximum, so a long log costs no more than a
        short one. (Kafka then walks that batch to its first record at or after the
        time; a batch stays opaque here, so the answer is the batch's base offset.) A
        batch dropped by retention that was stamped later than those after it still
        counts in their running maximum: the answer may then be an earlier offset than
        a scan would give, never a later one (a consumer re-reads, it skips nothing).
        """
        if timestamp == EARLIEST_TIMESTAMP:
            return -1, partition.log_start
        if timestamp == LATEST_TIMESTAMP or timestamp < 0:
            return -1, partition.hw
        found = partition.first_at_least(timestamp, key=_timestamp_so_far)
        if found is None or found[0] >= partition.hw:
            return -1, -1
        offset, batch = found
        return batch.max_timestamp, offset

    async def list_offsets(self, request: Any, version: int) -> Any:
        topics = request.topics
        if topics is None or any(topic.partitions is None for topic in topics):
            raise ClosingConnection("list offsets request with a null array")
        # A partition named more than once is refused each time, as Kafka does: one
        # request cannot make the broker look the same log up a thousand times.
        named = collections.Counter(
            (topic.name, part.partition_index) for topic in topics for part in topic.partitions
        )
        mod = response_module(LIST_OFFSETS, version)
        answers = []
        for topic in topics:
            parts = []
            for part in topic.partitions:
                partition = self.core.partitions.get(
                    TopicPartition(topic.name, part.partition_index)
                )
                if named[topic.name, part.partition_index] > 1:
                    error, found = ErrorCode.invalid_request, (-1, -1)
                elif partition is None:
                    error, found = ErrorCode.unknown_topic_or_partition, (-1, -1)
                else:
                    error, found = ErrorCode.none, self._offset_for(partition, part.timestamp)
                parts.append(
                    make(
                        mod.ListOffsetsPartitionResponse,
                        partition_index=part.partition_index,
                        error_code=error,
                        timestamp=found[0],
                        offset=found[1],
                        leader_epoch=LEADER_EPOCH,
                    )
                )
            answers.append(
                make(mod.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts))
            )
        return make(
            response_schema(LIST_OFFSETS, version), throttle_time=ZERO, topics=tuple(answers)
        )

    async def init_producer_id(self, request: Any, version: int) -> Any:
        cls = response_schema(INIT_PRODUCER_ID, version)
        if request.transactional_id is not None:
            # Transactions are not served: Kafka's answer to a broker without them.
            return make(
                cls,
                throttle_time=ZERO,
                error_code=ErrorCode.transactional_id_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        previous = getattr(request, "producer_id", -1)
        if FIRST_PRODUCER_ID <= previous < self.next_producer_id:
            # KIP-360: a producer bumping its own epoch keeps its id (an id never handed
            # out gets a new one, as any first InitProducerId).
            epoch = (getattr(request, "producer_epoch", -1) + 1) & 0x7FFF
            return make(
                cls,
                throttle_time=ZERO,
                error_code=ErrorCode.none,
                producer_id=previous,
                producer_epoch=epoch,
            )
        if self.next_producer_id - FIRST_PRODUCER_ID >= self.limits.max_producers:
            return make(
                cls,
                throttle_time=ZERO,
                error_code=ErrorCode.coordinator_not_available,
                producer_id=-1,
                producer_epoch=-1,
            )
        producer_id = self.next_producer_id
        self.next_producer_id += 1
        return make(
            cls,
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=0,
        )

    # -- groups: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup ------------

    async def find_coordinator(self, request: Any, version: int) -> Any:
        group = getattr(request, "key_type", 0) == 0  # 1: a transaction coordinator
        return make(
            response_schema(FIND_COORDINATOR, version),
            throttle_time=ZERO,
            error_code=ErrorCode.none if group else ErrorCode.coordinator_not_available,
            error_message=None,
            node_id=NODE_ID if group else -1,
            host=self.advertised_host if group else "",
            port=self.advertised_port if group else -1,
        )

    async def join_group(self, request: Any, version: int) -> Any:
        session = ms(request.session_timeout)
        rebalance = getattr(request, "rebalance_timeout", None)
        result = await self.groups.join(
            request.group_id,
            request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            client_id=_connection.get().client_id,
            session_timeout=session,
            # v0 has no rebalance timeout: Kafka used the session timeout. A negative one
            # is refused by the coordinator, a long one capped there.
            rebalance_timeout=ms(rebalance) if rebalance is not None else session,
            protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
        )
        mod = response_module(JOIN_GROUP, version)
        return make(
            response_schema(JOIN_GROUP, version),
            throttle_time=ZERO,
            error_code=ErrorCode(result.error),
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name or ("" if version < 7 else None),
            leader=result.leader,
            member_id=result.member_id,
            members=tuple(
                make(
                    mod.JoinGroupResponseMember,
                    member_id=member_id,
                    group_instance_id=instance,
                    metadata=metadata,
                )
                for member_id, instance, metadata in result.members
            ),
        )

    async def sync_group(self, request: Any, version: int) -> Any:
        result = await self.groups.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            {a.member_id: a.assignment for a in request.assignments},
        )
        return make(
            response_schema(SYNC_GROUP, version),
            throttle_time=ZERO,
            error_code=ErrorCode(result.error),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def heartbeat(self, request: Any, version: int) -> Any:
        error = self.groups.heartbeat(request.group_id, request.generation_id, request.member_id)
        return make(
            response_schema(HEARTBEAT, version),
            throttle_time=ZERO,
            error_code=ErrorCode(error),
        )

    async def leave_group(self, request: Any, version: int) -> Any:
        cls = response_schema(LEAVE_GROUP, version)
        if version < 3:
            ((_, error),) = self.groups.leave(request.group_id, [request.member_id])
            return make(cls, throttle_time=ZERO, error_code=ErrorCode(error))
        members = [(m.member_id, m.group_instance_id) for m in request.members]
        results = self.groups.leave(request.group_id, [member_id for member_id, _ in members])
        mod = response_module(LEAVE_GROUP, version)
        return make(
            cls,
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            members=tuple(
                make(
                    mod.MemberResponse,
                    member_id=member_id,
                    group_instance_id=instance,
                    error_code=ErrorCode(error),
                )
                for (member_id, instance), (_, error) in zip(members, results, strict=True)
            ),
        )

    # -- OffsetCommit, OffsetFetch ------------------------------------------------------

    async def offset_commit(self, request: Any, version: int) -> Any:
        # Each partition is checked first, as Kafka does: offsets are kept only for
        # partitions that exist, with bounded metadata, so a client cannot make the
        # coordinator hold names and strings of its choosing.
        errors: dict[tuple[str, int], ErrorCode] = {}
        offsets: dict[tuple[str, int], tuple[int, str]] = {}
        for topic in request.topics:
            for part in topic.partitions:
                key = (topic.name, part.partition_index)
                metadata = part.committed_metadata or ""
                # A partition listed twice: its last entry counts, as in a dict.
                offsets.pop(key, None)
                errors.pop(key, None)
                if TopicPartition(*key) not in self.core.partitions:
                    errors[key] = ErrorCode.unknown_topic_or_partition
                elif len(metadata) > self.limits.offset_metadata_max_bytes:
                    errors[key] = ErrorCode.offset_metadata_too_large
                else:
                    offsets[key] = (part.committed_offset, metadata)
        if offsets or not errors:
            error = ErrorCode(
                self.groups.commit(
                    request.group_id,
                    getattr(request, "generation_id_or_member_epoch", -1),
                    request.member_id,
                    offsets,
                )
            )
            for key in offsets:
                errors.setdefault(key, error)
        return self._offset_commit_response(version, request, errors)

    @staticmethod
    def _offset_commit_response(
        version: int, request: Any, errors: Mapping[tuple[str, int], ErrorCode]
    ) -> Any:
        """Each partition of the request with its error (in the request's order)."""
        mod = response_module(OFFSET_COMMIT, version)
        return make(
            response_schema(OFFSET_COMMIT, version),
            throttle_time=ZERO,
            topics=tuple(
                make(
                    mod.OffsetCommitResponseTopic,
                    name=topic.name,
                    partitions=tuple(
                        make(
                            mod.OffsetCommitResponsePartition,
                            partition_index=part.partition_index,
                            error_code=errors[(topic.name, part.partition_index)],
                        )
                        for part in topic.partitions
                    ),
                )
                for topic in request.topics
            ),
        )

    async def offset_fetch(self, request: Any, version: int) -> Any:
        wanted = None
        if request.topics is not None:
            wanted = [(t.name, i) for t in request.topics for i in t.partition_indexes]
        committed = self.groups.committed(request.group_id, wanted)
        by_topic: dict[str, list[tuple[int, tuple[int, str]]]] = {}
        for (name, index), stored in committed.items():
            by_topic.setdefault(name, []).append((index, stored))
        mod = response_module(OFFSET_FETCH, version)
        return make(
            response_schema(OFFSET_FETCH, version),
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            topics=tuple(
                make(
                    mod.OffsetFetchResponseTopic,
                    name=name,
                    partitions=tuple(
                        make(
                            mod.OffsetFetchResponsePartition,
                            partition_index=index,
                            committed_offset=offset,
                            committed_leader_epoch=-1,
                            metadata=metadata,
                            error_code=ErrorCode.none,
                        )
                        for index, (offset, metadata) in parts
                    ),
                )
                for name, parts in by_topic.items()
            ),
        )

    # -- CreateTopics, DeleteTopics -----------------------------------------------------

    def _create_error(self, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None]:
        name = topic.name
        partitions = self.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            return ErrorCode.invalid_topic_exception, f"invalid topic name {name!r}"
        if name in self.core.topics:
            return ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        if not 1 <= partitions <= self.limits.max_partitions:
            message = f"partitions must be between 1 and {self.limits.max_partitions}"
            return ErrorCode.invalid_partitions, message
        if topic.replication_factor not in (-1, self.replicas) or topic.assignments:
            # Every partition has the broker's --replicas replicas, on this node.
            message = f"the replication factor is {self.replicas} (--replicas)"
            return ErrorCode.invalid_replication_factor, message
        if len(self.core.topics) >= self.limits.max_topics:
            return ErrorCode.policy_violation, f"at most {self.limits.max_topics} topics"
        if not validate_only:
            self.create_topic(name, partitions)
        return ErrorCode.none, None

    async def create_topics(self, request: Any, version: int) -> Any:
        mod = response_module(CREATE_TOPICS, version)
        results = []
        for topic in request.topics:
            error, message = self._create_error(topic, request.validate_only)
            ok = error is ErrorCode.none
            results.append(
                make(
                    mod.CreatableTopicResult,
                    name=topic.name,
                    error_code=error,
                    error_message=message,
                    num_partitions=self.core.topics.get(topic.name, -1) if ok else -1,
                    replication_factor=self.replicas if ok else -1,
                    configs=(),
                )
            )
        return make(
            response_schema(CREATE_TOPICS, version), throttle_time=ZERO, topics=tuple(results)
        )

    async def delete_topics(self, request: Any, version: int) -> Any:
        mod = response_module(DELETE_TOPICS, version)
        results = []
        for name in request.topic_names:
            deleted = self.delete_topic(name)
            results.append(
                make(
                    mod.DeletableTopicResult,
                    name=name,
                    error_code=ErrorCode.none if deleted else ErrorCode.unknown_topic_or_partition,
                    error_message=None,
                )
            )
        return make(
            response_schema(DELETE_TOPICS, version),
            throttle_time=ZERO,
            responses=tuple(results),
        )


class BrokerThread:
    """The broker on its own event loop in a background thread, for tests: blocking
    clients (kafka-python, confluent-kafka) and asyncio ones alike can use it.

    ``with BrokerThread() as address:`` starts it on a free loopback port and gives
    ``"127.0.0.1:PORT"``; leaving the block stops it. Keyword arguments go to
    :class:`KafkaBroker` (``partitions``, ``replicas``, ``initial_rebalance_delay``...).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.host = host
        self.port = port
        self.options = options
        self.broker: KafkaBroker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._address = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kafka-broker", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the broker did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self._address

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the thread that waits in __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        options = {"advertised_host": self.host, **self.options}
        broker = self.broker = KafkaBroker(**options)
        host, port = await broker.start(self.host, self.port)
        self._address = f"{host}:{port}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await broker.aclose()


async def serve(args: argparse.Namespace, limits: Limits) -> None:
    observer: Any = None
    recorder: Any = None
    if args.trace is not None:
        from aiopurgatory.trace import TraceRecorder

        recorder = TraceRecorder(args.trace, clock=asyncio.get_running_loop().time)
        observer = recorder
    broker = KafkaBroker(
        partitions=args.partitions,
        replicas=args.replicas,
        follower_delay=args.follower_delay_ms / 1000,
        limits=limits,
        advertised_host=args.advertised_host or args.host,
        initial_rebalance_delay=args.group_initial_rebalance_delay_ms / 1000,
        observer=observer,
    )
    host, port = await broker.start(args.host, args.port)
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await broker.aclose()
        if recorder is not None:
            recorder.close()
        for (client, api_key, version), count in sorted(broker.negotiated.items()):
            print(f"negotiated: client={client!r} api={api_key} version={version} requests={count}")
        for line in purgatory_summary(broker):
            print(line)
        sys.stdout.flush()


def purgatory_summary(broker: KafkaBroker) -> list[str]:
    """One line per purgatory: how its delayed operations ended (``closed``: still
    parked when the broker stopped) and how late its timer ever ran."""
    purgatories = (
        broker.core.produce_purgatory,
        broker.core.fetch_purgatory,
        broker.groups.join_purgatory,
        broker.groups.heartbeat_purgatory,
    )
    lines = []
    for purgatory in purgatories:
        stats = purgatory.stats
        lines.append(
            f"purgatory: {stats.name} completed={stats.completed} expired={stats.expired} "
            f"cancelled={stats.cancelled} closed={stats.closed} "
            f"timer_lag_max_ms={stats.timer_lag_max * 1e3:.1f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="A Kafka-protocol broker on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9092, help="0 picks a free port")
    parser.add_argument(
        "--advertised-host", help="the host clients are told to connect to (default --host)"
    )
    parser.add_argument("--partitions", type=int, default=3, help="of an auto-created topic")
    parser.add_argument(
        "--replicas",
        type=int,
        default=3,
        help="replicas per partition, the leader included (followers simulated in process)",
    )
    parser.add_argument(
        "--follower-delay-ms",
        type=int,
        default=0,
        help="each follower waits this long after a fetch that brought data",
    )
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=3000,
        help="an empty group's first rebalance waits this long for more members (Kafka's 3000)",
    )
    defaults = Limits()
    for field in dataclasses.fields(Limits):
        default = getattr(defaults, field.name)
        option = "--" + field.name.replace("_", "-")
        described = LIMIT_HELP.get(field.name)
        text = f"{described} (default {default})" if described else f"default {default}"
        parser.add_argument(option, type=type(default), default=default, help=text)
    parser.add_argument("--trace", metavar="DIR", help="record every delayed operation here")
    args = parser.parse_args()
    try:
        limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    except ValueError as exc:
        parser.error(str(exc))
    if not 1 <= args.replicas <= MAX_REPLICAS:
        parser.error(f"--replicas must be between 1 and {MAX_REPLICAS}")
    if args.follower_delay_ms < 0:
        parser.error("--follower-delay-ms must be >= 0")
    if args.group_initial_rebalance_delay_ms < 0:
        parser.error("--group-initial-rebalance-delay-ms must be >= 0")
    if not 1 <= args.partitions <= limits.max_partitions:
        parser.error(f"--partitions must be between 1 and {limits.max_partitions}")
    if args.advertised_host is None and args.host in ("", "0.0.0.0", "::"):
        parser.error(
            "listening on every interface: say which host clients reach, --advertised-host"
        )
    logging.basicConfig(level=logging.WARNING)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args, limits))
    else:
        uvloop.run(serve(args, limits))


if __name__ == "__main__":
    main()
