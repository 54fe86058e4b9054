"""A hierarchical timing wheel over integer ticks.

This module is a plain data structure: it knows nothing of clocks, asyncio or
operations. Time is an integer tick count that only moves forward, and the caller
decides when to advance it (see :mod:`aiopurgatory.timer`).

Layout. Level ``k`` has ``wheel_size`` buckets, each covering ``wheel_size**k`` ticks
(its *span*), so the level covers ``wheel_size**(k+1)`` ticks (its *interval*). A
level is added on demand when a deadline lies beyond every existing level. Each
bucket is an intrusive doubly linked list, so removing an entry is O(1).

Driving. Every non-empty bucket has an *expiration* (the first tick it covers) and
sits in a heap. A bucket is pushed only when its expiration changes, so the heap
holds at most one live item per bucket: its size is bounded by the number of
buckets, never by the number of entries. Items whose bucket has since been flushed
or re-used are stale and are dropped when they reach the top.

Cascading ahead. A bucket of span ``S > 1`` is keyed ``S // 4`` ticks *before* its
expiration: at that tick its entries are split into finer buckets of span
``S / wheel_size``, created for the purpose and pushed like any other. Splitting a
big bucket takes time (bounded chunks, and reached ticks are served in between), and
doing it ahead means the entries due at the very start of its span are already in
place when their tick comes, instead of waiting behind the rest of the cascade. The
split buckets are not slots of any level, so they never collide with the level that
is still serving the ticks before them. Only span-1 buckets move the wheel's clock.

Invariants (asserted by :meth:`TimingWheel.check_invariants`, which the tests call):

1. ``levels[k].now`` is a multiple of the level's span and never decreases.
2. Every entry sits in a bucket whose expiration is at most its deadline. Splitting
   keeps this (an entry moves to the finer bucket covering its deadline), and only a
   span-1 bucket hands out entries, once the wheel has reached its expiration, so no
   entry is ever reported due before its deadline tick.
3. Every non-empty bucket (but the ones being drained or split) has a live heap
   item keyed ``expiration - span // 4``.
4. ``len(wheel)`` equals the number of linked entries.

Deadlines may move later in place (:meth:`TimingWheel.reschedule`): the entry stays in
its bucket and is simply placed further on when that bucket is split or drained, which
keeps invariant 2 and makes postponing O(1) without touching any list.
"""

from __future__ import annotations

import heapq
from typing import Final

__all__ = ["NO_EXPIRATION", "SPLIT_LEAD_FRACTION", "TimerEntry", "TimingWheel"]

SPLIT_LEAD_FRACTION: Final = 4
"""A coarse bucket is split this fraction of its span (a quarter) before it starts:
long enough for a big bucket to be split in chunks while the loop serves other work."""

NO_EXPIRATION: Final = -1
"""Expiration of a bucket that is not in the heap (and return value for "no change")."""

_NO_EXPIRATION: Final = NO_EXPIRATION  # compiled: a C constant (wheel.pxd), not a global


class TimerEntry:
    """An element a :class:`TimingWheel` can hold: the links live in the entry itself."""

    __slots__ = ("_bucket", "_next", "_prev", "deadline_tick")

    def __init__(self) -> None:
        self._bucket: _Bucket | None = None
        self._prev: TimerEntry | None = None
        self._next: TimerEntry | None = None
        self.deadline_tick = 0

    @property
    def scheduled(self) -> bool:
        """Whether the entry is linked into a wheel."""
        return self._bucket is not None


class _Bucket:
    """A FIFO intrusive list of entries sharing one expiration slot."""

    __slots__ = ("expiration", "head", "id", "span", "tail")

    def __init__(self, bucket_id: int, span: int) -> None:
        self.expiration = _NO_EXPIRATION
        self.span = span
        self.head: TimerEntry | None = None
        self.tail: TimerEntry | None = None
        self.id = bucket_id  # breaks heap ties without comparing buckets

    def append(self, entry: TimerEntry) -> None:
        entry._bucket = self
        entry._next = None
        entry._prev = tail = self.tail
        if tail is None:
            self.head = entry
        else:
            tail._next = entry
        self.tail = entry

    def unlink(self, entry: TimerEntry) -> None:
        prev, nxt = entry._prev, entry._next
        if prev is None:
            self.head = nxt
        else:
            prev._next = nxt
        if nxt is None:
            self.tail = prev
        else:
            nxt._prev = prev
        entry._bucket = entry._prev = entry._next = None


class _Level:
    __slots__ = ("buckets", "interval", "now", "span")

    def __init__(self, span: int, wheel_size: int, now: int, first_id: int) -> None:
        self.span = span
        self.interval = span * wheel_size
        self.now = now - now % span
        self.buckets = [_Bucket(first_id + i, span) for i in range(wheel_size)]


class TimingWheel:
    """Entries keyed by integer deadline ticks, reported due at or after their deadline.

    Costs, with ``b`` the number of buckets (a few per level): :meth:`schedule` O(1)
    plus an O(log b) heap push when the entry's bucket was empty; :meth:`remove` O(1);
    :meth:`reschedule` O(1) to a later deadline; :meth:`collect_due` O(1) per entry
    it moves (plus O(log b) per bucket), at most ``limit`` entries per call.

    Args:
        wheel_size: buckets per level (at least 2).
        start_tick: the tick the wheel starts at (>= 0).

    Raises:
        ValueError: ``wheel_size`` is below 2 or ``start_tick`` negative.
    """

    __slots__ = (
        "_cascaded",
        "_count",
        "_draining",
        "_heap",
        "_levels",
        "_next_id",
        "_split_into",
        "_splitting",
        "_wheel_size",
    )

    def __init__(self, wheel_size: int, start_tick: int = 0) -> None:
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size!r}")
        if start_tick < 0:
            raise ValueError(f"start_tick must be >= 0, got {start_tick!r}")
        self._wheel_size = wheel_size
        self._levels = [_Level(1, wheel_size, start_tick, 0)]
        self._heap: list[tuple[int, int, _Bucket]] = []
        self._count = 0
        self._cascaded = 0
        # Buckets collect_due has started on, kept across calls so that a huge one
        # is worked through in bounded chunks: a reached span-1 bucket being drained,
        # a coarse bucket being split ahead, and the finer buckets made for that split
        # so far, by their slot within it (0 .. wheel_size-1). A list indexed by slot,
        # not a dict keyed by tick: a tick beyond the small-int cache would be a new int
        # object per entry moved, the one allocation left on the expiry path.
        self._draining: _Bucket | None = None
        self._splitting: _Bucket | None = None
        self._split_into: list[_Bucket | None] = [None] * wheel_size
        self._next_id = wheel_size  # unique bucket ids (heap tie-breaks)

    def __len__(self) -> int:
        """Entries scheduled (linked) in the wheel."""
        return self._count

    @property
    def now(self) -> int:
        """The tick the wheel has advanced to: deadlines at or before it are due."""
        return self._levels[0].now

    def clamp_future(self, tick: int) -> int:
        """The earliest tick :meth:`schedule` accepts at or after ``tick``.

        Args:
            tick: a wanted deadline tick.

        Returns:
            ``tick`` itself, or the first tick after :attr:`now` if the wheel has
            reached ``tick``.
        """
        level = self._levels[0]
        now = level.now
        return tick if tick > now else now + 1

    @property
    def heap_size(self) -> int:
        """Items in the expiration heap (bounded by the number of buckets)."""
        return len(self._heap)

    @property
    def num_levels(self) -> int:
        """Levels so far (one at first; one more each time a deadline lies beyond them)."""
        return len(self._levels)

    @property
    def cascaded(self) -> int:
        """Entries moved to a finer level so far (the cost of the hierarchy)."""
        return self._cascaded

    def schedule(self, entry: TimerEntry, deadline_tick: int) -> int:
        """Link ``entry`` to fire at ``deadline_tick``, which must be after :attr:`now`.

        O(1): an append to a bucket's list, plus an O(log buckets) heap push when that
        bucket was empty (and a new level when the deadline lies beyond every level).

        Args:
            entry: an entry not scheduled in any wheel.
            deadline_tick: the first tick at which it is due (see :meth:`clamp_future`).

        Returns:
            The tick at which the entry's bucket needs work if that bucket was just
            added to the heap (the driver may need to wake earlier), else
            :data:`NO_EXPIRATION`.

        Raises:
            ValueError: ``entry`` is already scheduled, or ``deadline_tick`` is not
                after :attr:`now`.
        """
        if entry._bucket is not None:
            raise ValueError("entry is already scheduled")
        level = self._levels[0]
        if deadline_tick <= level.now:
            raise ValueError(f"deadline tick {deadline_tick} is not after now ({self.now})")
        entry.deadline_tick = deadline_tick
        self._count += 1
        return self._insert(entry)

    def remove(self, entry: TimerEntry) -> bool:
        """Unlink ``entry`` in O(1) (it is a doubly linked list node).

        Its bucket stays in the heap, and is dropped when it reaches the top empty.

        Args:
            entry: an entry of this wheel, scheduled or not.

        Returns:
            True if it was scheduled, False if not (nothing is done then).
        """
        bucket = entry._bucket
        if bucket is None:
            return False
        bucket.unlink(entry)
        self._count -= 1
        return True

    def reschedule(self, entry: TimerEntry, deadline_tick: int) -> int:
        """Move an entry's deadline; same return value as :meth:`schedule`.

        A later deadline of a scheduled entry is recorded in place (O(1), no
        relinking: the entry moves on when its bucket is split or drained); an
        earlier one relinks it, and an entry not scheduled is scheduled.

        Args:
            entry: an entry of this wheel, scheduled or not.
            deadline_tick: its new deadline tick.

        Raises:
            ValueError: the entry must be relinked (earlier deadline, or not
                scheduled) and ``deadline_tick`` is not after :attr:`now`; the entry
                is then left unscheduled.
        """
        if entry._bucket is not None and deadline_tick >= entry.deadline_tick:
            entry.deadline_tick = deadline_tick
            return _NO_EXPIRATION
        self.remove(entry)
        return self.schedule(entry, deadline_tick)

    def next_expiration(self) -> int | None:
        """The earliest tick at which :meth:`collect_due` has work, or None if empty."""
        started = self._draining or self._splitting
        if started is not None:
            return self._key(started)
        heap = self._heap
        while heap:
            key, _, bucket = heap[0]
            if bucket.expiration == _NO_EXPIRATION or self._key(bucket) != key:
                heapq.heappop(heap)  # stale: the bucket was flushed and re-used
            elif bucket.head is None:
                # Emptied by removals. Forget its expiration so that the next entry
                # to land in it pushes it again.
                heapq.heappop(heap)
                bucket.expiration = _NO_EXPIRATION
            else:
                return key
        return None

    def collect_due(self, now_tick: int, out: list[TimerEntry], limit: int) -> bool:
        """Advance to ``now_tick``, appending due entries to ``out`` in deadline order.

        At most ``limit`` entries are moved (collected, re-inserted or split into a
        finer bucket); returns True when nothing due at ``now_tick`` is left, False
        when the caller should call again to continue.

        Reached ticks come first: a split under way (which is ahead of time) pauses
        for any span-1 bucket that is due before the split bucket's own start.
        """
        heap = self._heap
        moved = 0
        while True:
            bucket = self._draining
            if bucket is None:
                splitting = self._splitting
                if heap and heap[0][0] <= now_tick:
                    key, _, top = heap[0]
                    if top.expiration == _NO_EXPIRATION or self._key(top) != key:
                        heapq.heappop(heap)  # stale
                        continue
                    if top.span == 1 and (splitting is None or key < splitting.expiration):
                        heapq.heappop(heap)
                        self._advance(key)
                        self._draining = bucket = top
                    elif splitting is None:
                        heapq.heappop(heap)
                        self._splitting = splitting = top
                if bucket is None:
                    if splitting is None:
                        return True
                    moved = self._split(splitting, moved, limit)
                    if splitting.head is not None:
                        return False
                    splitting.expiration = _NO_EXPIRATION
                    self._splitting = None
                    self._forget_split()
                    continue
            moved = self._drain(bucket, out, moved, limit)
            if bucket.head is not None:
                return False
            bucket.expiration = _NO_EXPIRATION
            self._draining = None

    def restart(self, now_tick: int) -> None:
        """Start an empty wheel over at ``now_tick``.

        The heap may still hold buckets emptied by removals; they are forgotten, so
        the next entry pushes its bucket afresh and the caller learns of it. The
        levels jump forward, so new entries land in level 0 instead of cascading
        down from the coarse buckets an old ``now`` would give them.
        """
        if self._count:
            raise RuntimeError("restart() needs an empty wheel")
        for _, _, bucket in self._heap:
            bucket.expiration = _NO_EXPIRATION
        self._heap.clear()
        for started in (self._draining, self._splitting):
            if started is not None:
                started.expiration = _NO_EXPIRATION
        self._draining = self._splitting = None
        self._forget_split()
        if now_tick > self._levels[0].now:
            for level in self._levels:
                level.now = now_tick - now_tick % level.span

    def clear(self) -> list[TimerEntry]:
        """Unlink every entry and forget every bucket; returns the entries it unlinked.

        O(entries + buckets). Afterwards nothing references an entry, so a closed
        timer pins no memory.
        """
        entries: list[TimerEntry] = []
        for bucket in self._buckets():
            while (entry := bucket.head) is not None:
                bucket.unlink(entry)
                entries.append(entry)
            bucket.expiration = _NO_EXPIRATION
        self._heap.clear()
        self._draining = self._splitting = None
        self._forget_split()
        self._count = 0
        return entries

    def entries(self) -> list[TimerEntry]:
        """Every entry on the wheel, in no particular order (a new list).

        O(entries + buckets), for introspection only: nothing on the schedule and
        remove paths keeps an index for it. The wheel is not changed.
        """
        found: list[TimerEntry] = []
        for bucket in self._buckets():
            entry = bucket.head
            while entry is not None:
                found.append(entry)
                entry = entry._next
        return found

    def check_invariants(self) -> None:
        """Assert the module's invariants (O(entries); for tests and debugging)."""
        live = {
            bucket.id: bucket
            for key, _, bucket in self._heap
            if bucket.expiration != _NO_EXPIRATION and self._key(bucket) == key
        }
        previous_now = None
        for level in self._levels:
            assert level.now % level.span == 0, "level clock not aligned to its span"
            if previous_now is not None:
                assert level.now <= previous_now, "coarser level ahead of a finer one"
            previous_now = level.now
            for bucket in level.buckets:
                in_progress = bucket is self._draining or bucket is self._splitting
                if bucket.head is not None and not in_progress:
                    assert live.get(bucket.id) is bucket, "non-empty slot not in the heap"
        linked = 0
        for bucket in self._buckets():
            entry = bucket.head
            while entry is not None:
                assert entry._bucket is bucket, "entry linked to another bucket"
                assert entry.deadline_tick >= bucket.expiration, "entry would fire early"
                linked += 1
                entry = entry._next
        assert linked == self._count, f"count {self._count} != linked entries {linked}"

    def _buckets(self) -> list[_Bucket]:
        """Every bucket that may hold entries: level slots, split buckets, started ones."""
        found = {id(bucket): bucket for level in self._levels for bucket in level.buckets}
        found.update((id(bucket), bucket) for _, _, bucket in self._heap)
        found.update((id(bucket), bucket) for bucket in self._split_into if bucket is not None)
        for started in (self._draining, self._splitting):
            if started is not None:
                found[id(started)] = started
        return list(found.values())

    def _key(self, bucket: _Bucket) -> int:
        """When ``bucket`` needs work: its expiration, less the split lead if it splits."""
        return bucket.expiration - bucket.span // SPLIT_LEAD_FRACTION

    def _drain(self, bucket: _Bucket, out: list[TimerEntry], moved: int, limit: int) -> int:
        """Collect the entries of a reached span-1 bucket (re-insert postponed ones)."""
        current = self._levels[0].now
        while (entry := bucket.head) is not None and moved < limit:
            bucket.unlink(entry)
            moved += 1
            if entry.deadline_tick <= current:
                self._count -= 1
                out.append(entry)
            else:
                self._insert(entry)
        return moved

    def _split(self, bucket: _Bucket, moved: int, limit: int) -> int:
        """Move a coarse bucket's entries into new buckets one finer slot wide."""
        span = bucket.span // self._wheel_size
        first = bucket.expiration // span  # the finer slot the coarse bucket starts at
        into = self._split_into
        while (entry := bucket.head) is not None and moved < limit:
            bucket.unlink(entry)
            moved += 1
            self._cascaded += 1
            virtual = entry.deadline_tick // span
            slot = virtual - first
            assert slot >= 0, "entry in a bucket that expires after it"  # invariant 2
            if slot >= self._wheel_size:  # postponed past this bucket: placed afresh
                self._insert(entry)
                continue
            finer = into[slot]
            if finer is None:
                finer = into[slot] = _Bucket(self._next_id, span)
                self._next_id += 1
                finer.expiration = virtual * span
                heapq.heappush(self._heap, (self._key(finer), finer.id, finer))
            finer.append(entry)
        return moved

    def _forget_split(self) -> None:
        """The split is over (or the wheel emptied): its finer buckets live on in the heap."""
        into = self._split_into
        for slot in range(len(into)):
            into[slot] = None

    def _advance(self, tick: int) -> None:
        for level in self._levels:
            if tick >= level.now + level.span:
                level.now = tick - tick % level.span

    def _insert(self, entry: TimerEntry) -> int:
        deadline = entry.deadline_tick
        levels = self._levels
        k = 0
        while True:
            if k == len(levels):
                last = levels[-1]
                levels.append(_Level(last.interval, self._wheel_size, levels[0].now, self._next_id))
                self._next_id += self._wheel_size
            level = levels[k]
            if deadline < level.now + level.interval:
                virtual = deadline // level.span
                bucket = level.buckets[virtual % self._wheel_size]
                bucket.append(entry)
                expiration = virtual * level.span
                if bucket.expiration == expiration:
                    return _NO_EXPIRATION
                # A bucket is only re-aimed once it is empty: live entries of another
                # rotation in it would be flushed late.
                assert bucket.head is entry, "bucket re-used while it holds entries"
                bucket.expiration = expiration
                key = self._key(bucket)
                heapq.heappush(self._heap, (key, bucket.id, bucket))
                return key
            k += 1
