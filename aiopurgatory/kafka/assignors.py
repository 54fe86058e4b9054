"""The server-side assignors of the consumer group protocol (KIP-848): ``uniform``
(Kafka's default) and ``range``, named by the client's ``group.remote.assignor``.

Ground rules: pure functions of their input, no state, no I/O. An assignor is given
each member's subscribed topic names, each subscribed topic's partition count and the
previous target assignment, and returns the new target: every partition of a
subscribed topic given to exactly one member subscribed to its topic (none when no
member is). It runs on what the coordinator bounds (members per group, topics and
partitions per broker), in O(P log M + M + T) for P partitions, M members and T
topics, so a client cannot make it work harder than the broker's own tables allow.

The target is only where the group is heading: the coordinator
(:mod:`.consumer_groups`) hands it out incrementally, a partition to its new owner only
once the old one has let go of it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Final

__all__ = ["ASSIGNORS", "DEFAULT_ASSIGNOR", "Target", "TopicPartitions", "range_assign", "uniform"]

TopicPartitions = frozenset[tuple[str, int]]
"""(topic name, partition index) pairs: one member's assignment."""
Target = dict[str, TopicPartitions]
"""Member id to its target assignment."""


def _subscribers(
    subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, list[str]]:
    """Each topic that exists and is subscribed to, to its subscribers (sorted ids)."""
    by_topic: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in dict.fromkeys(subscriptions[member]):
            if partitions.get(topic, 0) > 0:
                by_topic.setdefault(topic, []).append(member)
    return by_topic


def uniform(
    subscriptions: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, TopicPartitions],
) -> Target:
    """Kafka's ``uniform`` assignor, in spirit: as even as the subscriptions allow, and
    sticky. Each topic's partitions go to its subscribers; a partition stays with its
    previous owner while that owner is still subscribed and below its fair share (the
    ceiling of the partitions its subscribers share, over them), the others go one by
    one to the subscriber holding the fewest so far (ties to the smallest member id).

    With every member subscribed to the same topics (the usual case) this is Kafka's
    result up to which member gets which partition: counts differ by one at most and
    a member joining or leaving moves as few partitions as that allows.
    """
    result: dict[str, set[tuple[str, int]]] = {member: set() for member in subscriptions}
    by_topic = _subscribers(subscriptions, partitions)
    if not by_topic:
        return {member: frozenset() for member in subscriptions}
    # Topics grouped by who subscribes to them: one fair share per group of topics.
    groups: dict[tuple[str, ...], list[str]] = {}
    for topic in sorted(by_topic):
        groups.setdefault(tuple(by_topic[topic]), []).append(topic)
    owner_of = {tp: member for member, tps in previous.items() for tp in tps}
    for members, topics in groups.items():
        total = sum(partitions[topic] for topic in topics)
        share = -(-total // len(members))  # the ceiling
        eligible = set(members)
        loose: list[tuple[str, int]] = []
        for topic in topics:
            for index in range(partitions[topic]):
                owner = owner_of.get((topic, index))
                if owner in eligible and len(result[owner]) < share:
                    result[owner].add((topic, index))
                else:
                    loose.append((topic, index))
        # The fewest first: a heap of (count, member id), stale entries skipped.
        heap = [(len(result[member]), member) for member in members]
        heapq.heapify(heap)
        for tp in loose:
            while True:
                count, member = heapq.heappop(heap)
                if count == len(result[member]):
                    break
            result[member].add(tp)
            heapq.heappush(heap, (count + 1, member))
    return {member: frozenset(tps) for member, tps in result.items()}


def range_assign(
    subscriptions: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, TopicPartitions],
) -> Target:
    """Kafka's ``range`` assignor: per topic, its partitions in contiguous ranges over
    its subscribers sorted by member id, the first ``count % subscribers`` of them one
    partition more (so members subscribed to the same topics get the same partition
    indexes of each, which co-partitioned topics want). ``previous`` is not used."""
    result: dict[str, set[tuple[str, int]]] = {member: set() for member in subscriptions}
    for topic, members in _subscribers(subscriptions, partitions).items():
        count = partitions[topic]
        each, extra = divmod(count, len(members))
        start = 0
        for position, member in enumerate(members):
            size = each + (1 if position < extra else 0)
            result[member].update((topic, index) for index in range(start, start + size))
            start += size
    return {member: frozenset(tps) for member, tps in result.items()}


Assignor = Callable[
    [Mapping[str, Sequence[str]], Mapping[str, int], Mapping[str, TopicPartitions]], Target
]
ASSIGNORS: Final[dict[str, Assignor]] = {"uniform": uniform, "range": range_assign}
"""The assignors served, by the name a client gives (``group.remote.assignor``); any
other name is refused UNSUPPORTED_ASSIGNOR, as Kafka refuses one it is not configured
with."""
DEFAULT_ASSIGNOR: Final = "uniform"
"""Kafka's first ``group.consumer.assignors``: used unless members name another."""
