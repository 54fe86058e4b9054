"""The cluster's topology: which nodes are up, which hold each partition's replicas,
which leads it and which are in sync, and which node coordinates a group or a
transactional id.

Ground rules: plain state and decisions, no asyncio, no sockets and no log (the node
runtime, :mod:`.nodes`, applies them to the core and the listeners). A partition's
replicas are node ids in a fixed order; replica slot ``i`` of the partition's log
(:class:`~.log.Partition`) is ``replicas[i]``. Invariants, checked by :meth:`check`:

* the leader is a replica in the ISR on a node that is up, or -1 (offline);
* the ISR holds replicas only, the leader's included;
* a node that is not up leads nothing.

Elections are clean: only an ISR member can lead, so the high watermark (the lowest
log end in the ISR) never passes what the new leader holds, and nothing acknowledged
with acks=all is lost.
"""

from __future__ import annotations

import dataclasses
import enum
import zlib
from collections.abc import Iterator
from typing import Final

from .log import TopicPartition

__all__ = ["COORDINATOR_PARTITIONS", "NodeState", "Placement", "Topology"]

COORDINATOR_PARTITIONS: Final = 50
"""Partitions of Kafka's ``__consumer_offsets`` (and ``__transaction_state``): a group
or transactional id is coordinated by the leader of the partition its key hashes to."""


class NodeState(enum.Enum):
    UP = "up"
    STOPPED = "stopped"
    """Its listener is closed and its connections with it; it follows nothing."""
    ISOLATED = "isolated"
    """Its sockets stay open but nothing is answered, and it follows nothing."""


@dataclasses.dataclass(slots=True)
class Placement:
    """One partition's replicas, leader and in-sync replicas (node ids)."""

    replicas: tuple[int, ...]
    leader: int
    isr: set[int]
    caught_up: list[float]
    """Per replica slot, when that follower was last caught up with the leader's log end
    (the clock is the runtime's): one lagging longer than the lag bound leaves the ISR."""

    def slot(self, node: int) -> int:
        return self.replicas.index(node)

    def hw_slots(self) -> tuple[int, ...]:
        """The slots whose log ends bound the high watermark: the ISR but the leader."""
        return tuple(
            i for i, node in enumerate(self.replicas) if node in self.isr and node != self.leader
        )


class Topology:
    """``nodes`` nodes (ids ``0..nodes-1``) and the placements of every partition."""

    __slots__ = ("_next_start", "max_replicas_per_node", "placements", "states")

    def __init__(self, nodes: int, *, max_replicas_per_node: int) -> None:
        if not (isinstance(nodes, int) and nodes >= 1):
            raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
        self.states = [NodeState.UP] * nodes
        self.placements: dict[TopicPartition, Placement] = {}
        self.max_replicas_per_node = max_replicas_per_node
        self._next_start = 0
        """Where the next topic's first partition's leader goes: topics spread their
        leaders round the nodes from different starting points, as Kafka's assignment
        does from a random one (here the order is reproducible)."""

    @property
    def nodes(self) -> int:
        return len(self.states)

    def up(self, node: int) -> bool:
        return self.states[node] is NodeState.UP

    def live_nodes(self) -> list[int]:
        return [node for node, state in enumerate(self.states) if state is NodeState.UP]

    def hosted(self) -> list[int]:
        """Replicas held by each node."""
        counts = [0] * self.nodes
        for placement in self.placements.values():
            for node in placement.replicas:
                counts[node] += 1
        return counts

    # -- assignment ------------------------------------------------------------------

    def assign(
        self, topic: str, first: int, count: int, factor: int, now: float
    ) -> list[Placement]:
        """Place partitions ``first..first+count-1`` of ``topic`` with ``factor`` replicas
        each, leaders round the nodes; the preferred (first) replica leads if it is up,
        else the next that is.

        Raises:
            ValueError: ``factor`` outside 1..nodes, or a node would hold more than
                ``max_replicas_per_node`` replicas (nothing is placed then).
        """
        if not 1 <= factor <= self.nodes:
            raise ValueError(f"replication factor {factor} outside 1..{self.nodes}")
        start = self._next_start
        planned = []
        for index in range(first, first + count):
            lead = (start + index) % self.nodes
            replicas = tuple((lead + j) % self.nodes for j in range(factor))
            planned.append((TopicPartition(topic, index), replicas))
        counts = self.hosted()
        for _, replicas in planned:
            for node in replicas:
                counts[node] += 1
        if max(counts) > self.max_replicas_per_node:
            raise ValueError(
                f"a node would hold {max(counts)} replicas,"
                f" more than max_replicas_per_node={self.max_replicas_per_node}"
            )
        if first == 0:
            self._next_start = (start + 1) % self.nodes
        placements = []
        for tp, replicas in planned:
            live = [node for node in replicas if self.up(node)]
            placement = Placement(
                replicas=replicas,
                leader=live[0] if live else -1,
                isr=set(live),
                caught_up=[now] * factor,
            )
            self.placements[tp] = placement
            placements.append(placement)
        return placements

    def remove_topic(self, topic: str) -> None:
        for tp in [tp for tp in self.placements if tp.topic == topic]:
            del self.placements[tp]

    def led_by(self, node: int) -> Iterator[tuple[TopicPartition, Placement]]:
        return ((tp, p) for tp, p in self.placements.items() if p.leader == node)

    def elect(self, placement: Placement) -> int:
        """The replica to lead next: the first in replica order that is in the ISR and
        on a node that is up, other than the current leader; -1 if none is."""
        for node in placement.replicas:
            if node != placement.leader and node in placement.isr and self.up(node):
                return node
        return -1

    # -- coordinators ----------------------------------------------------------------

    def coordinator(self, key: str) -> int:
        """The node coordinating a group or transactional id: the leader of the
        coordinator partition its key hashes to, that partition's preferred node or,
        while it is not up, the next node that is (-1 if no node is up)."""
        return self.partition_leader(zlib.crc32(key.encode()) % COORDINATOR_PARTITIONS)

    def partition_leader(self, index: int) -> int:
        """The leader of coordinator partition ``index`` (as Metadata lists
        ``__consumer_offsets``)."""
        nodes = self.nodes
        for step in range(nodes):
            node = (index + step) % nodes
            if self.up(node):
                return node
        return -1

    def check(self) -> None:
        """Assert the invariants of the module's doc (tests call it)."""
        for tp, p in self.placements.items():
            assert p.isr <= set(p.replicas), (tp, p)
            if p.leader != -1:
                assert p.leader in p.isr, (tp, p)
                assert self.up(p.leader), (tp, p, self.states)
