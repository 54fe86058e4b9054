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
* ``join`` and ``heartbeat``: the group coordinator's (:mod:`.groups`).

Each partition's log holds the producers' v2 record batches as they arrived
(:mod:`.records`); the broker assigns offsets by rewriting a batch's base offset.
Below it: :mod:`.core` (the log), :mod:`.groups`, :mod:`.producers`, :mod:`.protocol`
(kio), :mod:`.connection` (framing and budgets). State lives in memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import re
import struct
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final, Self

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.serial.readers import read_int16, read_int32

import aiopurgatory as ap

from .connection import ByteBudget, ClosingConnection, current_connection, serve_connection
from .core import BrokerCore
from .groups import GroupCoordinator
from .limits import (
    DEFAULT_PARTITIONS,
    DEFAULT_REBALANCE_DELAY_MS,
    DEFAULT_REPLICAS,
    MAX_REPLICAS,
    Limits,
)
from .log import Partition, TopicPartition
from .producers import ProducerTable
from .protocol import (
    API_VERSIONS,
    CLUSTER_ID,
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEADER_EPOCH,
    LEAVE_GROUP,
    LIST_OFFSETS,
    METADATA,
    NODE_ID,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    PRODUCE,
    SERVED,
    SYNC_GROUP,
    ZERO,
    encode_response,
    make,
    ms,
    request_schema,
    response_module,
    response_schema,
)
from .records import (
    BATCH_BASE_OFFSET,
    BATCH_LEADER_EPOCH,
    BadBatch,
    IncomingBatch,
    StoredBatch,
    split_batches,
    timestamp_so_far,
)
from .views import GroupInfo, PartitionOffsets

__all__ = ["KafkaBroker"]

log = logging.getLogger("aiopurgatory.kafka")

EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
FOLLOWER_MAX_WAIT: Final = 60.0
"""A follower's fetch waits this long for data before asking again (a produce or a
topic deletion answers it sooner)."""
TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")


Handler = Callable[[Any, int], Coroutine[Any, Any, Any]]


class KafkaBroker:
    """A Kafka-protocol broker on the running event loop, for tests.

    ``async with KafkaBroker() as broker:`` listens on 127.0.0.1 and a free port;
    clients connect to ``broker.bootstrap``. State lives in memory: topics, offsets and
    groups are gone when it stops.

    Args:
        host: The address to listen on.
        port: The port to listen on; 0 picks a free one.
        partitions: Partitions of an auto-created topic, and of CreateTopics asking for
            -1 (Kafka's ``num.partitions``).
        replicas: Replicas per partition, the leader included; ``replicas - 1``
            followers per partition are simulated in process, and the high watermark
            waits for them (acks=all waits with it). The replication factor
            CreateTopics accepts besides -1.
        follower_delay: Seconds each simulated follower waits after a fetch that
            brought data (a slow disk, a slow network).
        initial_rebalance_delay: Seconds an empty group's first rebalance waits for
            more members (Kafka's ``group.initial.rebalance.delay.ms``).
        advertised_host: The host clients are told to connect to (default ``host``).
        limits: Every bound at once; the keyword arguments below override its fields.
        observer: Told of every delayed operation's life (a
            :class:`aiopurgatory.trace.TraceRecorder`, say).
        **limit_options: Any field of :class:`Limits` (``max_topics=10``, say).

    Raises:
        ValueError: An option out of its range.
        TypeError: A keyword argument that is no option.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        partitions: int = DEFAULT_PARTITIONS,
        replicas: int = DEFAULT_REPLICAS,
        follower_delay: float = 0.0,
        initial_rebalance_delay: float = DEFAULT_REBALANCE_DELAY_MS / 1000,
        advertised_host: str | None = None,
        limits: Limits | None = None,
        observer: ap.OperationObserver | None = None,
        **limit_options: Any,
    ) -> None:
        self.limits = dataclasses.replace(limits or Limits(), **limit_options)
        if not 1 <= partitions <= self.limits.max_partitions:
            raise ValueError(
                f"partitions must be between 1 and {self.limits.max_partitions}, got {partitions!r}"
            )
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas!r}")
        if not follower_delay >= 0:
            raise ValueError(f"follower_delay must be >= 0 seconds, got {follower_delay!r}")
        self.host = host
        self.port = port
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
        self.advertised_host = host if advertised_host is None else advertised_host
        self.advertised_port = 0
        self.producers = ProducerTable(
            max_producers=self.limits.max_producers,
            max_producer_states=self.limits.max_producer_states,
        )
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
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"host:port"`` for the clients' ``bootstrap_servers`` (once started)."""
        if self._server is None:
            raise RuntimeError("the broker is not started: async with KafkaBroker() as broker")
        return f"{self.advertised_host}:{self.advertised_port}"

    async def start(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        """Listen (on ``host`` and ``port``, default those given to the constructor).

        Returns:
            The address listened on, the port picked when it was 0.

        Raises:
            OSError: The address cannot be listened on.
            RuntimeError: Started already.
        """
        if self._server is not None:
            raise RuntimeError("the broker is started already")
        host = self.host if host is None else host
        port = self.port if port is None else port
        self._server = await asyncio.start_server(self._connection, host, port)
        sockname = self._server.sockets[0].getsockname()
        self.advertised_port = sockname[1]
        self.port = sockname[1]
        return sockname[0], sockname[1]

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
            await serve_connection(
                reader, writer, limits=self.limits, budget=self.budget, dispatch=self._dispatch
            )
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ap.PurgatoryClosed):
            pass
        except ClosingConnection as exc:
            log.info("closing a connection: %s", exc)
        finally:
            self.connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

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
        current_connection.get().client_id = (header.client_id or "")[:64]
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
        self._create_topic(name, self.default_partitions)
        return ErrorCode.none

    def _create_topic(self, name: str, partitions: int) -> None:
        """Create the topic's partitions in the core and start their followers."""
        self.core.create_topic(name, partitions)
        for index in range(partitions):
            for replica in range(self.replicas - 1):
                task = asyncio.create_task(self._follow(TopicPartition(name, index), replica))
                self.followers.add(task)
                task.add_done_callback(self.followers.discard)

    def _delete_topic(self, name: str) -> bool:
        """Delete the topic: waiting fetches and produces are answered, followers stop."""
        if not self.core.delete_topic(name):
            return False
        self.producers.forget_topic(name)
        return True

    # -- the Python API: topics, and what tests assert on ------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic, as CreateTopics would. Call it on the broker's loop.

        Args:
            name: The topic's name (Kafka's legal characters, at most 249).
            partitions: How many partitions, from 1 to ``max_partitions``.

        Raises:
            ValueError: The name is not a legal topic name, the topic exists, the
                partition count is out of range, or ``max_topics`` are there already.
        """
        if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise ValueError(f"invalid topic name {name!r}")
        if name in self.core.topics:
            raise ValueError(f"topic {name!r} already exists")
        if not (isinstance(partitions, int) and 1 <= partitions <= self.limits.max_partitions):
            raise ValueError(
                f"partitions must be between 1 and {self.limits.max_partitions}, got {partitions!r}"
            )
        if len(self.core.topics) >= self.limits.max_topics:
            raise ValueError(f"at most {self.limits.max_topics} topics (max_topics)")
        self._create_topic(name, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, as DeleteTopics would: requests waiting on it are answered
        UNKNOWN_TOPIC_OR_PARTITION. Call it on the broker's loop.

        Raises:
            KeyError: No such topic.
        """
        if not self._delete_topic(name):
            raise KeyError(name)

    @property
    def topics(self) -> dict[str, int]:
        """Each topic's number of partitions (a copy)."""
        return dict(self.core.topics)

    def offsets(self, topic: str) -> list[PartitionOffsets]:
        """The offsets of each of ``topic``'s partitions, in partition order.

        Raises:
            KeyError: No such topic.
        """
        count = self.core.topics[topic]
        result = []
        for index in range(count):
            partition = self.core.partitions[TopicPartition(topic, index)]
            result.append(
                PartitionOffsets(topic, index, partition.log_start, partition.hw, partition.leo)
            )
        return result

    def list_groups(self) -> list[str]:
        """The ids of the consumer groups the coordinator holds."""
        return list(self.groups.groups)

    def group(self, group_id: str) -> GroupInfo:
        """A snapshot of one consumer group.

        Raises:
            KeyError: No such group (never created, or gone: empty without offsets).
        """
        group = self.groups.groups[group_id]
        return GroupInfo(
            group_id=group.group_id,
            state=group.state.value,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol=group.protocol_name,
            leader=group.leader,
            members=tuple(group.members),
            committed=self.committed(group_id),
        )

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """The offsets ``group_id`` committed ({} for an unknown group)."""
        group = self.groups.groups.get(group_id)
        if group is None:
            return {}
        return {
            TopicPartition(topic, index): offset
            for (topic, index), (offset, _) in group.offsets.items()
        }

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
                self.producers.remember(tp, batch, base)
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
            error, original = self.producers.sequence_error(
                tp, batch, expected.get(batch.producer_id)
            )
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
        state = current_connection.get()
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
        found = partition.first_at_least(timestamp, key=timestamp_so_far)
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
        if self.producers.handed_out(previous):
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
        producer_id = self.producers.new_id()
        if producer_id is None:
            return make(
                cls,
                throttle_time=ZERO,
                error_code=ErrorCode.coordinator_not_available,
                producer_id=-1,
                producer_epoch=-1,
            )
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
            client_id=current_connection.get().client_id,
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
        factor = topic.replication_factor
        if factor > self.replicas:
            # Kafka's answer when the factor exceeds the brokers there are (one node here,
            # unless followers are simulated).
            message = (
                f"Replication factor: {factor} larger than available brokers: {self.replicas}."
            )
            return ErrorCode.invalid_replication_factor, message
        if factor not in (-1, self.replicas) or topic.assignments:
            # Every partition has the broker's replicas (simulated followers included).
            message = f"the replication factor is {self.replicas} (--replicas) or -1"
            return ErrorCode.invalid_replication_factor, message
        if len(self.core.topics) >= self.limits.max_topics:
            return ErrorCode.policy_violation, f"at most {self.limits.max_topics} topics"
        if not validate_only:
            self._create_topic(name, partitions)
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
            deleted = self._delete_topic(name)
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
