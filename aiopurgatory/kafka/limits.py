"""The broker's limits: every table, buffer and wait a client can grow, bounded; and the
names of the broker's options.

Ground rules: plain data, no kio, so that ``--help`` and the options of
:class:`~aiopurgatory.kafka.KafkaBroker` can be read without the ``kafka`` extra. Each
field is a command-line option (``max_request_bytes`` is ``--max-request-bytes``) and a
keyword argument of :class:`~aiopurgatory.kafka.KafkaBroker`. So is every other option:
one name, dashes on the command line and underscores as a keyword, Kafka's name and
unit where Kafka has the option (``--replica-lag-time-max-ms`` is
``replica_lag_time_max_ms=``, in milliseconds). The keywords of before (:data:`RENAMED`)
still work; a keyword that is no option is answered with the nearest names
(:func:`unknown_keyword`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Final

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_REBALANCE_DELAY_MS",
    "DEFAULT_REPLICAS",
    "FETCH_CACHE_ENTRY_BYTES",
    "LIMIT_HELP",
    "MAX_REPLICAS",
    "RENAMED",
    "REPLICA_LAG_SECONDS",
    "Limits",
    "unknown_keyword",
]

MAX_REPLICAS: Final = 16
"""Replicas per partition at most (the leader and its simulated followers)."""


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
    retention_check_ms: int = 300_000
    """Every this often the topics' ``retention.ms`` is applied: batches whose max
    timestamp is older go from the front of each log (Kafka's
    log.retention.check.interval.ms)."""
    log_cleaner_backoff_ms: int = 15_000
    """The cleaner, idle, looks for a log to compact this often (Kafka's
    log.cleaner.backoff.ms); :meth:`~aiopurgatory.kafka.KafkaBroker.advance` and a
    compacted topic's appends wake it sooner."""
    log_cleaner_step_bytes: int = 64 * 1024
    """The cleaner reads this many bytes of batches at most per step, and inflates (and
    compresses again) about this many of their records, then lets the loop run (a
    bounded stall, whatever the log's size and however well its batches compress)."""
    retain_total_bytes: int = 512 * 1024 * 1024
    """All partitions: the oldest batches anywhere go beyond this; while the followers
    have not replicated enough to drop any, produces are refused (KAFKA_STORAGE_ERROR)."""
    max_inflight_bytes: int = 64 * 1024 * 1024
    """Request frames being read and decoded and answers being sent, over all
    connections: beyond it, connections wait (Kafka's queued.max.request.bytes)."""
    budget_wait_seconds: float = 30.0
    """A request frame, or an answer, waits at most this long for room in
    max_inflight_bytes; then its connection is closed (the client reconnects and
    retries, as after its own request timeout, 30 s in Kafka's clients)."""
    max_fetch_bytes: int = 16 * 1024 * 1024
    """A fetch's max_bytes is capped at this (more is fetched by the next request)."""
    max_topics: int = 1000
    max_partitions: int = 64
    """Per topic."""
    max_nodes: int = 16
    """Nodes of a cluster in one process (``nodes``, ``--nodes``)."""
    max_replicas_per_node: int = 4000
    """Partition replicas one node may hold, leaders and followers (a follower is a task
    fetching from its leader): a topic that would place more is refused POLICY_VIOLATION
    (Kafka's advice is at most 4,000 per broker)."""
    max_producer_states: int = 50_000
    """Idempotent producers' states kept, one per producer id and partition written to
    (up to 2 kB each); beyond it the least recently written is forgotten, and that
    producer's next batch there is answered UNKNOWN_PRODUCER_ID (clients then bump their
    epoch and go on), as Kafka answers a producer whose state expired."""
    max_wait_seconds: float = 30.0
    """A fetch's max_wait_ms and a produce's timeout_ms are capped at this."""
    max_groups: int = 1000
    """Consumer groups held, with members or committed offsets: a standalone commit to
    one more is refused COORDINATOR_NOT_AVAILABLE; a JoinGroup for one more takes the
    place of the least recently used group without members (its offsets dropped), and
    is refused so only when every group has members (Kafka has no such bound)."""
    max_members: int = 1000
    """Per group."""
    max_committed_offsets: int = 100_000
    """Per group."""
    group_min_session_timeout_ms: int = 6000
    """A JoinGroup asking for a shorter session is refused INVALID_SESSION_TIMEOUT
    (Kafka's group.min.session.timeout.ms)."""
    group_max_session_timeout_ms: int = 1_800_000
    """A JoinGroup asking for a longer session is refused INVALID_SESSION_TIMEOUT
    (Kafka's group.max.session.timeout.ms)."""
    group_consumer_session_timeout_ms: int = 45_000
    """A consumer group protocol member (KIP-848) not heard from for this long is
    removed, its partitions reassigned (Kafka's group.consumer.session.timeout.ms; the
    clients cannot set it under this protocol)."""
    group_consumer_heartbeat_interval_ms: int = 5_000
    """A consumer group protocol member is told to heartbeat this often (Kafka's
    group.consumer.heartbeat.interval.ms): a reassignment reaches it within this."""
    max_group_id_chars: int = 255
    """Group ids, member ids, group instance ids and JoinGroup's protocol types longer
    than this are refused: a group id INVALID_GROUP_ID (in the group APIs and in
    AddOffsetsToTxn and TxnOffsetCommit), the others INVALID_REQUEST (Kafka has no such
    bound)."""
    max_member_metadata_bytes: int = 1024 * 1024
    """A member's protocols (names and metadata) and its assignment, each: beyond this
    a JoinGroup or the leader's SyncGroup is refused INVALID_REQUEST."""
    max_group_bytes: int = 256 * 1024 * 1024
    """All members' ids, protocol types, protocols and assignments the coordinator
    holds, over every group (a consumer-type group's assignment at 128 bytes a partition
    of the topics it subscribes to): a JoinGroup, SyncGroup or joining
    ConsumerGroupHeartbeat that would go beyond it is refused COORDINATOR_NOT_AVAILABLE
    (retried by the clients) until members leave."""
    offset_metadata_max_bytes: int = 4096
    """A committed offset's metadata beyond this (in characters, as Kafka counts it) is
    refused OFFSET_METADATA_TOO_LARGE (Kafka's offset.metadata.max.bytes)."""
    offsets_retention_minutes: int = 7 * 24 * 60
    """An empty group's committed offsets are dropped this long after it became empty
    (or after its last standalone commit), and the group with them; a group with
    neither members nor offsets goes at once (Kafka's offsets.retention.minutes)."""
    transaction_max_timeout_ms: int = 900_000
    """InitProducerId asking for a longer transaction timeout is refused
    INVALID_TRANSACTION_TIMEOUT (Kafka's transaction.max.timeout.ms)."""
    max_transactional_id_chars: int = 255
    """A transactional id longer than this is refused INVALID_REQUEST by every
    transaction API (Kafka has no such bound); the group ids a transaction names
    (AddOffsetsToTxn, TxnOffsetCommit) are bounded by ``max_group_id_chars``."""
    max_transactional_ids: int = 1000
    """Transactional ids the coordinator holds; a new one beyond it takes the place of
    the least recently used id without an open transaction (forgotten as if it had
    expired); when every id has a transaction open it is refused
    COORDINATOR_NOT_AVAILABLE (Kafka has no such bound)."""
    transactional_id_expiration_ms: int = 604_800_000
    """A transactional id with no transaction open is forgotten this long after its
    last request (Kafka's transactional.id.expiration.ms)."""
    max_transaction_partitions: int = 1000
    """Partitions and groups (AddPartitionsToTxn, AddOffsetsToTxn) per transaction;
    more is refused INVALID_REQUEST."""
    max_transaction_offsets: int = 10_000
    """Offsets a transaction holds pending (TxnOffsetCommit) until it ends; more is
    refused INVALID_REQUEST."""
    auth_deadline_seconds: float = 30.0
    """A connection to a SASL listener not authenticated this long after it was
    accepted is closed; a TLS handshake not done in this long is dropped (Kafka bounds
    neither but by connections.max.idle.ms)."""
    sasl_max_receive_bytes: int = 524_288
    """Before authentication a frame (a SASL message) announcing more closes the
    connection (Kafka's sasl.server.max.receive.size)."""
    max_sasl_users: int = 100
    """Users a SASL listener may be given (each is derived at start, a few ms apiece)."""
    fetch_cache_entries: int = 1024
    """Fetch request frames kept decoded, and empty Fetch answers kept encoded, each up
    to :data:`FETCH_CACHE_ENTRY_BYTES`: a consumer long-polling re-sends the same frame
    and gets the same empty answer until its partitions change, so neither is built
    again. Least recently used first out; an entry is keyed by everything its bytes
    depend on (the frame but its correlation id; the partitions' offsets and errors),
    so none is ever stale."""
    max_fault_rules: int = 1000
    """Faults a test may have pending at once (:class:`~aiopurgatory.kafka.faults.Faults`:
    errors to answer and delays to add, each rule one): one more is refused, so a test
    injecting in a loop cannot grow the broker without bound."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"{field.name} must be > 0, got {value!r}")
        if self.max_inflight_bytes < self.max_request_bytes:
            raise ValueError("max_inflight_bytes must be >= max_request_bytes")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group_min_session_timeout_ms must be <= group_max_session_timeout_ms")
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ValueError(
                "group_consumer_heartbeat_interval_ms must be < group_consumer_session_timeout_ms"
            )
        if self.max_member_metadata_bytes > self.max_group_bytes:
            raise ValueError("max_member_metadata_bytes must be <= max_group_bytes")


FETCH_CACHE_ENTRY_BYTES: Final = 2048
"""The largest Fetch request frame, and empty answer body, the fetch caches keep: with
``fetch_cache_entries`` they bound the caches' memory (by default 2 MiB of frames and
2 MiB of answers at most, and their keys)."""


LIMIT_HELP: Final = {
    "budget_wait_seconds": "a request frame or an answer waits this long at most for "
    "room in the in-flight bytes, then its connection is closed",
    "max_producer_states": "idempotent producers' states (one per producer id and partition, "
    "up to 2 kB each); beyond it the least recently written is forgotten",
    "max_groups": "groups held (members or offsets); a standalone commit to one more is "
    "refused, a JoinGroup for one more replaces the least recently used group without members",
    "group_min_session_timeout_ms": "a JoinGroup with a shorter session timeout is refused "
    "INVALID_SESSION_TIMEOUT (Kafka's group.min.session.timeout.ms)",
    "group_max_session_timeout_ms": "a JoinGroup with a longer session timeout is refused "
    "INVALID_SESSION_TIMEOUT (Kafka's group.max.session.timeout.ms)",
    "group_consumer_session_timeout_ms": "a consumer group protocol (KIP-848) member not "
    "heard from for this long is removed (group.consumer.session.timeout.ms)",
    "group_consumer_heartbeat_interval_ms": "consumer group protocol (KIP-848) members are "
    "told to heartbeat this often (group.consumer.heartbeat.interval.ms)",
    "max_group_id_chars": "group, member and group instance ids and protocol types longer "
    "than this are refused (INVALID_GROUP_ID, INVALID_REQUEST)",
    "max_member_metadata_bytes": "a member's protocol metadata, and its assignment, beyond "
    "this are refused INVALID_REQUEST",
    "max_group_bytes": "members' ids, protocol types, metadata and assignments held over all "
    "groups (KIP-848 assignments at 128 bytes a partition); beyond it JoinGroup, SyncGroup "
    "and a joining ConsumerGroupHeartbeat answer COORDINATOR_NOT_AVAILABLE",
    "offset_metadata_max_bytes": "a committed offset's metadata beyond this many characters "
    "is refused OFFSET_METADATA_TOO_LARGE",
    "log_cleaner_backoff_ms": "the idle cleaner looks for a log to compact this often "
    "(log.cleaner.backoff.ms)",
    "log_cleaner_step_bytes": "the cleaner reads, and inflates, this many bytes at most "
    "per step, then lets the loop run",
    "retention_check_ms": "every this often the topics' retention.ms is applied "
    "(log.retention.check.interval.ms)",
    "offsets_retention_minutes": "an empty group's committed offsets, and the group, are "
    "dropped this long after it became empty or after its last standalone commit",
    "transaction_max_timeout_ms": "InitProducerId asking for a longer transaction timeout "
    "is refused INVALID_TRANSACTION_TIMEOUT (transaction.max.timeout.ms)",
    "max_transactional_id_chars": "a longer transactional id is refused INVALID_REQUEST",
    "max_transactional_ids": "transactional ids held; a new one beyond it replaces the least "
    "recently used idle one, or is refused COORDINATOR_NOT_AVAILABLE if none is idle",
    "transactional_id_expiration_ms": "a transactional id without an open transaction is "
    "forgotten this long after its last request (transactional.id.expiration.ms)",
    "max_transaction_partitions": "partitions and groups one transaction may add; more is "
    "refused INVALID_REQUEST",
    "max_transaction_offsets": "offsets one transaction holds pending (TxnOffsetCommit); "
    "more is refused INVALID_REQUEST",
    "auth_deadline_seconds": "a connection to a SASL listener that has not authenticated "
    "this long after it was accepted is closed; so is a TLS handshake not done by then",
    "sasl_max_receive_bytes": "before authentication a larger frame (a SASL message) closes "
    "the connection (sasl.server.max.receive.size)",
    "max_sasl_users": "users --sasl-user and sasl_users may give",
    "max_nodes": "nodes --nodes may ask for",
    "max_replicas_per_node": "partition replicas one node may hold (leaders and followers); "
    "a topic that would place more is refused POLICY_VIOLATION",
    "fetch_cache_entries": "fetch request frames kept decoded, and empty fetch answers kept "
    "encoded (each up to 2 KiB), least recently used first out",
    "max_fault_rules": "injected faults (errors to answer, delays to add) pending at once; "
    "one more is refused",
}
"""``--help`` for the limits whose name alone does not say what is refused."""


# A single-node Kafka's development defaults (Kafka's config/server.properties, which
# container images for tests use too): what test suites written against Kafka assume.
DEFAULT_PARTITIONS: Final = 1
"""Partitions of an auto-created topic, and of CreateTopics asking for -1
(``num.partitions=1``)."""
DEFAULT_REPLICAS: Final = 1
"""Replicas per partition, the leader included: one node, so no simulated follower
(``offsets.topic.replication.factor=1``); ``replicas=3`` simulates two followers."""
DEFAULT_REBALANCE_DELAY_MS: Final = 0
"""An empty group's first rebalance waits this long for more members
(``group.initial.rebalance.delay.ms=0``; Kafka's built-in default is 3000)."""
REPLICA_LAG_SECONDS: Final = 30.0
"""A follower lagging behind its leader's log end this long leaves the ISR
(``replica.lag.time.max.ms=30000``)."""


RENAMED: Final = {
    "replica_lag": "replica_lag_time_max_ms",
    "follower_delay": "follower_delay_ms",
    "initial_rebalance_delay": "group_initial_rebalance_delay_ms",
}
"""The keywords of :class:`~aiopurgatory.kafka.KafkaBroker` named otherwise than their
command-line options, in seconds, until issue 49: each to its name now, the option's,
in milliseconds. Still taken (seconds), so that no test written with them breaks."""


def unknown_keyword(name: str, known: Iterable[str], owner: str = "KafkaBroker") -> TypeError:
    """The TypeError for a keyword argument that is no option: Python's own wording,
    with the nearest option names (difflib), rather than a bare ``Limits.__init__()``
    that names neither the class called nor the option meant."""
    message = f"{owner}() got an unexpected keyword argument {name!r}"
    nearest = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    if nearest:
        message += "; did you mean " + " or ".join(repr(option) for option in nearest) + "?"
    return TypeError(message)
