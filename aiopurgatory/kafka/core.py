"""The broker core: topics' partitions, appends, reads, retention, simulated followers'
fetches, and the produce and fetch purgatories.

Ground rules: no wire format and no sockets (the Kafka protocol is spoken above, in
:mod:`aiopurgatory.kafka.broker`); every request is validated before anything changes
(ValueError, nothing appended); every change re-checks the operations that watch the
partitions it touched, synchronously, as Kafka does. Generic over the entry type: the
Kafka-protocol broker stores record batches, the simulator
(:mod:`.simulator`) single records.
"""

from __future__ import annotations

import collections
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Generic

import aiopurgatory as ap
from aiopurgatory.timer import Clock

from .delayed import DelayedLogFetch, DelayedProduce
from .log import MAX_PARTITION_BYTES, E, Partition, TopicPartition

__all__ = ["BrokerCore", "check_seconds"]


class BrokerCore(Generic[E]):
    """Topics' partitions and the produce and fetch purgatories, over entries of type E.

    Events re-check the purgatories synchronously, as Kafka does: an append checks
    the fetches (followers read up to the log end), an HW move checks the produces
    and the fetches (consumers read up to the HW). The simulator
    (:class:`aiopurgatory.kafka.simulator.Broker`) stores records; the Kafka-protocol
    broker (:class:`aiopurgatory.kafka.KafkaBroker`) stores record batches in this same
    core.
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
        self.topic_ids: dict[str, uuid.UUID] = {}
        """Topic name to its id (Kafka's topic UUID): drawn when the topic is created,
        kept for its life, a new one when a topic is created again under the name
        (Metadata v10+ lists it; KIP-848 assignments name topics by it)."""
        self.topic_names: dict[uuid.UUID, str] = {}
        """The reverse of :attr:`topic_ids`."""
        self.max_message_bytes: dict[str, int] = {}
        """A topic's ``max.message.bytes``, where set: a larger batch is refused."""
        self.min_insync: dict[str, int] = {}
        """A topic's ``min.insync.replicas``, where above 1: acks=all is refused
        NOT_ENOUGH_REPLICAS while fewer replicas are in sync."""
        self.retain_ms: int | None = None
        """Time retention of a topic not in :attr:`topic_retain_ms` (None: forever)."""
        self.topic_retain_ms: dict[str, int | None] = {}
        """A topic's ``retention.ms``, where set (None: forever, Kafka's -1)."""
        self.segment_now: Callable[[], int] | None = None
        """The time (ms) appends are made at, for the segments' age (``segment.ms``):
        the broker's clock, which a test moves; None: segments roll on size only."""
        self.produce_purgatory = ap.Purgatory("produce", clock=clock, observer=observer)
        self.fetch_purgatory = ap.Purgatory("fetch", clock=clock, observer=observer)

    def create_topic(self, topic: str, partitions: int, followers: int | None = None) -> bool:
        """Create ``topic`` with ``partitions`` partitions, each with ``followers``
        follower slots (default the core's); False if it exists already."""
        if not (isinstance(partitions, int) and partitions >= 1):
            raise ValueError(f"a topic needs at least 1 partition, got {partitions!r}")
        if topic in self.topics:
            return False
        self.topics[topic] = partitions
        topic_id = uuid.uuid4()
        self.topic_ids[topic] = topic_id
        self.topic_names[topic_id] = topic
        slots = self.followers if followers is None else followers
        for i in range(partitions):
            tp = TopicPartition(topic, i)
            self.partitions[tp] = Partition(tp, slots, self.retain_bytes)
        return True

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic``; fetches reading it complete at once. False if unknown."""
        count = self.topics.pop(topic, None)
        if count is None:
            return False
        self.topic_names.pop(self.topic_ids.pop(topic), None)
        self.max_message_bytes.pop(topic, None)
        self.min_insync.pop(topic, None)
        self.topic_retain_ms.pop(topic, None)
        for i in range(count):
            partition = self.partitions.pop(TopicPartition(topic, i))
            partition.deleted = True
            self.retained_bytes -= partition.retained_bytes
            self._retained_count -= partition.retained_count
            # What waits on it is answered now, with UNKNOWN_TOPIC_OR_PARTITION.
            self.fetch_purgatory.check_and_complete(partition.tp)
            self.produce_purgatory.check_and_complete(partition.tp)
        return True

    def add_partitions(self, topic: str, count: int) -> list[TopicPartition]:
        """Grow ``topic`` to ``count`` partitions (Kafka's CreatePartitions); the new ones
        take the retention of its first. Returns the new partitions."""
        current = self.topics[topic]
        if count <= current:
            raise ValueError(f"{topic} has {current} partitions already, asked for {count}")
        first = self.partitions[TopicPartition(topic, 0)]
        retain = first.retain_bytes
        slots = len(first.follower_leos)  # as many follower slots as its first
        added = [TopicPartition(topic, i) for i in range(current, count)]
        for tp in added:
            partition = self.partitions[tp] = Partition(tp, slots, retain)
            partition.segment_bytes, partition.segment_ms = first.segment_bytes, first.segment_ms
        self.topics[topic] = count
        return added

    def set_retain_bytes(self, topic: str, retain_bytes: int | None) -> None:
        """``topic``'s partitions keep ``retain_bytes`` each (None: the total limit only)."""
        for i in range(self.topics[topic]):
            partition = self.partitions[TopicPartition(topic, i)]
            before = partition.retained_bytes, partition.retained_count
            partition.set_retain_bytes(retain_bytes)
            self.retained_bytes += partition.retained_bytes - before[0]
            self._retained_count += partition.retained_count - before[1]

    def rewrite(
        self, partition: Partition[E], start: int, end: int, entries: Sequence[tuple[int, E]]
    ) -> None:
        """The cleaner's output for ``partition``'s ``[start, end)`` in place of what
        was there (:meth:`Partition.rewrite`), the totals kept; fetches waiting on it
        are checked (one in a gap now moves on)."""
        freed_bytes, freed_count = partition.rewrite(start, end, entries)
        self.retained_bytes -= freed_bytes
        self._retained_count -= freed_count
        self.fetch_purgatory.check_and_complete(partition.tp)

    def set_segments(self, topic: str, segment_bytes: int, segment_ms: int) -> None:
        """``topic``'s ``segment.bytes`` and ``segment.ms``: the next appends roll by them."""
        for i in range(self.topics[topic]):
            partition = self.partitions[TopicPartition(topic, i)]
            partition.segment_bytes, partition.segment_ms = segment_bytes, segment_ms

    def retain_time(self, now: int, timestamp: Callable[[E], int]) -> None:
        """Time retention, as Kafka's periodic check applies ``retention.ms``: each
        partition's entries whose ``timestamp`` (milliseconds) is more than its topic's
        retention before ``now`` go from the front of its log, up to the HW at most
        (:meth:`Partition.delete_expired`). Fetches waiting below a new log start are
        answered now."""
        for topic, count in self.topics.items():
            retain = self.topic_retain_ms.get(topic, self.retain_ms)
            if retain is None:
                continue
            cutoff = now - retain

            def expired(entry: E, cutoff: int = cutoff) -> bool:
                return timestamp(entry) < cutoff

            for i in range(count):
                partition = self.partitions[TopicPartition(topic, i)]
                before = partition.retained_bytes, partition.retained_count
                if partition.delete_expired(expired):
                    self.retained_bytes += partition.retained_bytes - before[0]
                    self._retained_count += partition.retained_count - before[1]
                    self.fetch_purgatory.check_and_complete(partition.tp)

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """Move ``tp``'s log start up to ``offset`` (not beyond the HW: ValueError);
        returns the log start. Fetches waiting below it are answered now."""
        partition = self._partition(tp)
        if offset > partition.log_start:
            before = partition.retained_bytes, partition.retained_count
            partition.delete_before(offset)
            self.retained_bytes += partition.retained_bytes - before[0]
            self._retained_count += partition.retained_count - before[1]
            self.fetch_purgatory.check_and_complete(tp)
        elif offset > partition.hw or offset < 0:
            raise ValueError(f"{tp}: offset {offset} beyond the high watermark {partition.hw}")
        return partition.log_start

    def set_hw_slots(self, tp: TopicPartition, slots: Sequence[int] | None) -> bool:
        """Count only the follower ``slots`` of ``tp`` for its HW (a cluster's in-sync
        followers; None: all, the default). An HW that moves (the ISR shrank to caught-up
        followers) answers the produces and fetches it lets complete; returns whether it
        moved. ValueError for an unknown partition or bad slots."""
        partition = self._partition(tp)
        moved = partition.set_hw_slots(slots)
        if moved:
            self.produce_purgatory.check_and_complete(tp)
            self.fetch_purgatory.check_and_complete(tp)
        return moved

    def change_leader(self, tp: TopicPartition, new_end: int) -> int:
        """A new leader for ``tp`` whose log ends at ``new_end``: the log is truncated
        there (:meth:`Partition.truncate`: not below the HW, at an entry boundary, else
        ValueError and nothing changes) and the next leader epoch begins; returns it.
        What waits on ``tp`` (produces short of the HW, fetches) is answered at once:
        its epoch changed. The caller drops what else remembers the truncated offsets
        (:meth:`~.producers.ProducerTable.truncate`, the transactions' ``truncate``)."""
        partition = self._partition(tp)
        freed_bytes, freed_count = partition.truncate(new_end)
        self.retained_bytes -= freed_bytes
        self._retained_count -= freed_count
        if freed_count and self.retain_total_bytes is not None:
            # Arrivals of the dropped entries would stand for entries appended later
            # at the same offsets: they go (rare, so a sweep is fine).
            self._arrivals = collections.deque(
                (p, o) for p, o in self._arrivals if p is not partition or o < new_end
            )
        epoch = partition.begin_epoch()
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        return epoch

    def append(self, batches: Mapping[TopicPartition, Sequence[E]]) -> dict[Partition[E], int]:
        """Append ``batches`` to the leader logs; returns each partition's LEO after them.

        The whole request is validated before anything is appended: an unknown
        partition or an empty request raises ValueError and changes nothing.
        """
        if not batches:
            raise ValueError("a produce request needs at least one partition")
        partitions = [(self._partition(tp), list(entries)) for tp, entries in batches.items()]
        now = 0 if self.segment_now is None else self.segment_now()
        required: dict[Partition[E], int] = {}
        for partition, entries in partitions:
            bytes_before, count_before = partition.retained_bytes, partition.retained_count
            if self.retain_total_bytes is not None:
                offset = partition.leo
                for entry in entries:
                    self._arrivals.append((partition, offset))
                    offset += entry.count
            required[partition] = partition.append(entries, now)
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
        check_seconds("timeout", timeout)
        return self.acknowledge(self.append(batches), timeout)

    def acknowledge(self, required: Mapping[Partition[E], int], timeout: float) -> DelayedProduce:
        """acks=all for what :meth:`append` returned: done when the HW covers it."""
        op = DelayedProduce(required, timeout)
        return self.produce_purgatory.try_complete_else_watch(op, tuple(p.tp for p in required))

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
        check_seconds("max_wait", max_wait)
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
        # A tuple of distinct keys is watched as it is (a list would be copied).
        return self.fetch_purgatory.try_complete_else_watch(op, tuple(offsets))

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


def check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
