"""A wheel loop's timer handles and their store: a timing wheel plus a near heap.

:mod:`aiopurgatory.loop` keeps every ``call_at`` timer of a loop here. This module is
the part of it that runs per timer, compiled with the rest of the hot path (one
source: pure Python without a compiler): :class:`TimerHandle` (asyncio's, with a link
to its wheel entry), the ``call_later`` and ``cancel`` of the fast path, and
:class:`LoopTimers`. The loop, its ready queue and its alarm are the caller's.

Why handles are filled here, and how. A ``call_later`` + ``cancel`` pair of asyncio's
own costs two ``__init__`` frames and ten slot writes; at a million pairs a second the
writes are most of the cost left once the wheel is O(1). Compiled, Cython would write a
slot of a Python class through the generic ``setattr`` (a type look-up per write, more
than the interpreter's specialised store). So the compiled build writes the slots of
:class:`TimerHandle` where they are: each slot's offset is read once, at import, from
its member descriptor, after checking it is a plain object slot of this class; if any
check fails, the build falls back to ``setattr``. The pure-Python build assigns the
attributes, the same fields in the same order.

Ground rules:

1. Tick ``k`` is the time ``origin + k * tick``. A deadline goes on the wheel at the
   *last* tick at or before it, never the next one, so the wheel hands an entry out at
   most one tick before it is due, never after (:func:`~aiopurgatory.timer.clock_tick`).
2. Handed-out entries wait in the *near heap*, ordered by ``(when, sequence)``: at most
   one tick's worth of timers. :meth:`LoopTimers.due` moves a handle from there to the
   ready queue only when ``when < end`` (the caller's "now plus clock resolution"), so
   none runs before its ``when``, and due ones run in deadline order, ties in call order.
   A deadline within the tick the wheel has reached goes straight to the near heap:
   nothing is rounded up to a tick.
3. A handle on the wheel is linked to its entry both ways (``handle._entry`` and
   ``entry.handle``); :meth:`LoopEntry.cancel` unlinks it at once, O(1). A handle in the
   near heap has no entry: cancelled there, it is dropped when it reaches the top.
4. The caller is told when to wake through the ``arm`` callable given at construction,
   called with a loop time only when the earliest work moves earlier (a new first
   bucket, a near deadline); :meth:`LoopTimers.due` returns the next wake-up.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time as _time
from collections.abc import Callable
from contextvars import Context, copy_context
from typing import Any, Final

from .timer import clock_tick
from .wheel import NO_EXPIRATION, TimerEntry, TimingWheel

try:
    import cython
except ImportError:  # Cython is needed to build, never to run
    from . import _nocython as cython

__all__ = ["COLLECT_CHUNK", "HANDLE_FIELDS", "LoopEntry", "LoopTimers", "TimerHandle", "call_later"]

_SPARE_ENTRIES: Final = 256
"""Cancelled entries a store keeps for its next timers (compiled build): a timer
cancelled and another scheduled, the commonest pattern of all (a timeout that did not
fire, then the next one), reuse one entry instead of freeing it and allocating one
(about a twelfth of a ``call_later`` + ``cancel`` pair)."""

COLLECT_CHUNK: Final = 1 << 16
"""Entries moved per ``collect_due`` call: every due entry of an iteration is collected
(the base loop runs all its due timers each iteration), in chunks of this size."""

_NO_EXPIRATION: Final = NO_EXPIRATION  # compiled: a C constant (looptimers.pxd)
_INF: Final = math.inf

if not cython.compiled:
    # Compiled: C functions of looptimers.pxd that read and write a slot at its offset.
    def _member_offset(descriptor: object, cls: type) -> int:
        return -1

    def _put(obj: object, offset: int, value: object) -> None:
        raise AssertionError("compiled only")

    def _get(obj: object, offset: int) -> Any:
        raise AssertionError("compiled only")

    def _alloc(cls: type) -> Any:
        raise AssertionError("compiled only")

    def _refcount(obj: object) -> int:
        raise AssertionError("compiled only")

    def _init(obj: object, offset: int, value: object) -> None:
        raise AssertionError("compiled only")

    def _monotonic() -> float:
        raise AssertionError("compiled only")

    _HAS_C_MONOTONIC = False  # compiled: timer.pxd's (Linux: time.monotonic's clock)

    _copy_context = copy_context  # compiled: CPython's PyContext_CopyCurrent, no call


class TimerHandle(asyncio.TimerHandle):
    """An ``asyncio.TimerHandle`` whose timer is an entry on a wheel loop's wheel.

    Named like its base so that its repr is the stock one.
    """

    __slots__ = ("_entry",)

    # asyncio's own slots, untyped in typeshed.
    _when: float
    _scheduled: bool
    _cancelled: bool
    _source_traceback: list[Any] | None
    _entry: LoopEntry | None
    _context: Context
    _loop: asyncio.AbstractEventLoop
    _callback: Callable[..., object] | None
    _repr: str | None

    def cancel(self) -> None:
        """asyncio's ``TimerHandle.cancel`` then ``Handle.cancel``, in one frame: the
        entry leaves the wheel at once, then the handle is marked as asyncio marks it."""
        if cython.compiled and _FAST:
            _cancel_fast(self)
            return
        entry = self._entry
        if entry is not None:
            self._entry = None
            entry.cancel()
        if not self._cancelled:
            self._cancelled = True
            if self._loop._wheel_timers.debug:  # type: ignore[attr-defined]  # get_debug()
                # As asyncio: keep the repr with the callback before dropping it.
                self._repr = repr(self)
            self._callback = None
            self._args = None  # type: ignore[assignment]


HANDLE_FIELDS: Final = (
    "_args",
    "_callback",
    "_cancelled",
    "_context",
    "_entry",
    "_loop",
    "_repr",
    "_scheduled",
    "_source_traceback",
    "_when",
)
"""A handle's fields: the fast path sets them all itself (tests/loop/test_loop.py checks that
these are every slot asyncio's classes have, but ``__weakref__``)."""


def _slot_offsets() -> list[int] | None:
    """Each of :data:`HANDLE_FIELDS`'s offset in a :class:`TimerHandle`, or None if one
    is not a plain, writable object slot (then the fields are set by name)."""
    offsets = []
    for name in HANDLE_FIELDS:
        for klass in TimerHandle.__mro__:
            descriptor = klass.__dict__.get(name)
            if descriptor is not None:
                break
        offset = _member_offset(descriptor, TimerHandle)
        if offset < 0:
            return None
        offsets.append(offset)
    return offsets


_OFFSETS = _slot_offsets()
_FAST: Final = _OFFSETS is not None
if _OFFSETS is not None:
    (_ARGS, _CALLBACK, _CANCELLED, _CONTEXT, _ENTRY, _LOOP, _REPR, _SCHEDULED,
     _SOURCE_TRACEBACK, _WHEN) = _OFFSETS  # fmt: skip
else:
    _ARGS = _CALLBACK = _CANCELLED = _CONTEXT = _ENTRY = -1
    _LOOP = _REPR = _SCHEDULED = _SOURCE_TRACEBACK = _WHEN = -1


def _cancel_fast(handle: TimerHandle) -> None:
    """:meth:`TimerHandle.cancel` through the slots' offsets (compiled build)."""
    timers = None
    entry = _get(handle, _ENTRY)
    if entry is not None:
        _put(handle, _ENTRY, None)
        timers = cython.cast(LoopEntry, entry)._store
        cython.cast(LoopEntry, entry).cancel()
        # Unlinked now (no field but deadline_tick set). Kept for the store's next
        # timer only if this frame holds the last reference to it.
        if timers is not None and _refcount(entry) == 1:
            cython.cast(LoopTimers, timers)._keep_spare(cython.cast(LoopEntry, entry))
    if _get(handle, _CANCELLED) is not True:
        _put(handle, _CANCELLED, True)
        if timers is None:  # in the near heap: no entry to ask
            timers = _get(handle, _LOOP)._wheel_timers
        if cython.cast(LoopTimers, timers).debug:
            handle._repr = repr(handle)
        _put(handle, _CALLBACK, None)
        _put(handle, _ARGS, None)


def call_later(
    loop: Any,
    delay: float,
    callback: Callable[..., object],
    *args: Any,
    context: Context | None = None,
) -> TimerHandle:
    """A wheel loop's ``call_later`` (bound as its method; see :func:`call_at`)."""
    if delay is None:
        raise TypeError("delay must not be None")
    timers = cython.cast(LoopTimers, loop._wheel_timers)
    if cython.compiled and timers._monotonic_clock and type(delay) is float:
        # time.monotonic() + delay, the same double, without the call (a tenth of a
        # pair's cost once the rest is C) nor the float of "now" in between.
        return _timer(
            loop, timers, _monotonic() + cython.cast(cython.double, delay), callback, args, context
        )
    return _timer(loop, timers, timers._clock() + delay, callback, args, context)


def call_at(
    loop: Any,
    when: float,
    callback: Callable[..., object],
    *args: Any,
    context: Context | None = None,
) -> TimerHandle:
    """A wheel loop's ``call_at`` (bound as its method): asyncio's checks in its order,
    then the handle asyncio's ``__init__`` would make, on the wheel. A closed loop and
    debug mode take the loop's own ``_wheel_timer_checked`` (asyncio's checks and
    constructor, whose source traceback must end at the caller's line)."""
    if when is None:
        raise TypeError("when cannot be None")
    return _timer(loop, cython.cast(LoopTimers, loop._wheel_timers), when, callback, args, context)


def _timer(
    loop: Any,
    timers: LoopTimers,
    when: float,
    callback: Callable[..., object],
    args: tuple[Any, ...],
    context: Context | None,
) -> TimerHandle:
    if timers.closed or timers.debug:
        return loop._wheel_timer_checked(when, callback, args, context)  # type: ignore[no-any-return]
    if context is None:
        context = _copy_context()
    if cython.compiled and _FAST:
        handle = _alloc(TimerHandle)  # every slot NULL: _init, nothing to release
        _init(handle, _CONTEXT, context)
        _init(handle, _LOOP, loop)
        _init(handle, _CALLBACK, callback)
        _init(handle, _ARGS, args)
        _init(handle, _CANCELLED, False)
        _init(handle, _REPR, None)
        _init(handle, _SOURCE_TRACEBACK, None)
        _init(handle, _WHEN, when)
        _init(handle, _SCHEDULED, True)
        _init(handle, _ENTRY, timers.add(handle, when))
        return handle  # type: ignore[no-any-return]
    handle = TimerHandle.__new__(TimerHandle)
    handle._context = context
    handle._loop = loop
    handle._callback = callback
    handle._args = args
    handle._cancelled = False
    handle._repr = None
    handle._source_traceback = None
    handle._when = when
    handle._scheduled = True
    handle._entry = timers.add(handle, when)
    return handle


@cython.cclass
class LoopEntry(TimerEntry):
    """The wheel's node for one timer handle (the wheel links entries, not handles)."""

    __slots__ = ("_store", "handle")

    # Set by LoopTimers.add right after construction (no __init__: one call less).
    handle: Any
    _store: LoopTimers | None

    def cancel(self) -> None:
        """Take the entry off its store's wheel now (its handle was cancelled)."""
        store = self._store
        if store is not None:
            self._store = None
            self.handle = None
            store._wheel.remove(self)


@cython.cclass
class LoopTimers:
    """One loop's timers (rules in the module doc).

    Args:
        time: the loop's clock (read once, at the first timer: the grid's origin).
        arm: called with a loop time at which the caller must call :meth:`due` at the
            latest, when that time moves earlier.
        tick: seconds per wheel tick.
        wheel_size: buckets per wheel level.
        clock: what ``call_later`` reads for "now" (default: ``time``).
    """

    __slots__ = (
        "_arm",
        "_clock",
        "_monotonic_clock",
        "_near",
        "_origin",
        "_out",
        "_seq",
        "_spare",
        "_spares",
        "_tick",
        "_time",
        "_wheel",
        "closed",
        "debug",
    )

    def __init__(
        self,
        time: Callable[[], float],
        arm: Callable[[float], object],
        tick: float,
        wheel_size: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not tick > 0.0 or tick == _INF:
            raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
        self._wheel = TimingWheel(wheel_size)
        self._time = time
        # What call_later reads: the loop's time() or, when that is asyncio's own,
        # the function it returns (a Python frame less per timer).
        self._clock = time if clock is None else clock
        # Compiled on Linux, time.monotonic is read in C (the same value).
        self._monotonic_clock = _HAS_C_MONOTONIC and self._clock is _time.monotonic
        self._arm = arm
        # The loop's own state, mirrored by the loop (its close() and set_debug(), the
        # only writers asyncio has): read per timer, where a look-up on the loop
        # instance would cost more than the rest of call_later's checks.
        self.closed = False
        self.debug = False
        self._tick = tick
        # Read at the first timer, not here: a loop whose time() needs its own
        # __init__ finished (CPython's virtual-time TestLoop) could not answer yet.
        self._origin = math.nan
        self._near: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._out: list[TimerEntry] = []
        # Up to _SPARE_ENTRIES cancelled entries (kept by the compiled cancel), chained
        # through their ``handle`` field: no list to grow and shrink per pair.
        self._spare: LoopEntry | None = None
        self._spares = 0

    def __len__(self) -> int:
        """Timers on the wheel or in the near heap, cancelled ones in the heap included."""
        return len(self._wheel) + len(self._near)

    def add(self, handle: Any, when: float) -> LoopEntry | None:
        """Keep ``handle`` until ``when``; its entry if it went on the wheel (the caller
        stores it in ``handle._entry``), None if it went to the near heap."""
        origin = self._origin
        if origin != origin:  # NaN: the loop's first timer
            origin = self._origin = self._time()
        tick = self._tick
        wheel = self._wheel
        k = clock_tick(when, tick, origin)
        if wheel.clamp_future(k) == k:  # after the tick the wheel has reached
            entry = self._spare
            if entry is not None:  # a cancelled entry, unlinked, no one else holding it
                self._spare = entry.handle
                self._spares -= 1
            else:  # compiled: the fields are zeroed by the allocator, no __init__ call
                entry = LoopEntry.__new__(LoopEntry) if cython.compiled else LoopEntry()
            entry.handle = handle
            entry._store = self
            expiration = wheel.schedule(entry, k)
            if expiration != _NO_EXPIRATION:
                self._arm(origin + expiration * tick)
            return entry
        # Within the tick the wheel has reached (or before): never rounded up.
        self._seq += 1
        heapq.heappush(self._near, (when, self._seq, handle))
        self._arm(when)
        return None

    def _keep_spare(self, entry: LoopEntry) -> None:
        """Keep a cancelled entry (unlinked, referenced by no one) for the next timer."""
        if self._spares < _SPARE_ENTRIES:
            entry.handle = self._spare
            self._spare = entry
            self._spares += 1

    def due(self, end: float, ready: Any) -> float:
        """Append to ``ready`` every live handle whose ``when`` is before ``end``, in
        deadline order (each marked ``_scheduled = False``, as asyncio marks a timer it
        takes); returns when the next one needs work (``inf``: none)."""
        near = self._near
        wheel = self._wheel
        origin = self._origin
        tick = self._tick
        if len(wheel):
            now_tick = clock_tick(end, tick, origin)
            out = self._out
            while True:
                done = wheel.collect_due(now_tick, out, COLLECT_CHUNK)
                for item in out:
                    entry = cython.cast(LoopEntry, item)
                    handle = entry.handle
                    entry.handle = None
                    entry._store = None
                    handle._entry = None
                    self._seq += 1
                    heapq.heappush(near, (handle._when, self._seq, handle))
                out.clear()
                if done:
                    break
        while near:
            when, _, handle = near[0]
            if handle._cancelled:
                heapq.heappop(near)
                continue
            if when >= end:
                break
            heapq.heappop(near)
            handle._scheduled = False
            ready.append(handle)
        return self.next_wake()

    def next_wake(self) -> float:
        """When the next timer needs work: the first tick of the wheel's earliest
        bucket, or the earliest live deadline in the near heap (``inf``: none)."""
        near = self._near
        while near and near[0][2]._cancelled:  # a cancelled timer wakes no one
            heapq.heappop(near)
        wake: float = near[0][0] if near else _INF
        expiration = self._wheel.next_expiration()
        if expiration is not None:
            wake = min(wake, self._origin + expiration * self._tick)
        return wake

    def live(self) -> int:
        """Timers pending: on the wheel, or in the near heap and not cancelled."""
        return len(self._wheel) + sum(1 for _, _, h in self._near if not h._cancelled)

    def handles(self) -> list[Any]:
        """The pending handles, O(timers) (for introspection, not the hot path)."""
        found = [cython.cast(LoopEntry, e).handle for e in self._wheel.entries()]
        found.extend(h for _, _, h in self._near if not h._cancelled)
        return found

    def clear(self) -> None:
        """Drop every timer (the loop closed): nothing stays linked or referenced."""
        for item in self._wheel.clear():
            entry = cython.cast(LoopEntry, item)
            handle = entry.handle
            entry.handle = None
            entry._store = None
            if handle is not None:
                handle._entry = None
        self._near.clear()
        self._spare = None  # the chain goes with its head
        self._spares = 0
