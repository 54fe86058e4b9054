"""KafkaBroker: the Kafka protocol's requests answered from the broker core and the
group coordinator.

Ground rules: a handler validates the whole request before it changes anything, and
answers what Kafka answers, error codes included; a handler that fails anyway answers
UNKNOWN_SERVER_ERROR (the group APIs) or closes the connection, never leaving a request
unanswered or a table half-changed. What waits, waits in a purgatory: one per kind of
delayed operation, as Kafka's ReplicaManager and GroupCoordinator keep them:

* ``fetch``: a Fetch is a ``DelayedLogFetch`` over every partition it reads, answered as
  soon as ``min_bytes`` are readable (up to the high watermark), at ``max_wait_ms``
  otherwise, at once on an error; a produce to any of its partitions re-checks it;
* ``produce``: acks=all is a ``DelayedProduce``, answered once the high watermark
  covers its batches or REQUEST_TIMED_OUT at the request's ``timeout_ms``;
* ``join`` and ``heartbeat``: the group coordinator's (:mod:`.groups`);
* ``transaction``: the transaction coordinator's (:mod:`.transactions`), one
  ``DelayedTxnTimeout`` per open transaction.

This module holds the broker's wiring (one object per concern, made in
``__init__``), its lifecycle (listen, the retention check, close) and the dispatch of
requests to handlers: decoding, the coordinator check on several nodes, injected faults
and delays, and the answer to a failing handler. It holds no handler and no topic
logic: the handlers are the ``*_api`` modules' objects (:mod:`.topic_api` for
ApiVersions, Metadata and the topics, :mod:`.data_api`, :mod:`.group_api`,
:mod:`.txn_api`, :mod:`.admin_api`, :mod:`.epoch_api`, :mod:`.sasl_api`), the topics'
lifecycle is :mod:`.topics`', the error answers :mod:`.answers`', and the Python API a
test calls is :class:`~.control.BrokerControl`'s, which :class:`KafkaBroker` is. State
lives in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import ssl
from collections.abc import Iterable, Mapping
from typing import Any, Final, Self

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.serial.readers import read_int16, read_int32

import aiopurgatory as ap
from aiopurgatory.testing import OffsetClock
from aiopurgatory.timeouts import TimerHandle

from .admin_api import AdminApi
from .answers import error_answer, failure_answer
from .cleaner import Cleaner
from .configs import RETENTION_MS_DEFAULT, ConfigError, broker_configs, cleanup_policy
from .connection import ByteBudget, ClosingConnection, current_connection, serve_connection
from .consumer_group_api import ConsumerGroupApi
from .consumer_groups import ConsumerGroupCoordinator
from .control import BrokerControl
from .core import BrokerCore
from .data_api import DataApi
from .epoch_api import EpochApi
from .faults import FaultLog, Faults
from .group_api import GroupApi
from .groups import GroupCoordinator
from .limits import (
    DEFAULT_PARTITIONS,
    DEFAULT_REBALANCE_DELAY_MS,
    DEFAULT_REPLICAS,
    FETCH_CACHE_ENTRY_BYTES,
    MAX_REPLICAS,
    RENAMED,
    REPLICA_LAG_SECONDS,
    Limits,
    unknown_keyword,
)
from .log import TopicPartition
from .nodes import Nodes
from .producers import ProducerTable
from .protocol import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    API_VERSIONS,
    CONSUMER_GROUP_HEARTBEAT,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    GROUP_APIS,
    INIT_PRODUCER_ID,
    METADATA,
    OFFSETS_TOPIC,
    SERVED,
    TXN_OFFSET_COMMIT,
    Handler,
    LruCache,
    api_name,
    encode_response,
    read_metadata_request,
    request_schema,
)
from .records import StoredBatch
from .sasl import SaslUsers
from .sasl_api import SaslApi
from .tls import TLS_SHUTDOWN_TIMEOUT, start_tls
from .topic_api import TopicApi, api_versions_response
from .topics import Topics
from .topology import NodeState, Topology
from .transactions import TransactionCoordinator
from .txn_api import TxnApi

__all__ = ["KafkaBroker"]

log = logging.getLogger("aiopurgatory.kafka")

COORDINATED_BY_GROUP: Final = frozenset(
    {*GROUP_APIS, TXN_OFFSET_COMMIT, CONSUMER_GROUP_HEARTBEAT} - {FIND_COORDINATOR}
)
"""The APIs a group's coordinator answers (by ``group_id``)."""
COORDINATED_BY_TXN: Final = frozenset({ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN})
"""The APIs a transactional id's coordinator answers (and InitProducerId with one)."""


_MS_DEFAULTS: Final[dict[str, float]] = {
    "replica_lag_time_max_ms": REPLICA_LAG_SECONDS * 1000,
    "follower_delay_ms": 0,
    "group_initial_rebalance_delay_ms": DEFAULT_REBALANCE_DELAY_MS,
}
"""The defaults of the options in milliseconds that had keywords in seconds before
(:data:`~.limits.RENAMED`): an old keyword beside a new one not at its default is an
option given twice."""


class KafkaBroker(BrokerControl):
    """A Kafka-protocol broker on the running event loop, for tests.

    ``async with KafkaBroker() as broker:`` listens on 127.0.0.1 and a free port;
    clients connect to ``broker.bootstrap``. State lives in memory: topics, offsets and
    groups are gone when it stops.

    Args:
        host: The address to listen on.
        port: The port to listen on; 0 picks a free one.
        partitions: Partitions of an auto-created topic, and of CreateTopics asking for
            -1 (Kafka's ``num.partitions``).
        nodes: Brokers in this process (node ids ``0..nodes-1``), each listening on
            its own port: partitions' leaders and replicas, and the coordinators of
            groups and transactional ids, are spread over them, and
            :meth:`stop_node`, :meth:`isolate` and the other faults act on them.
        replicas: Replicas per partition, the leader included (Kafka's
            ``default.replication.factor``). On one node, ``replicas - 1`` followers per
            partition are simulated in process and CreateTopics accepts this factor or
            -1; on several, the followers are other nodes' replicas and CreateTopics
            accepts 1 to ``nodes``. The high watermark waits for the in-sync replicas
            (acks=all waits with it).
        replica_lag_time_max_ms: Milliseconds a follower may lag behind its leader's
            log end before it leaves the ISR (Kafka's ``replica.lag.time.max.ms``,
            30000). ``replica_lag=`` in seconds, its name before, is taken too.
        follower_delay_ms: Milliseconds each simulated follower waits after a fetch
            that brought data (a slow disk, a slow network); ``follower_delay=`` in
            seconds too.
        group_initial_rebalance_delay_ms: Milliseconds an empty group's first
            rebalance waits for more members (Kafka's
            ``group.initial.rebalance.delay.ms``); ``initial_rebalance_delay=`` in
            seconds too.
        log_cleanup_policy: A topic's ``cleanup.policy`` unless it sets one (Kafka's
            ``log.cleanup.policy``): ``"delete"``, ``"compact"`` or ``"compact,delete"``.
        advertised_host: The host clients are told to connect to (default ``host``).
        ssl_context: Listen with TLS (a server-side context: see
            :func:`aiopurgatory.kafka.tls.server_context`); clients use ``SSL`` or
            ``SASL_SSL``.
        sasl_users: Name to password: the listener takes SASL and serves a connection
            only once it has authenticated (``SASL_PLAINTEXT``, or ``SASL_SSL`` with
            ``ssl_context``). The passwords are not kept: SCRAM's salted keys, and
            an HMAC of each for PLAIN.
        sasl_mechanisms: The mechanisms enabled, of ``"PLAIN"``, ``"SCRAM-SHA-256"``
            and ``"SCRAM-SHA-512"`` (default all three).
        limits: Every bound at once; the keyword arguments below override its fields.
        observer: Told of every delayed operation's life (a
            :class:`aiopurgatory.trace.TraceRecorder`, say).
        **limit_options: Any field of :class:`Limits` (``max_topics=10``, say), or
            one of the keywords of before (:data:`~.limits.RENAMED`).

    Every command-line option is a keyword of the same name (``--max-topics`` is
    ``max_topics=``), but ``--tls`` (``ssl_context=``), ``--sasl-user``
    (``sasl_users=``), ``--sasl-mechanism`` (``sasl_mechanisms=``) and ``--trace``
    (``observer=``).

    Raises:
        ValueError: An option out of its range.
        TypeError: A keyword argument that is no option (the message names the
            nearest ones), or an option given under both its names.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        nodes: int = 1,
        partitions: int = DEFAULT_PARTITIONS,
        replicas: int = DEFAULT_REPLICAS,
        replica_lag_time_max_ms: float = _MS_DEFAULTS["replica_lag_time_max_ms"],
        follower_delay_ms: float = _MS_DEFAULTS["follower_delay_ms"],
        group_initial_rebalance_delay_ms: float = _MS_DEFAULTS["group_initial_rebalance_delay_ms"],
        log_cleanup_policy: str = "delete",
        advertised_host: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        sasl_users: Mapping[str, str] | None = None,
        sasl_mechanisms: Iterable[str] | None = None,
        limits: Limits | None = None,
        observer: ap.OperationObserver | None = None,
        **limit_options: Any,
    ) -> None:
        # The keywords of before, in seconds, under their names now (in milliseconds).
        given = {
            "replica_lag_time_max_ms": replica_lag_time_max_ms,
            "follower_delay_ms": follower_delay_ms,
            "group_initial_rebalance_delay_ms": group_initial_rebalance_delay_ms,
        }
        for old, new in RENAMED.items():
            if old in limit_options:
                seconds = limit_options.pop(old)
                if given[new] != _MS_DEFAULTS[new]:
                    raise TypeError(f"{new}= and {old}= are one option: give one")
                if not isinstance(seconds, int | float):
                    raise ValueError(f"{old} is in seconds, got {seconds!r}")
                given[new] = seconds * 1000
        limit_fields = {field.name for field in dataclasses.fields(Limits)}
        for name in limit_options:
            if name not in limit_fields:
                raise unknown_keyword(name, [*_KEYWORDS, *limit_fields])
        self.limits = dataclasses.replace(limits or Limits(), **limit_options)
        replica_lag_time_max_ms = given["replica_lag_time_max_ms"]
        follower_delay_ms = given["follower_delay_ms"]
        group_initial_rebalance_delay_ms = given["group_initial_rebalance_delay_ms"]
        if not (isinstance(nodes, int) and 1 <= nodes <= self.limits.max_nodes):
            raise ValueError(f"nodes must be between 1 and {self.limits.max_nodes}, got {nodes!r}")
        if nodes > 1 and not (isinstance(replicas, int) and 1 <= replicas <= nodes):
            raise ValueError(f"replicas must be between 1 and nodes={nodes}, got {replicas!r}")
        if not (isinstance(replica_lag_time_max_ms, int | float) and replica_lag_time_max_ms > 0):
            raise ValueError(
                f"replica_lag_time_max_ms must be > 0 ms, got {replica_lag_time_max_ms!r}"
            )
        if not 1 <= partitions <= self.limits.max_partitions:
            raise ValueError(
                f"partitions must be between 1 and {self.limits.max_partitions}, got {partitions!r}"
            )
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas!r}")
        if not (isinstance(follower_delay_ms, int | float) and follower_delay_ms >= 0):
            raise ValueError(f"follower_delay_ms must be >= 0 ms, got {follower_delay_ms!r}")
        if not (
            isinstance(group_initial_rebalance_delay_ms, int | float)
            and group_initial_rebalance_delay_ms >= 0
        ):
            raise ValueError(
                "group_initial_rebalance_delay_ms must be >= 0 ms, got "
                f"{group_initial_rebalance_delay_ms!r}"
            )
        follower_delay = follower_delay_ms / 1000
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(f"ssl_context must be an ssl.SSLContext, got {ssl_context!r}")
        if sasl_users is None and sasl_mechanisms is not None:
            raise ValueError(f"sasl_mechanisms={sasl_mechanisms!r} without sasl_users")
        if sasl_users is not None and not isinstance(sasl_users, Mapping):
            raise TypeError(f"sasl_users must map names to passwords, got {sasl_users!r}")
        self.ssl_context = ssl_context
        self.sasl = SaslApi(
            None
            if sasl_users is None
            else SaslUsers(sasl_users, sasl_mechanisms, max_users=self.limits.max_sasl_users),
            self.limits.sasl_max_receive_bytes,
        )
        self.host = host
        self.port = port
        self.default_partitions = partitions
        self.replicas = replicas
        self.follower_delay = follower_delay
        # Kafka's replication factor counts the leader: replicas - 1 followers per
        # partition, simulated in process; the HW is the lowest follower's log end.
        # On several nodes the follower slots are per topic (its replication factor).
        self.core: BrokerCore[StoredBatch] = BrokerCore(
            followers=replicas - 1 if nodes == 1 else 0,
            retain_bytes=self.limits.retain_bytes,
            retain_total_bytes=self.limits.retain_total_bytes,
            observer=observer,
        )
        self.core.retain_ms = RETENTION_MS_DEFAULT
        try:
            policy = cleanup_policy(log_cleanup_policy)
        except ConfigError as exc:
            raise ValueError(f"log_cleanup_policy: {exc}") from None
        if "delete" not in policy:
            # Compaction alone: a topic keeps what the cleaner keeps, whatever its age
            # or size (the broker's total bound, retain_total_bytes, still holds).
            self.core.retain_ms = None
            self.core.retain_bytes = None
        self._retention_check: TimerHandle | None = None
        """The next time retention check (Kafka's log.retention.check.interval.ms), on
        the fetch purgatory's wheel; armed while the broker runs."""
        self.budget = ByteBudget(self.limits.max_inflight_bytes)
        self.clock = OffsetClock()
        """The broker's own time: the loop's, plus whatever :meth:`advance` added. The
        broker-side deadlines follow it (sessions, rebalances, transactions, expiries,
        retention by time); what a client waits for in real time (a fetch's max_wait, a
        produce's acks, replication) follows the loop's."""
        clock = self.clock

        def now_ms() -> int:
            return round(clock.wall() * 1000)

        self.core.segment_now = now_ms  # segments' age
        self.cleaner = Cleaner(self.core, self.limits, now_ms, ",".join(policy))
        """Compacts the compacted topics (``cleanup.policy=compact``)."""
        # Kafka's GroupCoordinator: the join and heartbeat purgatories.
        self.groups = GroupCoordinator(
            clock=self.clock,
            initial_rebalance_delay=group_initial_rebalance_delay_ms / 1000,
            max_groups=self.limits.max_groups,
            max_members=self.limits.max_members,
            max_offsets=self.limits.max_committed_offsets,
            max_metadata_bytes=self.limits.offset_metadata_max_bytes,
            min_session_timeout=self.limits.group_min_session_timeout_ms / 1000,
            max_session_timeout=self.limits.group_max_session_timeout_ms / 1000,
            max_id_chars=self.limits.max_group_id_chars,
            max_member_bytes=self.limits.max_member_metadata_bytes,
            max_held_bytes=self.limits.max_group_bytes,
            offsets_retention=self.limits.offsets_retention_minutes * 60.0,
            observer=observer,
        )
        # KIP-848's consumer-type groups: their members and assignments, their offsets
        # and place in the classic coordinator's table (a group has one type).
        self.consumer_groups = ConsumerGroupCoordinator(
            self.groups,
            self.core.topics,
            self.core.topic_ids,
            session_timeout=self.limits.group_consumer_session_timeout_ms / 1000,
            heartbeat_interval=self.limits.group_consumer_heartbeat_interval_ms / 1000,
            max_members=self.limits.max_members,
            max_subscribed=self.limits.max_topics,
            max_id_chars=self.limits.max_group_id_chars,
            clock=self.clock,
            observer=observer,
        )
        self.advertised_host = host if advertised_host is None else advertised_host
        self.advertised_port = 0
        # Faults on demand: errors and delays injected per API and node, and the log of
        # every fault and its effects (rows of the observer's "faults" too).
        self.faults = Faults(self.limits.max_fault_rules)
        self.fault_log = FaultLog(observer)
        # The nodes: one listener each over this one core (the process is the cluster).
        self.topology = Topology(nodes, max_replicas_per_node=self.limits.max_replicas_per_node)
        self.nodes = Nodes(
            self.topology,
            self.core,
            self._connection,
            host=host,
            ports=self._ports(port),
            advertised_host=self.advertised_host,
            ssl_context=ssl_context,
            limits=self.limits,
            replica_lag=replica_lag_time_max_ms / 1000,
            follower_delay=follower_delay,
            on_truncate=self._truncated,
            faults=self.fault_log,
        )
        self.producers = ProducerTable(
            max_producer_states=self.limits.max_producer_states,
        )
        self.connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        """Every node's connections (each node also lists its own)."""
        self.negotiated: dict[tuple[str, int, int], int] = {}
        """(client id, API key, version) to the number of requests: what each client
        chose from ApiVersions (bounded, client ids are the clients' to choose)."""
        self._decoded_fetches: LruCache[bytes, tuple[Any, Any]] = LruCache(
            self.limits.fetch_cache_entries
        )
        """Fetch frames (but their correlation ids) to their decoded header and request."""
        # Kafka's TransactionCoordinator: the transaction purgatory (timeouts).
        self.transactions = TransactionCoordinator(
            self.core,
            self.producers,
            self.groups,
            self.limits,
            clock=self.clock,
            wall=self.clock.wall,
            observer=observer,
        )
        self.cleaner.transactions = self.transactions  # the LSO, the aborted index
        # The topics' lifecycle; each table keyed by topic forgets a deleted one as a
        # listener (the nodes' placements and followers are its own first listener).
        self.topic_lifecycle = Topics(
            self.core,
            self.topology,
            self.nodes,
            self.limits,
            default_partitions=partitions,
            replicas=replicas,
            follower_delay=follower_delay,
        )
        self.topic_lifecycle.on_deleted(self.producers.forget_topic)
        self.topic_lifecycle.on_deleted(self.transactions.forget_topic)
        # Offsets committed for a deleted topic go with it, as in Kafka.
        self.topic_lifecycle.on_deleted(self.groups.forget_topic)
        # The handlers, one object per concern (Kafka's KafkaApis, split by family):
        # the data path, the groups, the transactions, the admin APIs, leader epochs,
        # SASL, and the broker's own (versions, metadata, topics). A new concern brings
        # its own object.
        self.data_api = DataApi(
            self.core,
            self.producers,
            self.limits,
            self.budget,
            self.transactions,
            # One node leads everything: the handlers check epochs alone, with no call
            # per partition into the nodes (a consumer's fetch asks for each).
            leadership=self.nodes if self.topology.nodes > 1 else None,
            replicas=replicas,
            compacted=self.cleaner.compacted,
        )
        self.group_api = GroupApi(
            self.groups,
            self.core,
            self.limits,
            self._locate,
            pending_offsets=self.transactions.pending_offsets,
            consumers=self.consumer_groups,
        )
        self.consumer_group_api = ConsumerGroupApi(self.consumer_groups, self.core)
        # InitProducerId is the transaction API's: it hands the idempotent case back.
        self.txn_api = TxnApi(self.transactions, self.limits, self.data_api.init_producer_id)
        self.admin_api = AdminApi(
            self.core,
            self.groups,
            self.limits,
            self._brokers,
            self.topic_lifecycle.add_partitions,
            self._broker_configs,
            self.cleaner,
            self.consumer_groups,
        )
        self.topic_lifecycle.on_deleted(self.cleaner.forget)
        self.topic_lifecycle.on_deleted(self.admin_api.forget_topic)  # its configs
        self.epoch_api = EpochApi(self.core, self.nodes)
        self.topic_api = TopicApi(
            self.topic_lifecycle,
            self.core,
            self.topology,
            self.limits,
            self._brokers,
            self.admin_api.apply,
        )
        self.handlers: dict[int, Handler] = {
            **self.topic_api.handlers(),
            **self.data_api.handlers(),
            **self.group_api.handlers(),
            **self.consumer_group_api.handlers(),
            **self.txn_api.handlers(),
            **self.admin_api.handlers(),
            **self.epoch_api.handlers(),
            **self.sasl.handlers(),
        }
        self._started = False
        self._closed = False
        super().__init__(
            core=self.core,
            topic_lifecycle=self.topic_lifecycle,
            groups=self.groups,
            transactions=self.transactions,
            topology=self.topology,
            nodes=self.nodes,
            faults=self.faults,
            fault_log=self.fault_log,
            clock=self.clock,
            limits=self.limits,
            cleaner=self.cleaner,
        )

    @property
    def followers(self) -> set[asyncio.Task[None]]:
        """The simulated followers' tasks, on one node (:attr:`Topics.followers`)."""
        return self.topic_lifecycle.followers

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def security_protocol(self) -> str:
        """What clients set as ``security_protocol`` (``security.protocol``):
        ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``."""
        tls = self.ssl_context is not None
        if self.sasl.users is None:
            return "SSL" if tls else "PLAINTEXT"
        return "SASL_SSL" if tls else "SASL_PLAINTEXT"

    @property
    def bootstrap(self) -> str:
        """``"host:port"`` for the clients' ``bootstrap_servers`` (once started): every
        node listening, comma-separated."""
        if not self._started:
            raise RuntimeError("the broker is not started: async with KafkaBroker() as broker")
        return ",".join(f"{host}:{port}" for _, host, port in self._brokers())

    def _ports(self, port: int) -> list[int]:
        """Node n listens on ``port + n`` (all on free ports for 0)."""
        count = self.topology.nodes
        if not (isinstance(port, int) and port >= 0 and port + count - 1 <= 65535):
            raise ValueError(
                f"port must be 0 or a port leaving room for {count} nodes, got {port!r}"
            )
        return [port + node if port else 0 for node in range(count)]

    async def start(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        """Listen (on ``host`` and ``port``, default those given to the constructor):
        node n on ``port + n``, or on free ports for 0.

        Returns:
            The address node 0 listens on, the port picked when it was 0.

        Raises:
            OSError: The address cannot be listened on.
            RuntimeError: Started already.
        """
        if self._started:
            raise RuntimeError("the broker is started already")
        self._started = True
        if host is not None:
            self.nodes.host = host
        if port is not None:
            self.nodes.ports = self._ports(port)
        await self.nodes.start()
        _, host, port = self.nodes.listening()[0]
        self.advertised_port = port
        self.port = port
        self.host = host
        self._arm_retention_check()
        self.cleaner.start()
        return host, port

    def _arm_retention_check(self) -> None:
        if self._closed or self.core.fetch_purgatory.closed:
            return
        self._retention_check = self.core.fetch_purgatory.call_later(
            self.limits.retention_check_ms / 1000, self._check_retention
        )

    def _check_retention(self) -> None:
        """Apply the topics' ``retention.ms`` (by the batches' max timestamps, against
        the wall clock, as Kafka does), then check again after the interval."""
        self._retention_check = None
        try:
            self._retain_by_time()
        except Exception:
            log.exception("the time retention check failed")
        self._arm_retention_check()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening, answer nothing more: parked requests end with their connections.

        Idempotent; the broker cannot be started again.
        """
        if self._closed:
            return
        self._closed = True
        # Closing the purgatories ends every parked fetch and produce (PurgatoryClosed),
        # closing the sockets ends every read: the handlers return on their own (a
        # cancelled one upsets asyncio's stream callback on Python 3.11).
        if self._retention_check is not None:
            self._retention_check.cancel()
            self._retention_check = None
        self.cleaner.close()
        await self.nodes.aclose()
        await self.topic_lifecycle.aclose()
        self.core.close()
        self.groups.close()
        self.consumer_groups.close()
        self.transactions.close()
        for writer in self.connections.values():
            writer.close()
        tasks = list(self.connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()
        await self.nodes.wait_closed()

    def _brokers(self) -> list[tuple[int, str, int]]:
        """(node, host, port) of each node up, as clients are told of them."""
        return [
            (node, *self.nodes.address(node))
            for node in range(self.topology.nodes)
            if self.topology.states[node] is not NodeState.STOPPED
        ]

    def _locate(self, key: str) -> tuple[int, str, int]:
        """The coordinator of a group or transactional id: (node, host, port)."""
        node = self.nodes.coordinator(key)
        if node < 0:
            return -1, "", -1
        return (node, *self.nodes.address(node))

    # -- connections --------------------------------------------------------------------

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: int = 0
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.connections) >= self.limits.max_connections:
            writer.close()
            return
        self.connections[task] = writer
        context = self.nodes.ssl_context
        # Whether the streams carry the connection (for TLS: once its handshake is done;
        # a failed one leaves them knowing nothing of the close, nothing to wait for).
        streaming = context is None
        try:
            if context is not None:
                # Counted from its accept, as Kafka counts max.connections: a peer that
                # stalls its handshake is bounded as one that stalls SASL.
                await start_tls(
                    writer,
                    context,
                    handshake_timeout=self.limits.auth_deadline_seconds,
                    shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
                )
                streaming = True
            await serve_connection(
                reader,
                writer,
                limits=self.limits,
                budget=self.budget,
                dispatch=self._dispatch,
                gate=self.sasl.gate(),
                node=node,
            )
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ap.PurgatoryClosed):
            pass  # OSError: ConnectionError, and a failed TLS handshake (ssl.SSLError)
        except ClosingConnection as exc:
            log.info("closing a connection: %s", exc)
        finally:
            # Listed until closed: a TLS close waits for the peer's close_notify (at most
            # TLS_SHUTDOWN_TIMEOUT), and aclose waits for the listed tasks.
            try:
                if streaming:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
                else:
                    writer.transport.abort()  # nothing to send: the TCP connection goes
            finally:
                self.connections.pop(task, None)

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
            return encode_response(correlation_id, api_versions_response(0, True))
        if not low <= version <= high:
            raise ClosingConnection(f"API key {api_key} version {version} is not served")
        # A consumer long-polling re-sends the same Fetch frame but for its correlation
        # id: decoded once (kio's entities are frozen, so one can answer many), keyed by
        # the frame without the correlation id. Its header's correlation id is the
        # first frame's: the answer takes the one just read.
        key = (
            frame[:4] + frame[8:]
            if api_key == FETCH and len(frame) <= FETCH_CACHE_ENTRY_BYTES
            else None
        )
        decoded = None if key is None else self._decoded_fetches.get(key)
        if decoded is None:
            schema = request_schema(api_key, version)
            try:
                header, used = entity_reader(schema.__header_schema__)(frame, 0)
                if api_key == METADATA and version >= 9:
                    request, _ = read_metadata_request(frame, used, version)
                else:
                    request, _ = entity_reader(schema)(frame, used)
            except Exception as exc:  # kio raises several kinds on a malformed body
                raise ClosingConnection(
                    f"malformed request (API {api_key} v{version}): {exc}"
                ) from exc
            if key is not None:
                self._decoded_fetches.put(key, (header, request))
        else:
            header, request = decoded
        # Decoded (kio copies what it keeps, no view into the frame): the frame and its
        # charge go. A request that parks (a JoinGroup until the rebalance, an acks=all
        # produce until the followers have it) then holds only what its operation keeps,
        # which its own table's limit counts (max_group_bytes, the retained batches); its
        # answer is charged again before it is written. A Fetch is the exception: what
        # it parks with is the request itself (the partitions it watches), which no
        # other limit counts, so it keeps its frame's charge until answered (and one
        # padded with names it does not watch is answered at once: DataApi.fetch).
        del frame
        state = current_connection.get()
        if state.held and api_key != FETCH:
            self.budget.release(state.held)
            state.held = 0
        self._count(header.client_id or "", api_key, version)
        state.client_id = (header.client_id or "")[:64]
        clustered = self.topology.nodes > 1
        if clustered:
            # An isolated node answers nothing until healed; the request is then handled
            # as things stand (its partitions have moved on, likely).
            await self.nodes.wait_reachable(state.node)
            error = self._coordinator_error(api_key, request, state.node)
            if error is not ErrorCode.none:
                return encode_response(
                    correlation_id, self._error_response(api_key, version, request, error)
                )
        injected = self.faults.take(api_key, state.node)
        try:
            if injected is None:
                response = await handler(request, version)
            else:
                self.fault_log.record(
                    "injected",
                    f"{api_name(api_key)} node={state.node}: {injected.name}",
                    effect=True,
                )
                response = error_answer(
                    api_key,
                    version,
                    request,
                    injected,
                    brokers=self._brokers(),
                    topics=[*self.core.topics, OFFSETS_TOPIC],
                )
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
        delay = self.faults.delay_for(api_key, state.node)
        if delay:
            await asyncio.sleep(delay)  # a slow node, a slow API: the answer held back
        if clustered:
            await self.nodes.wait_reachable(state.node)  # isolated while it was handled
        if response is None:
            return None
        return encode_response(correlation_id, response)

    def _coordinator_error(self, api_key: int, request: Any, node: int) -> ErrorCode:
        """NOT_COORDINATOR for a group or transaction request sent to a node that does
        not coordinate its key (the client asks FindCoordinator again), else NONE."""
        if api_key in COORDINATED_BY_GROUP:
            # OffsetFetch v8+ batches groups: the first one's coordinator answers.
            groups = getattr(request, "groups", None)
            key = request.group_id if groups is None else groups[0].group_id if groups else ""
        elif api_key == ADD_PARTITIONS_TO_TXN:
            key = request.v3_and_below_transactional_id  # its name in v0-3 (kio's)
        elif api_key in COORDINATED_BY_TXN:
            key = request.transactional_id
        elif api_key == INIT_PRODUCER_ID:
            key = request.transactional_id
            if key is None:
                return ErrorCode.none  # an idempotent producer: any node hands ids out
        else:
            return ErrorCode.none
        if self.nodes.coordinator(key) != node:
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def _error_response(
        self,
        api_key: int,
        version: int,
        request: Any,
        error: ErrorCode = ErrorCode.unknown_server_error,
    ) -> Any:
        """``error`` answering ``request`` whose handler failed (the group and
        transaction APIs; None for others): :func:`~.answers.failure_answer`."""
        return failure_answer(api_key, version, request, error)

    def _count(self, client_id: str, api_key: int, version: int) -> None:
        key = (client_id[:64], api_key, version)
        if key in self.negotiated or len(self.negotiated) < 1000:
            self.negotiated[key] = self.negotiated.get(key, 0) + 1

    def _truncated(self, tp: TopicPartition, end: int) -> None:
        """A new leader's log ends at ``end``: what was known of the batches beyond it
        (idempotent producers' sequences, open transactions) goes with them."""
        self.producers.truncate(tp, end)
        self.transactions.truncate(tp, end)

    def _broker_configs(self, node: int) -> dict[str, tuple[str, int]]:
        """The configs of ``node`` as DescribeConfigs reports them (read-only): its id,
        its listener, and what every node shares."""
        host, port = self.nodes.address(node)
        return broker_configs(
            self.limits,
            self.groups,
            node=node,
            partitions=self.default_partitions,
            replicas=self.replicas,
            listener=f"{self.security_protocol}://{host}:{port}",
            cleanup=",".join(self.cleaner.policy),
        )


_KEYWORDS: Final = tuple(
    name
    for name, parameter in inspect.signature(KafkaBroker.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
)
""":class:`KafkaBroker`'s own keyword arguments (beside the :class:`Limits` fields), the
names a wrong keyword is compared with."""
