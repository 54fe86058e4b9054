"""The topics' lifecycle: create, grow, delete and auto-create a topic, and start the
followers of its partitions.

Ground rules: this is the one place a topic is born or dies. A topic is created whole
or not at all (the core's partitions, their placements on the nodes, their followers);
a deleted one is forgotten everywhere at once, by the listeners registered with
:meth:`Topics.on_deleted` (the nodes, the producers, the transactions, the groups, the
admin APIs' configs), the way Kafka's metadata publishers are each told
``onPartitionsDeleted``. So a table keyed by topic registers its own forgetting here,
and this module knows none of them: the handlers above (:mod:`.topic_api`,
:mod:`.admin_api`) and the test verbs (:mod:`.control`) call down into it, nothing
here calls up.

The followers: on several nodes each is a task of the node holding the replica
(:mod:`.nodes`); on one node, ``replicas - 1`` simulated ones per partition live here,
fetching from the leader's log through the core's fetch purgatory as a real follower
does, so that acks=all and the high watermark wait for them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Final

from kio.schema.errors import ErrorCode

from .core import BrokerCore
from .limits import Limits
from .log import Partition, TopicPartition
from .nodes import Nodes
from .records import StoredBatch
from .topology import Topology

__all__ = ["FOLLOWER_MAX_WAIT", "TOPIC_NAME", "Topics", "legal_topic_name"]

FOLLOWER_MAX_WAIT: Final = 60.0
"""A simulated follower's fetch waits this long for data before asking again (a produce
or a topic deletion answers it sooner)."""
TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""Kafka's legal topic names (``Topic.validate``), but for ``.`` and ``..``."""


def legal_topic_name(name: str) -> bool:
    """Whether Kafka would accept ``name`` as a topic's."""
    return TOPIC_NAME.fullmatch(name) is not None and name not in (".", "..")


class Topics:
    """The topics of one broker: their creation, growth and deletion over the core and
    the nodes, and the simulated followers of a single node.

    Args:
        core: The log and its purgatories.
        topology: The nodes and the partitions' placements.
        nodes: Places a topic's partitions and runs their followers on several nodes.
        limits: The broker's limits (``max_topics``).
        default_partitions: Partitions of an auto-created topic.
        replicas: Replicas per partition, the leader included.
        follower_delay: Seconds each simulated follower waits after a fetch that
            brought data.
    """

    __slots__ = (
        "_listeners",
        "core",
        "default_partitions",
        "follower_delay",
        "followers",
        "limits",
        "nodes",
        "replicas",
        "topology",
    )

    def __init__(
        self,
        core: BrokerCore[StoredBatch],
        topology: Topology,
        nodes: Nodes,
        limits: Limits,
        *,
        default_partitions: int,
        replicas: int,
        follower_delay: float,
    ) -> None:
        self.core = core
        self.topology = topology
        self.nodes = nodes
        self.limits = limits
        self.default_partitions = default_partitions
        self.replicas = replicas
        self.follower_delay = follower_delay
        self.followers: set[asyncio.Task[None]] = set()
        """The simulated followers' tasks (one node only)."""
        self._listeners: list[Callable[[str], object]] = [nodes.forget_topic]
        """Told of each deleted topic, in the order registered. The nodes first: their
        followers of the topic are cancelled before anything else hears of it."""

    # -- listeners ----------------------------------------------------------------------

    def on_deleted(self, forget: Callable[[str], object]) -> None:
        """Have ``forget(topic)`` called for each topic deleted (after the core has
        dropped its partitions and answered what waited on them)."""
        self._listeners.append(forget)

    # -- create, grow, delete ----------------------------------------------------------

    def factor(self, topic: str) -> int:
        """``topic``'s replication factor."""
        placement = self.topology.placements.get(TopicPartition(topic, 0))
        return self.replicas if placement is None else len(placement.replicas)

    def ensure(self, name: str, create: bool) -> ErrorCode:
        """NONE if ``name`` exists, or was just created (``create``: Kafka's
        auto-creation, with the default partitions); else why not, as Metadata
        answers it."""
        if name in self.core.topics:
            return ErrorCode.none
        if not legal_topic_name(name):
            return ErrorCode.invalid_topic_exception
        if not create or len(self.core.topics) >= self.limits.max_topics:
            return ErrorCode.unknown_topic_or_partition
        try:
            self.create(name, self.default_partitions)
        except ValueError:  # the nodes hold as many replicas as they may
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.none

    def create(self, name: str, partitions: int, factor: int | None = None) -> None:
        """Create the topic's partitions in the core and start their followers: on one
        node the simulated ones, on several those of the nodes holding its replicas.
        The caller has checked the name, the count and ``max_topics``.

        Raises:
            ValueError: On several nodes, a node would hold more replicas than
                ``max_replicas_per_node`` (nothing is created).
        """
        if self.topology.nodes > 1:
            factor = self.replicas if factor is None else factor
            self.nodes.place(
                name,
                0,
                partitions,
                factor,
                lambda: self.core.create_topic(name, partitions, factor),
            )
            return
        self.core.create_topic(name, partitions)
        for index in range(partitions):
            self._simulate_followers(TopicPartition(name, index))

    def add_partitions(self, name: str, count: int) -> None:
        """Grow the topic to ``count`` partitions (CreatePartitions) and start the new
        partitions' followers.

        Raises:
            ValueError: A node would hold more than ``max_replicas_per_node`` replicas.
        """
        current = self.core.topics[name]
        if self.topology.nodes > 1:
            factor = len(self.topology.placements[TopicPartition(name, 0)].replicas)
            self.nodes.place(
                name,
                current,
                count - current,
                factor,
                lambda: self.core.add_partitions(name, count),
            )
            return
        for tp in self.core.add_partitions(name, count):
            self._simulate_followers(tp)

    def delete(self, name: str) -> bool:
        """Delete the topic: waiting fetches and produces are answered, followers stop,
        and every listener forgets it. False if there was no such topic."""
        if not self.core.delete_topic(name):
            return False
        for forget in self._listeners:
            forget(name)
        return True

    async def aclose(self) -> None:
        """Stop the simulated followers (the broker closes; the core closes after)."""
        for task in self.followers:
            task.cancel()
        await asyncio.gather(*self.followers, return_exceptions=True)

    # -- the simulated followers (one node) ---------------------------------------------

    def _simulate_followers(self, tp: TopicPartition) -> None:
        partition = self.core.partitions[tp]
        for replica in range(self.replicas - 1):
            task = asyncio.create_task(self._follow(partition, replica))
            self.followers.add(task)
            task.add_done_callback(self.followers.discard)

    async def _follow(self, partition: Partition[StoredBatch], replica: int) -> None:
        """A follower replica of ``partition``: fetches from the leader as Kafka's
        followers do, parked in the leader's own fetch purgatory, and reports its log end
        offset with each fetch (which moves the HW, which completes acks=all produces).
        The partition is the one it was started for: looked up when the task first runs,
        it could be a topic created again under the name in the meantime (which has its
        own followers), or gone."""
        offset = 0
        tp = partition.tp
        # Until the topic is deleted (a topic created again under its name has its own).
        while self.core.partitions.get(tp) is partition:
            op = self.core.fetch(
                {tp: offset}, min_bytes=1, max_wait=FOLLOWER_MAX_WAIT, replica=replica
            )
            fetched = (await op).get(tp, [])
            if fetched and self.follower_delay:
                await asyncio.sleep(self.follower_delay)  # a slow disk, a slow network
            if fetched:
                # From the last batch's end: the cleaner leaves gaps between batches.
                offset = fetched[-1].end
