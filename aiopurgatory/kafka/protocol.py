"""The Kafka wire protocol through kio: API keys, the versions served, decoding requests
and encoding responses of any served version, and encoding requests for the code that
plays a client over a raw socket (the tests' hostile peers, the benchmarks' idle ones).

Ground rules: this is the only module that knows how kio names and loads schemas; it
holds no state (schemas are cached once loaded). kio is generated from Kafka's own
message schemas, so a response built here is what Kafka would send, field for field.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import io
import struct
import uuid
from collections.abc import Callable, Container, Coroutine, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar

from kio import index as kio_index
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_writer
from kio.serial.readers import (
    read_boolean,
    read_compact_array_length,
    read_compact_string,
    read_compact_string_nullable,
    read_unsigned_varint,
)
from kio.static.constants import EntityType
from kio.static.primitive import i32

from . import configs
from .log import TopicPartition

__all__ = [
    "CLUSTER_ID",
    "CONSUMER_GROUP_APIS",
    "DUPLICATE_TOPIC",
    "GROUP_APIS",
    "LEADER_EPOCH",
    "NODE_ID",
    "NO_TOPIC_ID",
    "OFFSETS_TOPIC",
    "OFFSETS_TOPIC_ID",
    "OFFSETS_TOPIC_PARTITIONS",
    "SERVED",
    "TXN_APIS",
    "ZERO",
    "Encoded",
    "Handler",
    "LruCache",
    "api_key_named",
    "api_name",
    "encode_body",
    "encode_request",
    "encode_response",
    "make",
    "metadata_response",
    "ms",
    "read_metadata_request",
    "request_schema",
    "response_module",
    "response_schema",
]

NODE_ID: Final = 0
CLUSTER_ID: Final = "aiopurgatory-kafka-broker"
DUPLICATE_TOPIC: Final = "Duplicate topic name."
"""Kafka's message for a topic listed twice in CreateTopics, DeleteTopics or
CreatePartitions (its controller answers it once, INVALID_REQUEST)."""
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
ADD_PARTITIONS_TO_TXN: Final = 24
ADD_OFFSETS_TO_TXN: Final = 25
END_TXN: Final = 26
TXN_OFFSET_COMMIT: Final = 28
GROUP_APIS: Final = (
    FIND_COORDINATOR,
    JOIN_GROUP,
    SYNC_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
)
"""The group APIs (:mod:`.group_api`): here, below every module that asks whether a
key is one (the faults' rules, the error answers, the dispatch)."""
CONSUMER_GROUP_HEARTBEAT: Final = 68
CONSUMER_GROUP_DESCRIBE: Final = 69
CONSUMER_GROUP_APIS: Final = (CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE)
"""The consumer group protocol's APIs (KIP-848, :mod:`.consumer_group_api`)."""
TXN_APIS: Final = (ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT)
"""The transaction APIs (:mod:`.txn_api`; InitProducerId with a transactional id too)."""
# The admin APIs (:mod:`.admin_api`).
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
DELETE_RECORDS: Final = 21
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
CREATE_PARTITIONS: Final = 37
DELETE_GROUPS: Final = 42
INCREMENTAL_ALTER_CONFIGS: Final = 44
OFFSET_DELETE: Final = 47
DESCRIBE_CLUSTER: Final = 60
# Leader epochs (:mod:`.epoch_api`): clients validate their positions after a leader
# change with it.
OFFSET_FOR_LEADER_EPOCH: Final = 23
# SASL (:mod:`.sasl_api`): listed on every listener, as Kafka lists them; a listener
# without SASL answers them ILLEGAL_SASL_STATE.
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
SERVED: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 8),
    FETCH: (4, 11),
    LIST_OFFSETS: (1, 5),
    # Metadata v9 (flexible, nothing else new): librdkafka trusts the leader epochs of a
    # broker serving it, and only then validates its fetch position after a leader
    # change (KIP-320: Fetch's current_leader_epoch, OffsetForLeaderEpoch). v10 adds the
    # topic ids, which KIP-848's assignments name topics by; v12 lets a client ask for
    # a topic by its id (librdkafka does for an assigned topic it does not know).
    METADATA: (1, 12),
    # OffsetCommit v9 and OffsetFetch v9 carry a consumer group member's epoch (KIP-848:
    # STALE_MEMBER_EPOCH); OffsetFetch v8 batches groups.
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    # KIP-848's consumer group protocol: v1 has the client draw its member id.
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 7),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 4),
    SYNC_GROUP: (0, 5),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 6),
    DELETE_TOPICS: (1, 5),
    INIT_PRODUCER_ID: (0, 4),
    # Transactions up to the versions before KIP-890's (transactions v2: the epoch
    # bumped at every commit, the broker adding partitions itself); v4 of
    # AddPartitionsToTxn is between brokers.
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    TXN_OFFSET_COMMIT: (0, 3),
    # Up to the versions before KIP-848's (DescribeGroups v6's GROUP_ID_NOT_FOUND) and
    # KIP-966's fenced brokers (DescribeCluster v2); DescribeConfigs from kio's oldest.
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 5),
    DELETE_RECORDS: (0, 2),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    DELETE_GROUPS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    OFFSET_DELETE: (0, 0),
    DESCRIBE_CLUSTER: (0, 1),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
}

OFFSETS_TOPIC: Final = "__consumer_offsets"
"""Kafka's internal topic of committed offsets: listed in Metadata (internal), not
writable by clients; the offsets themselves live in the group coordinator."""
OFFSETS_TOPIC_PARTITIONS: Final = configs.OFFSETS_TOPIC_PARTITIONS
NO_TOPIC_ID: Final = uuid.UUID(int=0)
"""Kafka's ``Uuid.ZERO_UUID``: the id Metadata gives a topic that does not exist."""
OFFSETS_TOPIC_ID: Final = uuid.UUID("0ff5e75c-0000-4000-8000-00000000000f")
"""``__consumer_offsets``' id, the same for the broker's life (Kafka draws one when it
creates the topic; nothing here depends on its value)."""


Handler = Callable[[Any, int], Coroutine[Any, Any, Any]]
"""An API's handler: (decoded request, version) to the response (None: no answer)."""


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(cls))


def make(cls: Any, **values: object) -> Any:
    """``cls(**values)`` without the fields this version of the schema lacks."""
    names = _field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


def _skip_tagged_fields(frame: bytes, offset: int) -> int:
    """The offset past the tagged fields at ``offset``, each skipped (KIP-482: a reader
    ignores the tags it does not know; no Metadata request has one it knows)."""
    count, used = read_unsigned_varint(frame, offset)
    offset += used
    for _ in range(count):
        _, used = read_unsigned_varint(frame, offset)  # the tag
        offset += used
        size, used = read_unsigned_varint(frame, offset)
        offset += used + size
    if offset > len(frame):
        raise ValueError("a tagged field runs past the end of the request")
    return offset


def read_metadata_request(frame: bytes, offset: int, version: int) -> Any:
    """A flexible (v9+) MetadataRequest from ``frame`` at ``offset``, read as Kafka reads
    it: unknown tagged fields skipped, bytes after the body ignored. kio refuses both,
    and librdkafka (2.x) asks for every topic with them: it leaves a 4-byte placeholder
    where the null array's one byte belongs, so Kafka reads its zeros as the flags (and
    the tagged fields' count) and what follows as bytes it ignores or a tagged field it
    skips, which means what librdkafka meant.

    From v10 each topic is a topic id (16 bytes) before its name, which may be null
    from v12 (a topic asked by id); v11 dropped the cluster's authorized operations
    flag, so two flags follow the topics from then.

    Returns:
        The request, and the offset past it.

    Raises:
        ValueError: The request is cut short (and what kio's readers raise).
    """
    mod = kio_index.load_payload_module(METADATA, version, EntityType.request)
    count, used = read_compact_array_length(frame, offset)
    offset += used
    topics = None
    if count is not None:
        listed = []
        for _ in range(count):
            topic_id = None
            if version >= 10:
                if offset + 16 > len(frame):
                    raise ValueError("a topic id runs past the end of the request")
                topic_id = uuid.UUID(bytes=bytes(frame[offset : offset + 16]))
                offset += 16
                name, used = read_compact_string_nullable(frame, offset)
            else:
                name, used = read_compact_string(frame, offset)
            offset = _skip_tagged_fields(frame, offset + used)
            if version >= 10:
                listed.append(mod.MetadataRequestTopic(topic_id=topic_id, name=name))
            else:
                listed.append(mod.MetadataRequestTopic(name=name))
        topics = tuple(listed)
    flags = []
    for _ in range(3 if version < 11 else 2):
        flag, used = read_boolean(frame, offset)
        offset += used
        flags.append(flag)
    offset = _skip_tagged_fields(frame, offset)
    if version < 11:
        request = mod.MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=flags[0],
            include_cluster_authorized_operations=flags[1],
            include_topic_authorized_operations=flags[2],
        )
    else:
        request = mod.MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=flags[0],
            include_topic_authorized_operations=flags[1],
        )
    return request, offset


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


@functools.cache
def _api_keys_by_name() -> dict[str, int]:
    return {name.replace("_", ""): key for key, name in api_key_map.items()}


def api_key_named(name: str) -> int | None:
    """The key of the API Kafka calls ``name``, None if none: in any case, with or
    without underscores ("FindCoordinator", "find_coordinator", "FIND_COORDINATOR"), so
    a test may name an API as its client's documentation spells it."""
    return _api_keys_by_name().get(name.replace("_", "").lower())


def api_name(api_key: int) -> str:
    """Kafka's name of the API ``api_key`` ("FindCoordinator"), for messages; "API 99"
    for a key Kafka does not define."""
    name = api_key_map.get(api_key)
    if name is None:
        return f"API {api_key}"
    return "".join(word.capitalize() for word in name.split("_"))


def checked_offsets(
    request: Any, partitions: Container[TopicPartition], max_metadata: int
) -> tuple[dict[tuple[str, int], tuple[int, str]], dict[tuple[str, int], ErrorCode]]:
    """The offsets an offset commit (OffsetCommit's or TxnOffsetCommit's) may keep, and
    the errors of the others, keyed by (topic name, partition index).

    Each partition is checked before anything is kept, as Kafka does: only partitions
    that exist, with metadata up to ``max_metadata`` characters, so a client cannot make
    the coordinator hold names and strings of its choosing. A partition listed twice:
    its last entry counts, as in a dict.
    """
    errors: dict[tuple[str, int], ErrorCode] = {}
    offsets: dict[tuple[str, int], tuple[int, str]] = {}
    for topic in request.topics:
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            metadata = part.committed_metadata or ""
            offsets.pop(key, None)
            errors.pop(key, None)
            if TopicPartition(*key) not in partitions:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif len(metadata) > max_metadata:
                errors[key] = ErrorCode.offset_metadata_too_large
            else:
                offsets[key] = (part.committed_offset, metadata)
    return offsets, errors


def offset_commit_response(
    api_key: int, version: int, request: Any, errors: Mapping[tuple[str, int], ErrorCode]
) -> Any:
    """The answer to an offset commit, OffsetCommit's or TxnOffsetCommit's (one shape):
    each partition of ``request``, in its order, with its error from ``errors``, keyed by
    (topic name, partition index)."""
    mod = response_module(api_key, version)
    prefix = "OffsetCommit" if api_key == OFFSET_COMMIT else "TxnOffsetCommit"
    topic_cls = getattr(mod, f"{prefix}ResponseTopic")
    partition_cls = getattr(mod, f"{prefix}ResponsePartition")
    return make(
        response_schema(api_key, version),
        throttle_time=ZERO,
        topics=tuple(
            make(
                topic_cls,
                name=topic.name,
                partitions=tuple(
                    make(
                        partition_cls,
                        partition_index=part.partition_index,
                        error_code=errors[(topic.name, part.partition_index)],
                    )
                    for part in topic.partitions
                ),
            )
            for topic in request.topics
        ),
    )


def metadata_response(
    version: int,
    brokers: Iterable[tuple[int, str, int]],
    topics: Iterable[tuple[ErrorCode, str | None, bool, tuple[Any, ...], uuid.UUID]],
) -> Any:
    """Metadata's answer: the brokers, (node id, host, port), the first of them the
    controller (-1 with none), and each topic's (error, name, internal, partitions,
    topic id), its partitions built from :func:`response_module` of the same version
    (the id is listed from v10: :data:`NO_TOPIC_ID` for a topic that has none)."""
    mod = response_module(METADATA, version)
    listed = tuple(
        make(mod.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
        for node, host, port in brokers
    )
    return make(
        response_schema(METADATA, version),
        throttle_time=ZERO,
        brokers=listed,
        cluster_id=CLUSTER_ID,
        controller_id=listed[0].node_id if listed else -1,
        topics=tuple(
            make(
                mod.MetadataResponseTopic,
                error_code=error,
                name=name,
                topic_id=topic_id,
                is_internal=internal,
                partitions=partitions,
            )
            for error, name, internal, partitions, topic_id in topics
        ),
    )


K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``limit`` entries; beyond it the least recently used one goes.

    For what a pure function of its key gives (a frame's decoding, an answer's
    encoding): an entry cannot be stale, only evicted.
    """

    __slots__ = ("_items", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit!r}")
        self.limit = limit
        self._items: collections.OrderedDict[K, V] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        if self.limit == 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.limit:
            self._items.popitem(last=False)


def ms(value: datetime.timedelta) -> float:
    return value.total_seconds()


ZERO: Final = datetime.timedelta(0)


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """A response body kio has encoded already (:func:`encode_body`): a handler may
    return it instead of the entity, to answer with the same bytes many times."""

    header: type
    """The response's header schema (the entity's ``__header_schema__``)."""
    body: bytes


def encode_body(response: Any) -> Encoded:
    """``response`` (a kio response entity) encoded by kio, without its header."""
    buffer = io.BytesIO()
    entity_writer(type(response))(buffer, response)
    return Encoded(type(response).__header_schema__, buffer.getvalue())


@functools.cache
def _header_tail(header_type: type) -> bytes:
    """What follows the correlation id in ``header_type``'s encoding, encoded by kio once
    (nothing in v0, the empty tagged fields in v1): every response header starts with
    the correlation id, the only field that varies."""
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header_type(correlation_id=0))
    encoded = buffer.getvalue()
    if encoded[:4] != bytes(4):
        raise AssertionError(f"{header_type.__name__} does not start with the correlation id")
    return encoded[4:]


_SIZE_AND_ID: Final = struct.Struct(">ii")


def encode_request(
    request: Any, correlation_id: int, client_id: str, header_type: type | None = None
) -> bytes:
    """The frame (size prefix, request header, body) a client sends for ``request`` (a
    kio request entity). ``header_type``: by default the header the request's schema
    names (v1, or v2 for a flexible version); a test may force another.

    The broker never sends a request: this is here so that the one encoder of request
    frames sits beside the decoder the broker reads them with."""
    if header_type is None:
        header_type = request.__header_schema__
    header = header_type(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header)
    entity_writer(type(request))(buffer, request)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The frame (size prefix, response header, body) answering ``correlation_id``:
    ``response`` is a kio response entity or an :class:`Encoded` body."""
    if not isinstance(response, Encoded):
        response = encode_body(response)
    tail = _header_tail(response.header)
    body = response.body
    prefix = _SIZE_AND_ID.pack(4 + len(tail) + len(body), correlation_id)
    return b"".join((prefix, tail, body)) if tail else prefix + body
