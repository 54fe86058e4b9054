"""The broker core's delayed operations: acks=all produces and fetches waiting for bytes.

Ground rules: an operation reads partitions (:mod:`.log`) and decides; it never changes
them. Whoever changes a partition (the core, :mod:`.core`) re-checks the operations
watching it in their purgatory, keyed by :class:`~.log.TopicPartition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiopurgatory as ap

from .log import MAX_PARTITION_BYTES, E, Error, Partition, TopicPartition

__all__ = ["DelayedLogFetch", "DelayedProduce"]


class DelayedProduce(ap.DelayedOperation[dict[TopicPartition, Error]]):
    """acks=all: complete when the HW reaches ``required[p]`` on every partition ``p``.

    A partition whose leader changed (its epoch moved on) before the HW covered it
    completes the operation at once, answered NOT_LEADER_OR_FOLLOWER there, as Kafka's
    does: its records may have been truncated, the producer retries with the new leader
    (and its idempotence recognises what survived). What the HW covered stays answered
    NONE: the HW never moves down, and a truncation never goes below it.
    """

    __slots__ = ("epochs", "required")

    def __init__(self, required: Mapping[Partition[Any], int], timeout: float) -> None:
        super().__init__(timeout)
        self.required = dict(required)
        self.epochs = {p: p.epoch for p in self.required}
        """Each partition's leader epoch when the produce was made."""

    def try_complete(self) -> bool:
        epochs = self.epochs
        covered = True
        for p, end in self.required.items():
            if p.hw < end and not p.deleted:
                if p.epoch != epochs[p]:
                    return self.force_complete()  # a new leader: answered at once
                covered = False
        return covered and self.force_complete()

    def on_complete(self) -> dict[TopicPartition, Error]:
        # On the timeout path some partitions may be covered and others not.
        epochs = self.epochs
        return {p.tp: _produce_error(p, end, epochs[p]) for p, end in self.required.items()}


def _produce_error(partition: Partition[Any], end: int, epoch: int) -> Error:
    if partition.deleted:
        return Error.UNKNOWN_TOPIC_OR_PARTITION
    if partition.hw >= end:
        return Error.NONE
    if partition.epoch != epoch:
        return Error.NOT_LEADER_OR_FOLLOWER
    return Error.REQUEST_TIMED_OUT


class DelayedLogFetch(ap.DelayedOperation[dict[TopicPartition, list[E]]]):
    """Complete when ``min_bytes`` are readable past ``offsets``; else after ``max_wait``.

    It also completes at once when one of its offsets leaves its partition's range (the
    topic was deleted, or retention passed it): the caller answers that partition with
    an error; and when a partition's leader changes (its epoch moves on, :meth:`stale`):
    that partition reads nothing, and the caller answers as the new leadership says.
    The result reads each partition up to ``max_partition_bytes`` (or its own entry in
    ``partition_max_bytes``) and, with ``max_bytes``, the whole response up to that; the
    first entry read is returned even when larger (Kafka's KIP-74).
    """

    __slots__ = (
        "epochs",
        "follower",
        "max_bytes",
        "max_partition_bytes",
        "min_bytes",
        "offsets",
        "partition_max_bytes",
    )

    def __init__(
        self,
        offsets: Mapping[Partition[E], int],
        *,
        min_bytes: int,
        max_wait: float,
        follower: bool,
        max_partition_bytes: int = MAX_PARTITION_BYTES,
        partition_max_bytes: Mapping[Partition[E], int] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(max_wait)
        self.offsets = dict(offsets)
        self.epochs = {p: p.epoch for p in self.offsets}
        """Each partition's leader epoch when the fetch was made."""
        self.min_bytes = min_bytes
        self.follower = follower
        self.max_partition_bytes = max_partition_bytes
        self.partition_max_bytes = dict(partition_max_bytes or {})
        self.max_bytes = max_bytes

    def limit(self, partition: Partition[E]) -> int:
        """Followers read up to the log end; consumers only what is committed (the HW)."""
        return partition.leo if self.follower else partition.hw

    def stale(self, partition: Partition[E]) -> bool:
        """Whether ``partition``'s leader changed since the fetch was made."""
        return partition.epoch != self.epochs[partition]

    def _partition_limit(self, partition: Partition[E]) -> int:
        return self.partition_max_bytes.get(partition, self.max_partition_bytes)

    def try_complete(self) -> bool:
        available = 0
        follower = self.follower
        epochs = self.epochs
        for p, offset in self.offsets.items():
            if not p.in_range(offset) or p.epoch != epochs[p]:
                return self.force_complete()  # answered at once, with the error
            # As Kafka counts it: what this fetch could return of each partition. (A
            # consumer waiting at the end, the usual case, has nothing to count.)
            if offset < (p.leo if follower else p.hw):
                bytes_ = p.available_bytes(offset, self.limit(p))
                available += min(bytes_, self._partition_limit(p))
        return available >= self.min_bytes and self.force_complete()

    def on_complete(self) -> dict[TopicPartition, list[E]]:
        result: dict[TopicPartition, list[E]] = {}
        remaining = self.max_bytes
        min_one = True
        epochs = self.epochs
        for p, offset in self.offsets.items():
            limit = self.limit(p)
            if offset >= limit or not p.in_range(offset) or p.epoch != epochs[p]:
                result[p.tp] = []  # nothing to read (at the end), or the error
                continue
            budget = self._partition_limit(p)
            if remaining is not None:
                budget = min(budget, remaining)
            if budget <= 0 and not min_one:
                result[p.tp] = []
                continue
            read = p.read(offset, limit, budget, min_one=min_one)
            result[p.tp] = read
            if read and remaining is not None:
                # With a response limit only the first non-empty partition may exceed it.
                min_one = False
                remaining -= sum(entry.size for entry in read)
        return result
