"""A Kafka-like broker in one process, whose produce and fetch requests wait in purgatories.

Each partition has a leader log; followers fetch from it, and the high watermark (HW)
is the offset every replica has reached. What cannot be answered yet waits:

* ``DelayedProduce`` (acks=all) completes once the HW covers the produced records on
  every partition of the request, or at its timeout with ``REQUEST_TIMED_OUT`` for each
  partition still uncovered;
* ``DelayedFetch`` completes once ``min_bytes`` are readable past its offsets (up to
  the HW for consumers, up to the log end for followers), or after ``max_wait`` with
  whatever there is.

:func:`run_simulation` drives a :class:`Broker` with producer, consumer and follower
tasks; ``aiopurgatory demo`` traces it, and ``examples/broker/sim.py`` in the repository
is its command line. Not modelled: the ISR shrinking
around a follower that stalls (Kafka drops it after ``replica.lag.time.max.ms``), so a
stall holds the HW back and produces time out, which is the point here.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import enum
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import aiopurgatory as ap
from aiopurgatory.timer import Clock

__all__ = [
    "Broker",
    "BrokerCore",
    "DelayedFetch",
    "DelayedLogFetch",
    "DelayedProduce",
    "Entry",
    "Error",
    "Partition",
    "Percentiles",
    "Record",
    "SimulationConfig",
    "SimulationReport",
    "TopicPartition",
    "run_simulation",
]

MAX_PARTITION_BYTES = 1024 * 1024
"""Bytes a fetch returns per partition at most (at least one entry, as in Kafka)."""


class Error(enum.IntEnum):
    """Per-partition result of a produce or fetch (Kafka's error codes)."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    REQUEST_TIMED_OUT = 7


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Entry(Protocol):
    """What a partition's log holds: one record (the simulator) or a batch of them (the
    Kafka-protocol broker, ``examples/kafka_broker``, which stores batches as they arrive)."""

    @property
    def size(self) -> int:
        """Bytes."""

    @property
    def count(self) -> int:
        """Offsets it takes: an entry's records have consecutive offsets."""


E = TypeVar("E", bound=Entry)


@dataclass(frozen=True, slots=True)
class Record:
    size: int
    """Bytes."""
    produced_at: float
    """Broker clock time at which the leader appended it."""

    def __post_init__(self) -> None:
        if not (isinstance(self.size, int) and self.size >= 0):
            raise ValueError(f"a record's size must be an integer >= 0, got {self.size!r}")

    @property
    def count(self) -> int:
        return 1


class Partition(Generic[E]):
    """A leader's log and the log end offsets (LEO) its followers have reported.

    The log is a list of entries, each taking ``entry.count`` consecutive offsets. With
    ``retain_bytes`` the oldest entries the HW has passed are dropped once the log holds
    more than that, as Kafka's retention does (``log_start`` moves up); the newest entry
    is always kept.
    """

    __slots__ = (
        "_bases",
        "_head",
        "_leo",
        "_positions",
        "deleted",
        "entries",
        "follower_leos",
        "hw",
        "log_start",
        "retain_bytes",
        "tp",
    )

    def __init__(self, tp: TopicPartition, followers: int, retain_bytes: int | None = None) -> None:
        if retain_bytes is not None and retain_bytes < 0:
            raise ValueError(f"retain_bytes must be >= 0 or None, got {retain_bytes!r}")
        self.tp = tp
        self.entries: list[E] = []
        """The log from ``entries[_head]`` on (see :meth:`retained`); the entries before
        ``_head`` were dropped, and are cut off in chunks, so a drop is amortised O(1)."""
        self._head = 0
        self._bases: list[int] = []
        """``_bases[i]``: the offset of ``entries[i]``'s first record, for bisection."""
        self._positions = [0]
        """``_positions[i]``: bytes appended before ``entries[i]``, so byte counts are O(1)."""
        self._leo = 0
        self.log_start = 0
        self.follower_leos = [0] * followers
        self.hw = 0
        self.retain_bytes = retain_bytes
        self.deleted = False
        """Set when its topic is deleted: a fetch watching it completes at once."""

    @property
    def leo(self) -> int:
        """Log end offset: the offset of the next record."""
        return self._leo

    @property
    def retained_bytes(self) -> int:
        return self._positions[-1] - self._positions[self._head]

    def append(self, entries: Sequence[E]) -> int:
        """Append ``entries``; returns the log end offset after them."""
        for entry in entries:
            self.entries.append(entry)
            self._bases.append(self._leo)
            self._positions.append(self._positions[-1] + entry.size)
            self._leo += entry.count
        self._advance_hw()  # without followers the leader alone is "all replicas"
        self._retain()
        return self._leo

    def retained(self) -> list[E]:
        """The entries still in the log (from ``log_start``), oldest first."""
        return self.entries[self._head :]

    def first_at_least(self, value: Any, key: Callable[[E], Any]) -> tuple[int, E] | None:
        """The first entry still in the log whose ``key`` is at least ``value``, with its
        offset; None when there is none. ``key`` must not decrease along the log (a
        running maximum, say): the search is a bisection, O(log n), and copies nothing."""
        index = bisect.bisect_left(self.entries, value, self._head, key=key)
        if index == len(self.entries):
            return None
        return self._bases[index], self.entries[index]

    def in_range(self, offset: int) -> bool:
        """Whether a fetch may start at ``offset`` (Kafka: log start to log end)."""
        return not self.deleted and self.log_start <= offset <= self._leo

    def update_follower(self, replica: int, leo: int) -> bool:
        """Record a follower's LEO; True if the HW moved."""
        if not 0 <= replica < len(self.follower_leos):
            raise ValueError(f"{self.tp} has no follower {replica}")
        if not 0 <= leo <= self._leo:
            raise ValueError(f"follower LEO {leo} outside {self.tp}'s log [0, {self._leo}]")
        self.follower_leos[replica] = leo
        return self._advance_hw()

    def _span(self, offset: int, limit: int) -> tuple[int, int]:
        """Entry indexes ``[first, end)``: from the entry holding ``offset`` to the last one
        ending at or before ``limit``."""
        if offset >= limit or offset >= self._leo:
            return 0, 0
        first = max(bisect.bisect_right(self._bases, offset, self._head) - 1, self._head)
        end = bisect.bisect_left(self._bases, limit, first)
        if end > first and self._bases[end - 1] + self.entries[end - 1].count > limit:
            end -= 1  # an entry straddling the limit is not readable yet
        return first, end

    def available_bytes(self, offset: int, limit: int) -> int:
        """Bytes of the entries from ``offset`` up to (not including) ``limit``."""
        first, end = self._span(offset, limit)
        return self._positions[end] - self._positions[first] if end > first else 0

    def read(self, offset: int, limit: int, max_bytes: int, *, min_one: bool = True) -> list[E]:
        """Entries from ``offset`` before ``limit``, ``max_bytes`` worth; with ``min_one``
        at least one even when it is larger (Kafka's KIP-74: a big record never stalls)."""
        first, end = self._span(offset, limit)
        if end <= first:
            return []
        budget = self._positions[first] + max_bytes
        stop = min(bisect.bisect_right(self._positions, budget, first, end + 1) - 1, end)
        if min_one:
            stop = max(stop, first + 1)
        return self.entries[first:stop]

    def _advance_hw(self) -> bool:
        hw = min(self.follower_leos, default=self._leo)
        if hw <= self.hw:
            return False
        self.hw = hw
        return True

    @property
    def retained_count(self) -> int:
        """Entries in the log."""
        return len(self.entries) - self._head

    def drop_oldest(self) -> int:
        """Drop the oldest entry if the HW has passed it and it is not the newest;
        returns the bytes freed (0: nothing could go)."""
        head = self._head
        if head >= len(self.entries) - 1 or self._bases[head] + self.entries[head].count > self.hw:
            # What every replica and consumer may still need stays.
            return 0
        freed = self._positions[head + 1] - self._positions[head]
        head += 1
        self._head = head
        self.log_start = self._bases[head]
        if head > 64 and head * 2 > len(self.entries):  # compact: amortised O(1) per entry
            del self.entries[:head]
            del self._bases[:head]
            del self._positions[:head]
            self._head = 0
        return freed

    def _retain(self) -> None:
        if self.retain_bytes is None:
            return
        while self.retained_bytes > self.retain_bytes and self.drop_oldest():
            pass


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
        for p, offset in self.offsets.items():
            if not p.in_range(offset):
                return self.force_complete()  # answered at once, with the error
            # As Kafka counts it: what this fetch could return of each partition.
            bytes_ = p.available_bytes(offset, self.limit(p))
            available += min(bytes_, self._partition_limit(p))
        return available >= self.min_bytes and self.force_complete()

    def on_complete(self) -> dict[TopicPartition, list[E]]:
        result: dict[TopicPartition, list[E]] = {}
        remaining = self.max_bytes
        min_one = True
        for p, offset in self.offsets.items():
            budget = self._partition_limit(p)
            if remaining is not None:
                budget = min(budget, remaining)
            if not p.in_range(offset) or (budget <= 0 and not min_one):
                result[p.tp] = []
                continue
            read = p.read(offset, self.limit(p), budget, min_one=min_one)
            result[p.tp] = read
            if read and remaining is not None:
                # With a response limit only the first non-empty partition may exceed it.
                min_one = False
                remaining -= sum(entry.size for entry in read)
        return result


class DelayedFetch(DelayedLogFetch[Record]):
    """The simulator's fetch: records."""

    __slots__ = ()


class BrokerCore(Generic[E]):
    """Topics' partitions and the produce and fetch purgatories, over entries of type E.

    Events re-check the purgatories synchronously, as Kafka does: an append checks
    the fetches (followers read up to the log end), an HW move checks the produces
    and the fetches (consumers read up to the HW). The simulator (:class:`Broker`)
    stores :class:`Record` entries; the Kafka-protocol broker in
    ``examples/kafka_broker`` stores record batches in this same core.
    """

    def __init__(
        self,
        *,
        followers: int = 2,
        retain_bytes: int | None = None,
        retain_total_bytes: int | None = None,
        clock: Clock | None = None,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        if followers < 0:
            raise ValueError(f"followers must be >= 0, got {followers!r}")
        for name, value in (
            ("retain_bytes", retain_bytes),
            ("retain_total_bytes", retain_total_bytes),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value!r}")
        self.followers = followers
        self.retain_bytes = retain_bytes
        """Per partition: older entries beyond it are dropped once the HW passed them."""
        self.retain_total_bytes = retain_total_bytes
        """Across partitions: the oldest entries anywhere are dropped beyond it."""
        self.retained_bytes = 0
        self._retained_count = 0
        self._arrivals: collections.deque[tuple[Partition[E], int]] = collections.deque()
        """(partition, offset) of each entry in the order they arrived, for the total
        limit: the leftmost still in its log is the oldest anywhere."""
        self.partitions: dict[TopicPartition, Partition[E]] = {}
        self.topics: dict[str, int] = {}
        """Topic name to its number of partitions."""
        self.produce_purgatory = ap.Purgatory("produce", clock=clock, observer=observer)
        self.fetch_purgatory = ap.Purgatory("fetch", clock=clock, observer=observer)

    def create_topic(self, topic: str, partitions: int) -> bool:
        """Create ``topic`` with ``partitions`` partitions; False if it exists already."""
        if not (isinstance(partitions, int) and partitions >= 1):
            raise ValueError(f"a topic needs at least 1 partition, got {partitions!r}")
        if topic in self.topics:
            return False
        self.topics[topic] = partitions
        for i in range(partitions):
            tp = TopicPartition(topic, i)
            self.partitions[tp] = Partition(tp, self.followers, self.retain_bytes)
        return True

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic``; fetches reading it complete at once. False if unknown."""
        count = self.topics.pop(topic, None)
        if count is None:
            return False
        for i in range(count):
            partition = self.partitions.pop(TopicPartition(topic, i))
            partition.deleted = True
            self.retained_bytes -= partition.retained_bytes
            self._retained_count -= partition.retained_count
            # What waits on it is answered now, with UNKNOWN_TOPIC_OR_PARTITION.
            self.fetch_purgatory.check_and_complete(partition.tp)
            self.produce_purgatory.check_and_complete(partition.tp)
        return True

    def append(self, batches: Mapping[TopicPartition, Sequence[E]]) -> dict[Partition[E], int]:
        """Append ``batches`` to the leader logs; returns each partition's LEO after them.

        The whole request is validated before anything is appended: an unknown
        partition or an empty request raises ValueError and changes nothing.
        """
        if not batches:
            raise ValueError("a produce request needs at least one partition")
        partitions = [(self._partition(tp), list(entries)) for tp, entries in batches.items()]
        required: dict[Partition[E], int] = {}
        for partition, entries in partitions:
            bytes_before, count_before = partition.retained_bytes, partition.retained_count
            if self.retain_total_bytes is not None:
                offset = partition.leo
                for entry in entries:
                    self._arrivals.append((partition, offset))
                    offset += entry.count
            required[partition] = partition.append(entries)
            self.retained_bytes += partition.retained_bytes - bytes_before
            self._retained_count += partition.retained_count - count_before
            # Followers (and consumers, when there are no followers) can read more.
            self.fetch_purgatory.check_and_complete(partition.tp)
        self._retain_total()
        return required

    def over_retention(self) -> bool:
        """More than ``retain_total_bytes`` held, none of it droppable yet (the HW has
        not passed it): the caller should refuse more until the followers catch up."""
        self._retain_total()
        limit = self.retain_total_bytes
        return limit is not None and self.retained_bytes > limit

    def _retain_total(self) -> None:
        limit = self.retain_total_bytes
        if limit is None:
            return
        arrivals = self._arrivals
        while self.retained_bytes > limit and arrivals:
            partition, offset = arrivals.popleft()
            if partition.deleted or offset < partition.log_start:
                continue  # gone already: deleted, or dropped by the partition's own limit
            freed = partition.drop_oldest()
            if not freed:
                arrivals.appendleft((partition, offset))  # not replicated yet: keep it
                break
            self.retained_bytes -= freed
            self._retained_count -= 1
        if len(arrivals) > 2 * self._retained_count + 1024:
            # Entries dropped by other means leave stale arrivals: sweep them (amortised).
            self._arrivals = collections.deque(
                (p, o) for p, o in arrivals if not p.deleted and o >= p.log_start
            )

    def produce(
        self, batches: Mapping[TopicPartition, Sequence[E]], timeout: float
    ) -> DelayedProduce:
        """Append ``batches``; the operation acknowledges them (acks=all).

        Validated first (ValueError and nothing appended): unknown partitions, an empty
        request, a bad timeout.
        """
        _check_seconds("timeout", timeout)
        return self.acknowledge(self.append(batches), timeout)

    def acknowledge(self, required: Mapping[Partition[E], int], timeout: float) -> DelayedProduce:
        """acks=all for what :meth:`append` returned: done when the HW covers it."""
        op = DelayedProduce(required, timeout)
        return self.produce_purgatory.try_complete_else_watch(op, [p.tp for p in required])

    def fetch(
        self,
        offsets: Mapping[TopicPartition, int],
        *,
        min_bytes: int,
        max_wait: float,
        replica: int | None = None,
        max_partition_bytes: int = MAX_PARTITION_BYTES,
        partition_max_bytes: Mapping[TopicPartition, int] | None = None,
        max_bytes: int | None = None,
    ) -> DelayedLogFetch[E]:
        """Fetch from ``offsets``; a follower's (``replica``) offsets are also its LEOs.

        An offset outside its partition's log completes the fetch at once (the caller
        answers OFFSET_OUT_OF_RANGE for it). ValueError, before anything changes, for
        ``min_bytes < 0``, a bad ``max_wait``, an unknown partition or replica, or a
        follower offset beyond the log end.
        """
        if not (isinstance(min_bytes, int) and min_bytes >= 0):
            raise ValueError(f"min_bytes must be an integer >= 0, got {min_bytes!r}")
        _check_seconds("max_wait", max_wait)
        if not offsets:
            raise ValueError("a fetch request needs at least one partition")
        resolved: dict[Partition[E], int] = {}
        for tp, offset in offsets.items():
            partition = self._partition(tp)
            if replica is not None:
                if not 0 <= replica < len(partition.follower_leos):
                    raise ValueError(f"{tp} has no follower {replica}")
                if not 0 <= offset <= partition.leo:
                    raise ValueError(
                        f"fetch offset {offset} out of range for {tp} (limit {partition.leo})"
                    )
            resolved[partition] = offset
        if replica is not None:
            for partition, offset in resolved.items():
                if partition.update_follower(replica, offset):
                    self.produce_purgatory.check_and_complete(partition.tp)
                    self.fetch_purgatory.check_and_complete(partition.tp)
        limits = {self.partitions[tp]: n for tp, n in (partition_max_bytes or {}).items()}
        op = self.new_fetch(
            resolved,
            min_bytes=min_bytes,
            max_wait=max_wait,
            follower=replica is not None,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=limits,
            max_bytes=max_bytes,
        )
        return self.fetch_purgatory.try_complete_else_watch(op, list(offsets))

    def new_fetch(
        self,
        offsets: Mapping[Partition[E], int],
        *,
        min_bytes: int,
        max_wait: float,
        follower: bool,
        max_partition_bytes: int,
        partition_max_bytes: Mapping[Partition[E], int],
        max_bytes: int | None,
    ) -> DelayedLogFetch[E]:
        """The fetch operation :meth:`fetch` registers (a subclass may refine it)."""
        return DelayedLogFetch(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            follower=follower,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )

    def close(self) -> None:
        self.produce_purgatory.close()
        self.fetch_purgatory.close()

    def _partition(self, tp: TopicPartition) -> Partition[E]:
        try:
            return self.partitions[tp]
        except KeyError:
            raise ValueError(f"unknown partition {tp}") from None


class Broker(BrokerCore[Record]):
    """The simulator's broker: one topic of :class:`Record` entries.

    Its fetches are strict: a consumer offset beyond the HW is a ValueError (the
    simulator's consumers never send one), where the Kafka-protocol broker answers
    OFFSET_OUT_OF_RANGE.
    """

    def __init__(
        self,
        topic: str = "events",
        partitions: int = 4,
        followers: int = 2,
        *,
        clock: Clock | None = None,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        super().__init__(followers=followers, clock=clock, observer=observer)
        self.create_topic(topic, partitions)

    def produce(
        self, batches: Mapping[TopicPartition, Sequence[Record]], timeout: float
    ) -> DelayedProduce:
        """Append ``batches`` to the leader logs; the operation acknowledges them (acks=all).

        The whole request is validated before anything is appended: a bad one
        (unknown partition, empty, a bad timeout) raises ValueError and changes nothing.
        """
        _check_seconds("timeout", timeout)
        for records in batches.values():
            if not all(isinstance(record, Record) for record in records):
                raise ValueError("a batch holds Record objects")
        return super().produce(batches, timeout)

    def fetch(
        self,
        offsets: Mapping[TopicPartition, int],
        *,
        min_bytes: int,
        max_wait: float,
        replica: int | None = None,
        max_partition_bytes: int = MAX_PARTITION_BYTES,
        partition_max_bytes: Mapping[TopicPartition, int] | None = None,
        max_bytes: int | None = None,
    ) -> DelayedFetch:
        if replica is None:
            for tp, offset in offsets.items():
                partition = self._partition(tp)
                if not 0 <= offset <= partition.hw:
                    raise ValueError(
                        f"fetch offset {offset} out of range for {tp} (limit {partition.hw})"
                    )
        op = super().fetch(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            replica=replica,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )
        assert isinstance(op, DelayedFetch)  # made by new_fetch below
        return op

    def new_fetch(
        self,
        offsets: Mapping[Partition[Record], int],
        *,
        min_bytes: int,
        max_wait: float,
        follower: bool,
        max_partition_bytes: int,
        partition_max_bytes: Mapping[Partition[Record], int],
        max_bytes: int | None,
    ) -> DelayedFetch:
        return DelayedFetch(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            follower=follower,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )


def _check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


# -- the simulation ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """What to simulate; times in seconds, rates per second."""

    duration: float = 10.0
    partitions: int = 4
    followers: int = 2
    producers: int = 4
    produce_rate: float = 100.0
    """Produce requests per second, per producer."""
    partitions_per_request: int = 2
    records_per_batch: int = 5
    record_size: int = 100
    produce_timeout: float = 0.5
    consumers: int = 2
    fetch_min_bytes: int = 4096
    fetch_max_wait: float = 0.2
    follower_max_wait: float = 0.5
    replica_lag: float = 0.005
    """How long a follower takes to write what it fetched before it fetches again."""
    stall_at: float = 3.0
    """When follower 0 stops fetching (seconds into the run)..."""
    stall_for: float = 1.0
    """...and for how long (0: it never stalls)."""
    seed: int = 0

    def __post_init__(self) -> None:
        at_least = {"partitions": 1, "producers": 1, "records_per_batch": 1, "record_size": 1}
        at_least |= {"followers": 0, "consumers": 0, "fetch_min_bytes": 0}
        for name, least in at_least.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)!r}")
        if not 1 <= self.partitions_per_request <= self.partitions:
            raise ValueError("partitions_per_request must be between 1 and partitions")
        if not (math.isfinite(self.produce_rate) and self.produce_rate > 0):
            raise ValueError(f"produce_rate must be > 0, got {self.produce_rate!r}")
        seconds = ("duration", "produce_timeout", "fetch_max_wait", "follower_max_wait")
        for name in (*seconds, "replica_lag", "stall_at", "stall_for"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Nearest-rank percentiles of a sample, in seconds (NaN when it is empty)."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Percentiles:
        if not samples:
            return cls(0, math.nan, math.nan, math.nan)
        ordered = sorted(samples)

        def rank(q: float) -> float:
            return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]

        return cls(len(ordered), rank(0.5), rank(0.99), ordered[-1])

    def __str__(self) -> str:
        ms = [f"{v * 1e3:.1f}" for v in (self.p50, self.p99, self.max)]
        return f"p50 {ms[0]} ms, p99 {ms[1]} ms, max {ms[2]} ms (n={self.count})"


@dataclass(frozen=True, slots=True)
class SimulationReport:
    """What a run did: partition batches, latencies and the purgatories' final counts."""

    config: SimulationConfig
    elapsed: float
    produce_requests: int
    records_produced: int
    acknowledged: int
    """Partition batches acknowledged (acks=all satisfied)."""
    timed_out: int
    """Partition batches answered REQUEST_TIMED_OUT."""
    records_fetched: int
    """Records delivered to consumers, summed over consumers."""
    produce_latency: Percentiles
    """Request to acknowledgement, for requests acknowledged on every partition."""
    fetch_wait: Percentiles
    """How long consumer fetches waited."""
    end_to_end: Percentiles
    """Append to delivery to a consumer."""
    produce_stats: ap.PurgatoryStats
    fetch_stats: ap.PurgatoryStats

    def format(self) -> str:
        def outcomes(stats: ap.PurgatoryStats) -> str:
            return (
                f"{stats.completed} completed, {stats.expired} expired, "
                f"{stats.cancelled} cancelled, {stats.pending} pending"
            )

        return "\n".join(
            [
                f"simulated:        {self.elapsed:.2f} s",
                f"produced:         {self.produce_requests} requests, "
                f"{self.records_produced} records",
                f"acknowledged:     {self.acknowledged} partition batches",
                f"timed out:        {self.timed_out} partition batches",
                f"fetched:          {self.records_fetched} records by consumers",
                f"produce latency:  {self.produce_latency}",
                f"fetch wait:       {self.fetch_wait}",
                f"end to end:       {self.end_to_end}",
                f"produce purgatory: {outcomes(self.produce_stats)}",
                f"fetch purgatory:   {outcomes(self.fetch_stats)}",
            ]
        )


class _Simulation:
    def __init__(self, config: SimulationConfig, observer: ap.OperationObserver | None) -> None:
        self.config = config
        self.broker = Broker(
            partitions=config.partitions, followers=config.followers, observer=observer
        )
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.rng = random.Random(config.seed)
        self.acks: set[asyncio.Task[None]] = set()
        self.produce_requests = 0
        self.records_produced = 0
        self.acknowledged = 0
        self.timed_out = 0
        self.records_fetched = 0
        self.produce_latency: list[float] = []
        self.fetch_wait: list[float] = []
        self.end_to_end: list[float] = []

    async def run(self) -> SimulationReport:
        config = self.config
        producers = [asyncio.create_task(self.produce()) for _ in range(config.producers)]
        others = [asyncio.create_task(self.follow(r)) for r in range(config.followers)]
        others += [asyncio.create_task(self.consume()) for _ in range(config.consumers)]
        try:
            await asyncio.sleep(config.duration)
            await _cancel(producers)
            # Every request sent gets its answer: by the HW or at its timeout.
            if self.acks:
                await asyncio.wait(self.acks)
            elapsed = self.loop.time() - self.start
        finally:
            await _cancel(producers + others + list(self.acks))
            self.broker.close()
        return SimulationReport(
            config=config,
            elapsed=elapsed,
            produce_requests=self.produce_requests,
            records_produced=self.records_produced,
            acknowledged=self.acknowledged,
            timed_out=self.timed_out,
            records_fetched=self.records_fetched,
            produce_latency=Percentiles.of(self.produce_latency),
            fetch_wait=Percentiles.of(self.fetch_wait),
            end_to_end=Percentiles.of(self.end_to_end),
            produce_stats=self.broker.produce_purgatory.stats,
            fetch_stats=self.broker.fetch_purgatory.stats,
        )

    async def produce(self) -> None:
        config = self.config
        tps = list(self.broker.partitions)
        interval = 1.0 / config.produce_rate
        next_at = self.loop.time()
        while True:
            next_at += interval
            await asyncio.sleep(next_at - self.loop.time())
            now = self.loop.time()
            batches = {
                tp: [Record(config.record_size, now) for _ in range(config.records_per_batch)]
                for tp in self.rng.sample(tps, config.partitions_per_request)
            }
            op = self.broker.produce(batches, config.produce_timeout)
            self.produce_requests += 1
            self.records_produced += config.partitions_per_request * config.records_per_batch
            task = asyncio.create_task(self.acknowledge(op, now))
            self.acks.add(task)
            task.add_done_callback(self.acks.discard)

    async def acknowledge(self, op: DelayedProduce, sent: float) -> None:
        errors = await op
        failed = sum(error is not Error.NONE for error in errors.values())
        self.acknowledged += len(errors) - failed
        self.timed_out += failed
        if not failed:
            self.produce_latency.append(self.loop.time() - sent)

    async def follow(self, replica: int) -> None:
        config = self.config
        offsets = dict.fromkeys(self.broker.partitions, 0)
        stall_from = self.start + config.stall_at
        stall_until = stall_from + config.stall_for
        while True:
            now = self.loop.time()
            if replica == 0 and stall_from <= now < stall_until:
                await asyncio.sleep(stall_until - now)
            fetched = await self.broker.fetch(
                offsets, min_bytes=1, max_wait=config.follower_max_wait, replica=replica
            )
            if any(fetched.values()):
                await asyncio.sleep(config.replica_lag)  # writing them to its own log
            for tp, records in fetched.items():
                offsets[tp] += len(records)

    async def consume(self) -> None:
        config = self.config
        offsets = dict.fromkeys(self.broker.partitions, 0)
        while True:
            asked = self.loop.time()
            fetched = await self.broker.fetch(
                offsets, min_bytes=config.fetch_min_bytes, max_wait=config.fetch_max_wait
            )
            now = self.loop.time()
            self.fetch_wait.append(now - asked)
            for tp, records in fetched.items():
                offsets[tp] += len(records)
                self.records_fetched += len(records)
                self.end_to_end.extend(now - record.produced_at for record in records)


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_simulation(
    config: SimulationConfig | None = None, *, observer: ap.OperationObserver | None = None
) -> SimulationReport:
    """Run a simulated broker for ``config.duration`` seconds of the loop's time.

    ``observer`` is given to both purgatories (for example an
    :class:`aiopurgatory.trace.TraceRecorder`).
    """
    return await _Simulation(config or SimulationConfig(), observer).run()
