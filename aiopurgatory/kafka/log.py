"""A partition's log: what the broker core stores and reads, with no I/O and no timers.

Ground rules: a :class:`Partition` holds entries of any type with a ``size`` and a
``count`` (:class:`Entry`), assigns them consecutive offsets and keeps the high
watermark (HW) as the lowest log end offset its followers reported (all of them, or the
slots :meth:`Partition.set_hw_slots` names: the in-sync replicas of a cluster), and its
leader epochs (:meth:`Partition.begin_epoch`, :meth:`Partition.truncate`). Nothing
here waits or knows the wire format: the delayed operations (:mod:`.delayed`) and the
core (:mod:`.core`) build on it, the Kafka-protocol layer above stores record batches
in it, the simulator (:mod:`.simulator`) single records.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, NamedTuple, Protocol, TypeVar

__all__ = [
    "MAX_PARTITION_BYTES",
    "SEGMENT_BYTES",
    "SEGMENT_MS",
    "Entry",
    "Error",
    "Partition",
    "TopicPartition",
]

MAX_PARTITION_BYTES = 1024 * 1024
"""Bytes a fetch returns per partition at most (at least one entry, as in Kafka)."""
SEGMENT_BYTES: Final = 1024**3
"""Kafka's ``log.segment.bytes``: the active segment rolls before it would grow past it."""
SEGMENT_MS: Final = 7 * 24 * 3600 * 1000
"""Kafka's ``log.roll.ms`` (``segment.ms``): the active segment rolls once this old."""


class Error(enum.IntEnum):
    """Per-partition result of a produce or fetch (Kafka's error codes)."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Entry(Protocol):
    """What a partition's log holds: one record (the simulator) or a batch of them (the
    Kafka-protocol broker, :mod:`aiopurgatory.kafka`, which stores batches as they arrive)."""

    @property
    def size(self) -> int:
        """Bytes."""

    @property
    def count(self) -> int:
        """Offsets it takes: an entry's records have consecutive offsets."""


E = TypeVar("E", bound=Entry)


class Partition(Generic[E]):
    """A leader's log and the log end offsets (LEO) its followers have reported.

    The log is a list of entries, each taking ``entry.count`` consecutive offsets. With
    ``retain_bytes`` the oldest entries the HW has passed are dropped once the log holds
    more than that, as Kafka's retention does (``log_start`` moves up); the newest entry
    is always kept.

    Segments, as Kafka's log has them, but as offsets only (the entries stay one list):
    :attr:`segments` holds each segment's first offset, oldest first, the last the
    active one's. An append rolls the active segment first when the entry would take it
    past :attr:`segment_bytes` or when it is :attr:`segment_ms` old (by the ``now``
    the caller passes: the broker's clock, which a test moves); :meth:`roll_due` rolls
    an idle one. The cleaner (:mod:`.cleaner`) reads only the closed segments.
    Retention stays per entry (finer than Kafka's whole segments).

    Leader epochs: the log starts at epoch 0; a new leader (:meth:`begin_epoch`) starts
    the next one at the log end, after truncating the log to what it holds
    (:meth:`truncate`, never below the HW: what is committed stays). The history of
    epochs answers Kafka's OffsetForLeaderEpoch (:meth:`end_offset_for`), which clients
    use to find where their copy diverged from the new leader's.
    """

    __slots__ = (
        "_active_born",
        "_active_bytes",
        "_bases",
        "_head",
        "_leo",
        "_positions",
        "deleted",
        "entries",
        "epoch",
        "epoch_history",
        "follower_leos",
        "hw",
        "hw_slots",
        "log_start",
        "retain_bytes",
        "segment_bytes",
        "segment_ms",
        "segments",
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
        self.hw_slots: tuple[int, ...] | None = None
        """The follower slots the HW waits for (a cluster's in-sync followers); None:
        every slot, the rule of the simulated followers (and the fast path)."""
        self.hw = 0
        self.epoch = 0
        """The leader epoch: bumped by each new leader (:meth:`begin_epoch`)."""
        self.epoch_history: list[tuple[int, int]] = [(0, 0)]
        """(epoch, start offset) of each epoch that still has a place in the log, oldest
        first: epochs and start offsets strictly increase, the last is :attr:`epoch`."""
        self.retain_bytes = retain_bytes
        self.deleted = False
        """Set when its topic is deleted: a fetch watching it completes at once."""
        self.segment_bytes: int = SEGMENT_BYTES
        self.segment_ms: int = SEGMENT_MS
        self.segments: list[int] = [0]
        """Each segment's first offset, oldest first; the last is the active segment's.
        Those wholly below the log start are pruned as retention drops entries."""
        self._active_bytes = 0
        self._active_born = 0
        """When the active segment got its first entry (the caller's ``now``, ms)."""

    @property
    def leo(self) -> int:
        """Log end offset: the offset of the next record."""
        return self._leo

    @property
    def retained_bytes(self) -> int:
        return self._positions[-1] - self._positions[self._head]

    @property
    def active_start(self) -> int:
        """The active segment's first offset: what is below it is in closed segments."""
        return self.segments[-1]

    def append(self, entries: Sequence[E], now: int = 0) -> int:
        """Append ``entries`` (at ``now``, ms, for the segments' age); returns the log
        end offset after them."""
        for entry in entries:
            if self._active_bytes and (
                self._active_bytes + entry.size > self.segment_bytes
                or now - self._active_born >= self.segment_ms
            ):
                self.segments.append(self._leo)
                self._active_bytes = 0
            if not self._active_bytes:
                self._active_born = now
            self._active_bytes += entry.size
            self.entries.append(entry)
            self._bases.append(self._leo)
            self._positions.append(self._positions[-1] + entry.size)
            self._leo += entry.count
        self._advance_hw()  # without followers the leader alone is "all replicas"
        self._retain()
        return self._leo

    def roll_due(self, now: int) -> bool:
        """Roll a non-empty active segment ``segment_ms`` old at ``now`` (ms): Kafka rolls
        on the next append; here the cleaner's check rolls an idle one too, so that a
        test moving the clock finds its records cleanable. True if it rolled."""
        if self._active_bytes and now - self._active_born >= self.segment_ms:
            self.segments.append(self._leo)
            self._active_bytes = 0
            return True
        return False

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
        if self._bases[first] + self.entries[first].count <= offset:
            first += 1  # ``offset`` is in a gap the cleaner left: the next entry on
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

    def set_hw_slots(self, slots: Sequence[int] | None) -> bool:
        """Count only the followers in ``slots`` for the HW (None: all of them, as at
        creation): a cluster's in-sync replicas but the leader. True if the HW moved
        (an ISR shrinking to caught-up followers lets it advance); it never moves down."""
        if slots is not None:
            chosen = tuple(slots)
            if len(set(chosen)) != len(chosen) or not all(
                isinstance(i, int) and 0 <= i < len(self.follower_leos) for i in chosen
            ):
                raise ValueError(
                    f"{self.tp}: HW slots must be distinct follower slots in "
                    f"[0, {len(self.follower_leos)}), got {slots!r}"
                )
            self.hw_slots = chosen
            # The rule of the chosen slots is its subclass's: the default path (every
            # append and follower fetch of the simulator) stays free of the check.
            self.__class__ = _SlottedPartition
        else:
            self.hw_slots = None
            self.__class__ = Partition
        return self._advance_hw()

    # -- leader epochs ------------------------------------------------------------------

    def begin_epoch(self) -> int:
        """A new leader: the next epoch starts at the log end; returns it. An epoch that
        starts there too wrote nothing and leaves the history (as Kafka's epoch cache
        replaces it), so start offsets stay strictly increasing."""
        history = self.epoch_history
        while history and history[-1][1] >= self._leo:
            history.pop()
        self.epoch += 1
        history.append((self.epoch, self._leo))
        return self.epoch

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: (the largest epoch <= ``epoch`` in the history,
        the offset where it ended: the next epoch's start, or the log end for the current
        one). An epoch below the first known one answers (``epoch``, the first one's
        start), one above the current, or -1, answers (-1, -1), as Kafka's epoch cache."""
        history = self.epoch_history
        if epoch < 0 or epoch > self.epoch:
            return -1, -1
        if epoch == self.epoch:
            return epoch, self._leo
        # The first entry of a later epoch: it ends the one asked for.
        at = bisect.bisect_right(history, epoch, key=lambda item: item[0])
        assert at < len(history), "the current epoch is the history's last"
        if at == 0:
            return epoch, history[0][1]
        return history[at - 1][0], history[at][1]

    def truncate(self, offset: int) -> tuple[int, int]:
        """Drop the log from ``offset`` on (a new leader's log ends there): followers'
        LEOs past it come back to it, epochs that started past it leave the history (the
        current one restarts at ``offset`` if it did). ``offset`` must be the start of
        an entry or the log end, and not below the HW (committed records never go):
        ValueError otherwise. Returns (bytes, entries) dropped, for the core's totals."""
        if not (isinstance(offset, int) and self.hw <= offset <= self._leo):
            raise ValueError(
                f"{self.tp}: truncation offset {offset!r} outside [{self.hw}, {self._leo}]"
            )
        index = bisect.bisect_left(self._bases, offset, self._head)
        if (self._bases[index] if index < len(self._bases) else self._leo) != offset:
            raise ValueError(f"{self.tp}: truncation offset {offset} is inside an entry")
        freed_bytes = self._positions[-1] - self._positions[index]
        freed_count = len(self.entries) - index
        del self.entries[index:]
        del self._bases[index:]
        del self._positions[index + 1 :]
        self._leo = offset
        leos = self.follower_leos
        for i, leo in enumerate(leos):
            if leo > offset:
                leos[i] = offset
        history = self.epoch_history
        while history and history[-1][1] >= offset:
            history.pop()
        if not history or history[-1][0] != self.epoch:
            history.append((self.epoch, offset))
        if freed_count:
            # What follows is written in a new segment (its bytes are counted anew).
            del self.segments[bisect.bisect_left(self.segments, offset) :]
            self.segments.append(offset)
            self._active_bytes = 0
        return freed_bytes, freed_count

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
        segments = self.segments
        if len(segments) > 1 and segments[1] <= self.log_start:
            del segments[: bisect.bisect_right(segments, self.log_start) - 1]
        if head > 64 and head * 2 > len(self.entries):  # compact: amortised O(1) per entry
            del self.entries[:head]
            del self._bases[:head]
            del self._positions[:head]
            self._head = 0
        return freed

    def rewrite(self, start: int, end: int, entries: Sequence[tuple[int, E]]) -> tuple[int, int]:
        """Replace the entries whose first offsets are in ``[start, end)`` by ``entries``
        ((first offset, entry) each, in order, within that range, each taking the
        offsets it took: the cleaner's output, :mod:`.cleaner`). Offsets never change;
        an entry left out leaves a gap. ``start`` must be the log start, ``end`` an
        entry's first offset (a segment's start, or the LSO) at or below the HW and the
        active segment's start (ValueError otherwise, nothing changed).
        Returns (bytes, entries) freed, for the core's totals. O(entries after ``end``)
        to shift their byte positions: the cleaner stops at the active segment."""
        if start != self.log_start or not start <= end <= min(self.hw, self.segments[-1]):
            raise ValueError(f"{self.tp}: cannot rewrite [{start}, {end})")
        first = bisect.bisect_left(self._bases, start, self._head)
        stop = bisect.bisect_left(self._bases, end, first)
        positions = self._positions
        at = positions[first]
        after: list[int] = []
        bases: list[int] = []
        for base, entry in entries:
            bases.append(base)
            at += entry.size
            after.append(at)
        freed = positions[stop] - at
        tail = positions[stop + 1 :]
        positions[first + 1 :] = after
        positions.extend([p - freed for p in tail] if freed else tail)
        self.entries[first:stop] = [entry for _, entry in entries]
        self._bases[first:stop] = bases
        return freed, (stop - first) - len(bases)

    def set_retain_bytes(self, retain_bytes: int | None) -> None:
        """Change the retention (a topic's ``retention.bytes``) and apply it now."""
        if retain_bytes is not None and retain_bytes < 0:
            raise ValueError(f"retain_bytes must be >= 0 or None, got {retain_bytes!r}")
        self.retain_bytes = retain_bytes
        self._retain()

    def delete_before(self, offset: int) -> None:
        """Move the log start up to ``offset`` (Kafka's DeleteRecords): the entries wholly
        below it go, except the newest (it carries the running timestamp maximum); an
        entry straddling it stays whole, as Kafka keeps a batch, and a fetch from the new
        start reads it (the client skips the records below its offset)."""
        if not self.log_start <= offset <= self.hw:
            raise ValueError(f"{self.tp}: offset {offset} outside [{self.log_start}, {self.hw}]")
        while (
            self._head < len(self.entries) - 1
            and self._bases[self._head] + self.entries[self._head].count <= offset
        ):
            if not self.drop_oldest():  # below the HW and not the newest: it can
                break  # (a guard: never spin should that change)
        self.log_start = offset

    def delete_expired(self, expired: Callable[[E], bool]) -> bool:
        """Drop entries from the front of the log while ``expired`` says so (Kafka's
        time retention, which deletes old segments from the log's start), none the HW has
        not passed; the first entry not expired stops it. An expired newest entry is kept
        (it carries the running timestamp maximum) with the log start moved past it, as
        Kafka rolls and deletes an expired active segment. True if the log start moved."""
        before = start = self.log_start
        while self._head < len(self.entries):
            head = self._head
            entry = self.entries[head]
            end = self._bases[head] + entry.count
            newest = head == len(self.entries) - 1
            if end <= start and newest:
                break  # a newest entry kept below the log start
            if end > start and (end > self.hw or not expired(entry)):
                break  # not replicated yet, or young
            if newest:
                start = end
                break
            if not self.drop_oldest():
                break  # a guard: never spin should that change
            start = max(start, self.log_start)
        self.log_start = start
        return start > before

    def _retain(self) -> None:
        if self.retain_bytes is None:
            return
        while self.retained_bytes > self.retain_bytes and self.drop_oldest():
            pass


class _SlottedPartition(Partition[E]):
    """A partition whose HW counts only its :attr:`~Partition.hw_slots` (a cluster's
    in-sync followers): :meth:`Partition.set_hw_slots` switches a partition's class to
    it and back (same layout, no state of its own)."""

    __slots__ = ()

    def _advance_hw(self) -> bool:
        leos = self.follower_leos
        slots = self.hw_slots
        assert slots is not None, "a slotted partition has its slots"
        hw = min([leos[i] for i in slots], default=self._leo)
        if hw <= self.hw:
            return False
        self.hw = hw
        return True
