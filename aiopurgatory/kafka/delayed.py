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
    """acks=all: complete when the HW reaches ``required[p]`` on every partition ``p``."""

    __slots__ = ("required",)

    def __init__(self, required: Mapping[Partition[Any], int], timeout: float) -> None:
        super().__init__(timeout)
        self.required = dict(required)

    def try_complete(self) -> bool:
        covered = all(p.hw >= end or p.deleted for p, end in self.required.items())
        return covered and self.force_complete()

    def on_complete(self) -> dict[TopicPartition, Error]:
        # On the timeout path some partitions may be covered and others not.
        return {p.tp: _produce_error(p, end) for p, end in self.required.items()}


def _produce_error(partition: Partition[Any], end: int) -> Error:
    if partition.deleted:
        return Error.UNKNOWN_TOPIC_OR_PARTITION
    return Error.NONE if partition.hw >= end else Error.REQUEST_TIMED_OUT


class DelayedLogFetch(ap.DelayedOperation[dict[TopicPartition, list[E]]]):
    """Complete when ``min_bytes`` are readable past ``offsets``; else after ``max_wait``.

    It also completes at once when one of its offsets leaves its partition's range (the
    topic was deleted, or retention passed it): the caller answers that partition with
    an error. The result reads each partition up to ``max_partition_bytes`` (or its own
    entry in ``partition_max_bytes``) and, with ``max_bytes``, the whole response up to
    that; the first entry read is returned even when larger (Kafka's KIP-74).
    """

    __slots__ = (
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
        self.min_bytes = min_bytes
        self.follower = follower
        self.max_partition_bytes = max_partition_bytes
        self.partition_max_bytes = dict(partition_max_bytes or {})
        self.max_bytes = max_bytes

    def limit(self, partition: Partition[E]) -> int:
        """Followers read up to the log end; consumers only what is committed (the HW)."""
        return partition.leo if self.follower else partition.hw

    def _partition_limit(self, partition: Partition[E]) -> int:
        return self.partition_max_bytes.get(partition, self.max_partition_bytes)

    def try_complete(self) -> bool:
        available = 0
        follower = self.follower
        for p, offset in self.offsets.items():
            if not p.in_range(offset):
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
        for p, offset in self.offsets.items():
            limit = self.limit(p)
            if offset >= limit or not p.in_range(offset):
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
