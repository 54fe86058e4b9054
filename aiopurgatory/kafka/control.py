"""The test-control verbs: what a test does to the broker and asks of it, outside the
protocol (create a topic, read a group's offsets, stop a node, inject an error).

Ground rules: a verb runs on the broker's loop and changes the broker only as a
request would (a topic is created through :class:`~.topics.Topics`, as CreateTopics
does; a node stops through :class:`~.nodes.Nodes`, as a fault would happen); what it
reads is a copy (:mod:`.views`), never a live table. :class:`BrokerControl` holds the
verbs; :class:`~aiopurgatory.kafka.KafkaBroker` is one, and
:class:`~aiopurgatory.kafka.BrokerThread` offers the same verbs from another thread.
:class:`BrokerVerbs` is the surface both share, generic in what the two verbs that wait
(:meth:`~BrokerControl.stop_node`, :meth:`~BrokerControl.start_node`) return: an
awaitable on the loop, from the thread a :class:`~.thread.Done` (done already, and
awaitable too, so that async tests may use the loop's spelling). Both classes are
checked against it (by mypy, in this module and in :mod:`.thread`), so a verb added to
one and not the other, or with other parameters, fails the type check.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, TypeVar

from kio.schema.errors import ErrorCode

from aiopurgatory.testing import OffsetClock

from .cleaner import Cleaner
from .core import BrokerCore
from .faults import FaultLog, Faults
from .groups import GroupCoordinator
from .limits import Limits
from .log import TopicPartition
from .nodes import Nodes
from .protocol import NODE_ID
from .records import StoredBatch, max_timestamp
from .topics import Topics, legal_topic_name
from .topology import Placement, Topology
from .transactions import TransactionCoordinator
from .views import GroupInfo, PartitionOffsets, TransactionInfo

__all__ = ["BrokerControl", "BrokerVerbs"]

Waited_co = TypeVar("Waited_co", covariant=True)
"""What a verb that waits returns: an awaitable of None on the loop, a finished
awaitable (:class:`~.thread.Done`) from a thread."""


class BrokerVerbs(Protocol[Waited_co]):
    """The test-control verbs, as :class:`BrokerControl` (on the broker's loop) and
    :class:`~aiopurgatory.kafka.BrokerThread` (from any thread) both offer them."""

    def create_topic(self, name: str, partitions: int = 1) -> None: ...
    def delete_topic(self, name: str) -> None: ...
    @property
    def topics(self) -> dict[str, int]: ...
    def offsets(self, topic: str) -> list[PartitionOffsets]: ...
    def list_groups(self) -> list[str]: ...
    def group(self, group_id: str) -> GroupInfo: ...
    def committed(self, group_id: str) -> dict[TopicPartition, int]: ...
    def transaction(self, transactional_id: str) -> TransactionInfo: ...
    def last_stable_offset(self, topic: str, partition: int = 0) -> int: ...
    @property
    def node_count(self) -> int: ...
    def node_state(self, node: int) -> str: ...
    def node_address(self, node: int) -> str: ...
    def leader(self, topic: str, partition: int = 0) -> int: ...
    def isr(self, topic: str, partition: int = 0) -> tuple[int, ...]: ...
    def replicas_of(self, topic: str, partition: int = 0) -> tuple[int, ...]: ...
    def leader_epoch(self, topic: str, partition: int = 0) -> int: ...
    def coordinator(self, key: str) -> int: ...
    def advance(self, seconds: float) -> Waited_co: ...
    def stop_node(self, node: int) -> Waited_co: ...
    def start_node(self, node: int) -> Waited_co: ...
    def isolate(self, node: int) -> None: ...
    def heal(self, node: int) -> None: ...
    def inject(
        self, api: int | str, error: ErrorCode | int | str, count: int = 1, node: int | None = None
    ) -> None: ...
    def delay(
        self, ms: float, *, api: int | str | None = None, node: int | None = None
    ) -> None: ...
    def clear_faults(self) -> None: ...
    @property
    def fault_lines(self) -> list[str]: ...


class BrokerControl:
    """The test-control verbs over a broker's parts. Call them on the broker's loop.

    Args:
        core: The log.
        topic_lifecycle: Creates and deletes topics.
        groups: The group coordinator.
        transactions: The transaction coordinator.
        topology: The nodes' states and the partitions' placements.
        nodes: The nodes' listeners and their faults.
        faults: The injected errors and delays.
        fault_log: Where each fault is logged.
        limits: The broker's limits.
        clock: The broker's clock, which :meth:`advance` moves.
    """

    def __init__(
        self,
        *,
        core: BrokerCore[StoredBatch],
        topic_lifecycle: Topics,
        groups: GroupCoordinator,
        transactions: TransactionCoordinator,
        topology: Topology,
        nodes: Nodes,
        faults: Faults,
        fault_log: FaultLog,
        limits: Limits,
        clock: OffsetClock,
        cleaner: Cleaner,
    ) -> None:
        self.core = core
        self.clock = clock
        self.cleaner = cleaner
        self.topic_lifecycle = topic_lifecycle
        self.groups = groups
        self.transactions = transactions
        self.topology = topology
        self.nodes = nodes
        self.faults = faults
        self.fault_log = fault_log
        self.limits = limits

    # -- topics, and what tests assert on ------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic, as CreateTopics would. Call it on the broker's loop.

        Args:
            name: The topic's name (Kafka's legal characters, at most 249).
            partitions: How many partitions, from 1 to ``max_partitions``.

        Raises:
            ValueError: The name is not a legal topic name, the topic exists, the
                partition count is out of range, or ``max_topics`` are there already.
        """
        if not legal_topic_name(name):
            raise ValueError(f"invalid topic name {name!r}")
        if name in self.core.topics:
            raise ValueError(f"topic {name!r} already exists")
        if not (isinstance(partitions, int) and 1 <= partitions <= self.limits.max_partitions):
            raise ValueError(
                f"partitions must be between 1 and {self.limits.max_partitions}, got {partitions!r}"
            )
        if len(self.core.topics) >= self.limits.max_topics:
            raise ValueError(f"at most {self.limits.max_topics} topics (max_topics)")
        self.topic_lifecycle.create(name, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete a topic, as DeleteTopics would: requests waiting on it are answered
        UNKNOWN_TOPIC_OR_PARTITION. Call it on the broker's loop.

        Raises:
            KeyError: No such topic.
        """
        if not self.topic_lifecycle.delete(name):
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

    def transaction(self, transactional_id: str) -> TransactionInfo:
        """A snapshot of one transactional id: its producer, epoch and transaction.

        Raises:
            KeyError: No such transactional id (never initialised, or expired).
        """
        return self.transactions.info(transactional_id)

    def last_stable_offset(self, topic: str, partition: int = 0) -> int:
        """The partition's LSO: the first offset of its earliest open transaction (the
        log start if retention or DeleteRecords passed it), else the high watermark
        (what read_committed consumers read up to).

        Raises:
            KeyError: No such partition.
        """
        return self.transactions.lso(self.core.partitions[TopicPartition(topic, partition)])

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """The offsets ``group_id`` committed ({} for an unknown group)."""
        group = self.groups.groups.get(group_id)
        if group is None:
            return {}
        return {
            TopicPartition(topic, index): offset
            for (topic, index), (offset, _) in group.offsets.items()
        }

    # -- the nodes, and faults on demand -------------------------------------------------

    @property
    def node_count(self) -> int:
        """The nodes in this process (``nodes``)."""
        return self.topology.nodes

    def node_state(self, node: int) -> str:
        """``"up"``, ``"stopped"`` or ``"isolated"``."""
        return self.topology.states[node].value

    def node_address(self, node: int) -> str:
        """``"host:port"`` of ``node`` (where it listens, or listened and will again)."""
        host, port = self.nodes.address(node)
        return f"{host}:{port}"

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node leading the partition (-1: none is up in its ISR).

        Raises:
            KeyError: No such partition.
        """
        placement = self._placement(topic, partition)
        return NODE_ID if placement is None else placement.leader

    def isr(self, topic: str, partition: int = 0) -> tuple[int, ...]:
        """The partition's in-sync replicas (node ids, in replica order).

        Raises:
            KeyError: No such partition.
        """
        placement = self._placement(topic, partition)
        if placement is None:
            return (NODE_ID,)
        return tuple(node for node in placement.replicas if node in placement.isr)

    def replicas_of(self, topic: str, partition: int = 0) -> tuple[int, ...]:
        """The partition's replicas (node ids; the first is its preferred leader).

        Raises:
            KeyError: No such partition.
        """
        placement = self._placement(topic, partition)
        return (NODE_ID,) if placement is None else placement.replicas

    def _placement(self, topic: str, partition: int) -> Placement | None:
        """The partition's placement on the nodes (None: one node, which holds it).

        Raises:
            KeyError: No such partition.
        """
        tp = TopicPartition(topic, partition)
        self.core.partitions[tp]  # KeyError if unknown
        return self.topology.placements.get(tp)

    def leader_epoch(self, topic: str, partition: int = 0) -> int:
        """The partition's leader epoch (bumped at each change of leader).

        Raises:
            KeyError: No such partition.
        """
        return self.core.partitions[TopicPartition(topic, partition)].epoch

    def coordinator(self, key: str) -> int:
        """The node coordinating the group or transactional id ``key``."""
        return self.nodes.coordinator(key)

    async def advance(self, seconds: float) -> None:
        """Move the broker's clock ``seconds`` forward: every broker-side deadline that
        falls due meanwhile acts now, in deadline order, as if that time had passed.

        What moves: group members' sessions, rebalance timeouts, the initial rebalance
        delay, empty groups' offsets retention, transaction timeouts (the transaction
        is aborted and the last stable offset released), transactional id expiry, and
        retention by time (``retention.ms``, checked once at the new time), segment
        rolls (``segment.ms``) and compaction (``min.compaction.lag.ms``,
        ``max.compaction.lag.ms``, ``delete.retention.ms``: the cleaner runs until
        nothing is due, a bounded step per loop iteration). What does
        not: what a client waits for in real time (a fetch's ``max_wait_ms``, a
        produce's acks, the followers' replication) and the clients' own clocks. The
        record timestamps the broker writes (transaction markers) are on the moved
        clock. Returns once what fell due has run and the loop is idle.

        Args:
            seconds: How far, in seconds (>= 0, finite).

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
        """
        await self.clock.advance(seconds)
        self._retain_by_time()
        await self.cleaner.settle()

    def _retain_by_time(self) -> None:
        """Apply the topics' ``retention.ms`` now, on the broker's clock (by the
        batches' max timestamps, against the wall clock, as Kafka does)."""
        self.core.retain_time(round(self.clock.wall() * 1000), max_timestamp)

    async def stop_node(self, node: int) -> None:
        """Stop a node, as a broker that dies: see :meth:`Nodes.stop_node`.

        Raises:
            ValueError: No such node, or stopped already.
        """
        await self.nodes.stop_node(node)

    async def start_node(self, node: int) -> None:
        """Start a stopped node on its port again: see :meth:`Nodes.start_node`.

        Raises:
            ValueError: No such node, or not stopped.
            OSError: Its port cannot be listened on again.
        """
        await self.nodes.start_node(node)

    def isolate(self, node: int) -> None:
        """Cut a node off without closing its sockets: see :meth:`Nodes.isolate`.

        Raises:
            ValueError: No such node, or not up.
        """
        self.nodes.isolate(node)

    def heal(self, node: int) -> None:
        """End :meth:`isolate`.

        Raises:
            ValueError: No such node, or not isolated.
        """
        self.nodes.heal(node)

    def _check_node(self, node: int | None) -> None:
        if node is not None and not (isinstance(node, int) and 0 <= node < self.topology.nodes):
            raise ValueError(f"no node {node!r}: the nodes are 0..{self.topology.nodes - 1}")

    def inject(
        self, api: int | str, error: ErrorCode | int | str, count: int = 1, node: int | None = None
    ) -> None:
        """Answer the next ``count`` requests of ``api`` (on ``node``, or on any) with
        ``error``, without handling them: nothing they ask for is done. Injections are
        taken in the order made; each is logged, as is each request it answers.

        Args:
            api: An API key, or its name (``"Produce"``, ``"find_coordinator"``).
            error: An error code, its number or its name (``"NOT_LEADER_OR_FOLLOWER"``).
            count: How many requests, >= 1.
            node: Only requests to this node (None: to any).

        Raises:
            ValueError: An API that cannot be answered so (see
                :data:`aiopurgatory.kafka.faults.INJECTABLE`), an unknown error, a bad
                count or node, or ``max_fault_rules`` rules held already.
        """
        self._check_node(node)
        self.faults.inject(api, error, count, node)
        where = "any node" if node is None else f"node={node}"
        self.fault_log.record("inject", f"api={api} error={error} count={count} {where}")

    def delay(self, ms: float, *, api: int | str | None = None, node: int | None = None) -> None:
        """Hold back the answers to ``api``'s requests, or to every request ``node``
        gets, or both, or all (neither), ``ms`` milliseconds each; 0 ends it.

        Raises:
            ValueError: A bad delay, API or node, or too many rules.
        """
        self._check_node(node)
        self.faults.delay(ms, api=api, node=node)
        self.fault_log.record("delay", f"ms={ms} api={api} node={node}")

    def clear_faults(self) -> None:
        """Drop every injected error and delay (stopped or isolated nodes stay so)."""
        self.faults.clear()
        self.fault_log.record("clear_faults")

    @property
    def fault_lines(self) -> list[str]:
        """The latest faults and effects logged, oldest first (a copy of
        :attr:`FaultLog.lines`)."""
        return list(self.fault_log.lines)


_ON_THE_LOOP: type[BrokerVerbs[Awaitable[None]]] = BrokerControl
"""mypy checks here that :class:`BrokerControl` offers every verb of
:class:`BrokerVerbs` (and :mod:`.thread` that ``BrokerThread`` does)."""
