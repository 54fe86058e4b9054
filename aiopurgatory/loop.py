"""Event loops whose ``call_later`` / ``call_at`` timers live on the timing wheel.

``new_event_loop(base)`` returns a loop of a subclass of ``base`` (asyncio's default
loop class when None) in which every timer scheduled through ``call_at`` (and so
``call_later``, ``asyncio.sleep``, ``asyncio.timeout``, ``wait_for`` and every
library's timers) is an entry on a :class:`~aiopurgatory.wheel.TimingWheel` instead of
an item of the base loop's heap. Everything else (``call_soon``, I/O, signals,
``close``, debug mode) is the base loop's own code.

Ground rules:

1. The handles are real :class:`asyncio.TimerHandle` objects (a subclass with one
   more slot, the link to its wheel entry): ``when()``, ``cancel()``, ``cancelled()``,
   repr and ``context=`` are asyncio's own code.
2. Ticks map to times by ``origin + k * tick`` and a deadline goes to the *last* tick
   at or before it (:func:`~aiopurgatory.timer.clock_tick`), never the next one: an
   entry is handed out by the wheel at most one tick *before* it is due, never after.
   Handed-out entries wait in a small heap ordered by ``(when, sequence)`` (the
   *near* heap: at most one tick's worth of timers) and move to the ready queue only
   when ``when < now + clock_resolution``, the base loop's own rule. So a callback
   never runs before its ``when`` by ``loop.time()``, callbacks due in one iteration
   run in deadline order (ties in call order), and sub-tick deadlines are not rounded
   up to a tick.
3. ``cancel()`` unlinks the entry from the wheel at once (O(1)); a handle already in
   the near heap is skipped when it reaches the top (that heap holds one tick at most).
   Cancelled timers are not counted in ``_timer_cancelled_count``: there is nothing
   for the base loop to purge.
4. How the base loop learns how long to sleep: its heap ``_scheduled`` holds at most
   one item, the *alarm*, a ``TimerHandle`` whose ``when`` is the earliest time the
   wheel or the near heap has work (a bucket's first tick, or the near heap's first
   deadline). The base ``_run_once`` computes its select timeout from it unchanged.
   When the base loop moves the due alarm to its ready queue it marks it
   ``_scheduled = False``; the alarm's ``_scheduled`` is a property whose setter is
   the hook where due wheel timers are appended to the ready queue, in deadline
   order, at the place where the base loop appends its own due timers (after the I/O
   callbacks of that iteration). The alarm itself then runs as a no-op callback.
   ``_run_once`` is not overridden.
5. The wheel knows nothing of asyncio: this module uses only its public API
   (``schedule``, ``remove``, ``next_expiration``, ``collect_due``, ``clear``).
6. The wheel-loop class of ``base`` puts the base's own methods first, then this
   module's, then ``BaseEventLoop``'s: a base that overrides ``call_at`` (CPython's
   virtual-time ``TestLoop``) still sees every timer, and then ``call_later`` is
   asyncio's own, through that override. Outside debug mode ``call_later`` fills the
   handle's slots itself and ``cancel`` does asyncio's two steps in one frame (the
   hot path); in debug mode handles are built by asyncio's constructor, so source
   tracebacks end at the caller's line.

Introspection. :meth:`~_WheelLoopMixin.timer_stats` counts the pending timers by
the owner of their callback (:func:`timer_owner`), walking the wheel's entries only
when asked (:meth:`TimingWheel.entries <aiopurgatory.wheel.TimingWheel.entries>`):
nothing is kept for it on the ``call_later`` / ``cancel`` path.

uvloop. ``uvloop.Loop`` (or a subclass) is a base too, but it has no ``_scheduled``
heap nor ``_run_once`` (rule 4) and its ``call_later`` is Cython: its wheel loops are
made by ``aiopurgatory._loop_uv`` (imported only then; this module never imports
uvloop), whose mixin goes *before* the base and wakes the loop with one uvloop timer.
Rules 1-3 and 5 hold there as here; what the two kinds share (the wheel's state,
moving due entries to the near heap, the next wake-up, introspection) is
:class:`_WheelBase`, and both insert through :meth:`_WheelLoopMixin._wheel_add`
(which calls ``self._wheel_arm``, each kind's own).

Not yet: the compiled build of this module.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
import types
from collections.abc import Callable, Iterator, Sequence
from contextvars import Context, copy_context
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .timer import clock_tick
from .wheel import NO_EXPIRATION, TimerEntry, TimingWheel

__all__ = [
    "TICK",
    "WHEEL_SIZE",
    "OwnerTimers",
    "TimerHandle",
    "TimerStats",
    "WheelEventLoopPolicy",
    "install",
    "is_wheel_loop",
    "loop_factory",
    "new_event_loop",
    "timer_owner",
    "wheel_loop_class",
]

TICK: Final = 0.001
"""Seconds per wheel tick. Precision does not depend on it (rule 2): it sets how many
entries share a bucket and how often an idle loop with far timers wakes for a cascade."""

WHEEL_SIZE: Final = 256
"""Buckets per wheel level: 256 ms at level 0, about 65 s at level 1, 4.7 h at level 2."""

_COLLECT_CHUNK: Final = 1 << 16
"""Entries moved per ``collect_due`` call; every due entry of an iteration is collected
(the base loop runs all its due timers each iteration), in chunks of this size."""


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
    _entry: _Entry | None
    _context: Context
    _loop: asyncio.AbstractEventLoop
    _callback: Callable[..., object] | None
    _repr: str | None

    def cancel(self) -> None:
        """asyncio's ``TimerHandle.cancel`` then ``Handle.cancel``, in one frame: the
        entry leaves the wheel at once (rule 3), then the handle is marked as asyncio
        marks it."""
        entry = self._entry
        if entry is not None:
            self._entry = None
            entry.handle = None
            self._loop._wheel.remove(entry)  # type: ignore[attr-defined]  # False: near heap
        if not self._cancelled:
            self._cancelled = True
            if self._loop.get_debug():
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
"""A wheel handle's fields: call_later sets them all itself outside debug mode."""


class _Entry(TimerEntry):
    """The wheel's node for one handle (the wheel links entries, not handles)."""

    __slots__ = ("handle",)

    handle: TimerHandle | None  # set right after construction (no __init__: one frame less)


def _no_op() -> None:
    """The alarm's callback: its work is done when the base loop takes it (rule 4)."""


class _Alarm(asyncio.TimerHandle):
    """The one item of the base loop's heap: wakes the loop for the wheel (rule 4)."""

    __slots__ = ("_in_heap", "_owner")

    _when: float  # asyncio's slot, untyped in typeshed

    def __init__(self, owner: _WheelLoopMixin) -> None:
        self._owner: _WheelLoopMixin | None = None  # no hook while asyncio sets it up
        self._in_heap = False
        super().__init__(0.0, _no_op, (), owner, None)
        self._owner = owner

    def _get_scheduled(self) -> bool:
        return self._in_heap

    def _set_scheduled(self, value: bool) -> None:
        was = self._in_heap
        self._in_heap = value
        # The base loop sets False when it moves the due alarm to the ready queue:
        # the exact place where its own due timers join the queue.
        if was and not value and self._owner is not None:
            self._owner._wheel_due()

    # Shadows the slot of asyncio.TimerHandle (a data descriptor found first in the MRO).
    _scheduled = property(_get_scheduled, _set_scheduled)


class _WheelBase:
    """What every wheel loop has, whatever its base: the wheel, the near heap, moving
    due entries from one to the other, and introspection.

    Mixed in by :class:`_WheelLoopMixin` (asyncio's loops, woken by the alarm of rule
    4) and by ``aiopurgatory._loop_uv`` (uvloop's, woken by one uvloop timer). None of
    its methods is on the ``call_later`` / ``cancel`` path.
    """

    _wheel: TimingWheel
    _wheel_origin: float
    _wheel_near: list[tuple[float, int, TimerHandle]]
    _wheel_seq: Iterator[int]
    _wheel_out: list[TimerEntry]

    if TYPE_CHECKING:  # the base loop's; not defined here, so the base's is found

        def time(self) -> float: ...

    def _wheel_setup(self) -> None:
        """The wheel's state; called once the base loop's ``__init__`` has run."""
        self._wheel = TimingWheel(WHEEL_SIZE)
        # The tick grid's origin: the loop's time at its first timer. Not read here,
        # where a base whose time() needs its own __init__ finished (the CPython
        # suites' virtual-time TestLoop) could not answer yet.
        self._wheel_origin = math.nan
        self._wheel_near = []
        self._wheel_seq = itertools.count()
        self._wheel_out = []

    def _wheel_collect(self, end: float) -> None:
        """Move every wheel entry whose tick is at or before ``end`` to the near heap
        (where it waits for its own ``when``), in chunks of :data:`_COLLECT_CHUNK`."""
        wheel = self._wheel
        if not len(wheel):
            return
        now_tick = clock_tick(end, TICK, self._wheel_origin)
        out = self._wheel_out
        near = self._wheel_near
        seq = self._wheel_seq
        while True:
            done = wheel.collect_due(now_tick, out, _COLLECT_CHUNK)
            for entry in out:
                handle = entry.handle  # type: ignore[attr-defined]
                entry.handle = None  # type: ignore[attr-defined]
                handle._entry = None
                heapq.heappush(near, (handle._when, next(seq), handle))
            out.clear()
            if done:
                break

    def _wheel_next_wake(self) -> float:
        """The earliest time the wheel or the near heap has work (``inf``: none).

        Drops the cancelled handles at the top of the near heap first, so that a
        cancelled timer does not wake the loop.
        """
        near = self._wheel_near
        while near and near[0][2]._cancelled:
            heapq.heappop(near)
        wake = near[0][0] if near else math.inf
        expiration = self._wheel.next_expiration()
        if expiration is not None:
            wake = min(wake, self._wheel_origin + expiration * TICK)
        return wake

    def _wheel_drop(self) -> None:
        """Drop every timer (at ``close()``): nothing on the wheel pins memory."""
        for entry in self._wheel.clear():
            entry.handle = None  # type: ignore[attr-defined]
        self._wheel_near.clear()

    def wheel_timers(self) -> int:
        """Timers waiting on the wheel or in the near heap (cancelled ones excluded)."""
        return len(self._wheel) + sum(1 for _, _, h in self._wheel_near if not h._cancelled)

    def timer_stats(self) -> TimerStats:
        """The pending timers (those of :meth:`wheel_timers`) counted by owner.

        O(timers), computed now from the wheel's entries and the near heap (about 1 µs
        per timer, and it holds the loop meanwhile); call it from the loop's thread (a
        debugging page, a metrics scrape on the loop).
        """
        rows: dict[str, list[float]] = {}  # owner -> [count, earliest when, latest when]
        handles = [entry.handle for entry in self._wheel.entries()]  # type: ignore[attr-defined]
        handles.extend(h for _, _, h in self._wheel_near if not h._cancelled)
        # The owner of a plain function or of a method of a class outside asyncio
        # depends on nothing else: resolved once per function (and class) per call.
        known: dict[object, str] = {}
        for handle in handles:
            if handle is None:
                continue
            callback = handle._callback
            if callback is None:
                continue
            when = handle._when
            func = getattr(callback, "__func__", callback)
            key = (func, type(getattr(callback, "__self__", None)))
            owner = known.get(key)
            if owner is None:
                owner = timer_owner(callback, handle._args)
                if _fixed_owner(callback):
                    known[key] = owner
            row = rows.get(owner)
            if row is None:
                rows[owner] = [1, when, when]
            else:
                row[0] += 1
                row[1] = min(row[1], when)
                row[2] = max(row[2], when)
        owners = tuple(
            OwnerTimers(owner, int(count), first, last)
            for owner, (count, first, last) in sorted(
                rows.items(), key=lambda item: (-item[1][0], item[0])
            )
        )
        return TimerStats(sum(o.count for o in owners), owners, self.time())


class _WheelLoopMixin(_WheelBase, asyncio.BaseEventLoop):
    """The timer methods of a wheel loop; mixed in before the base loop class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wheel_setup()
        self._wheel_alarm = _Alarm(self)

    # -- scheduling ----------------------------------------------------------------

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> TimerHandle:
        """Schedule ``callback(*args)`` ``delay`` seconds from now, on the wheel."""
        # What the base's call_later does through call_at, in one frame (the hot path).
        # Its checks in its order; the messages name call_at, as asyncio's do.
        if delay is None:
            raise TypeError("delay must not be None")
        when = self.time() + delay
        if self._closed:  # type: ignore[attr-defined]
            self._check_closed()  # type: ignore[attr-defined]  # raises
        if self._debug:  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]
            handle = TimerHandle(when, callback, args, self, context)
            if handle._source_traceback:
                # Drop this frame: the traceback ends at the caller's line, as the base's.
                del handle._source_traceback[-1]
        else:
            # asyncio's two __init__ frames (Handle's, TimerHandle's) were half of the
            # cost of a pair; outside debug mode they only fill the slots, so fill them
            # here (tests/test_loop.py checks every slot of the bases is set).
            handle = TimerHandle.__new__(TimerHandle)
            handle._context = copy_context() if context is None else context
            handle._loop = self
            handle._callback = callback
            handle._args = args
            handle._cancelled = False
            handle._repr = None
            handle._source_traceback = None
            handle._when = when
        self._wheel_add(handle, when)
        return handle

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> TimerHandle:
        """Schedule ``callback(*args)`` at ``when`` (``loop.time()``), on the wheel."""
        # The base loop's checks, in its order (a coroutine function is refused only
        # in debug mode, as asyncio does).
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()  # type: ignore[attr-defined]
        if self._debug:  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]
        handle = TimerHandle(when, callback, args, self, context)
        if handle._source_traceback:
            del handle._source_traceback[-1]
        self._wheel_add(handle, when)
        return handle

    def _wheel_add(self, handle: TimerHandle, when: float) -> None:
        entry = _Entry()
        entry.handle = handle
        handle._entry = entry
        handle._scheduled = True
        wheel = self._wheel
        origin = self._wheel_origin
        if origin != origin:  # NaN: this loop's first timer
            origin = self._wheel_origin = self.time()
        k = clock_tick(when, TICK, origin)
        if k > wheel.now:
            expiration = wheel.schedule(entry, k)
            if expiration != NO_EXPIRATION:
                self._wheel_arm(origin + expiration * TICK)
        else:
            # Within the tick the wheel has reached (or earlier): straight to the near
            # heap, never rounded to the next tick.
            heapq.heappush(self._wheel_near, (when, next(self._wheel_seq), handle))
            self._wheel_arm(when)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """Called by ``TimerHandle.cancel()`` while scheduled: free the entry now."""
        if isinstance(handle, TimerHandle):
            entry = handle._entry
            if entry is not None:
                handle._entry = None
                self._wheel.remove(entry)  # False if already in the near heap
                entry.handle = None
            return
        super()._timer_handle_cancelled(handle)  # type: ignore[misc]

    # -- the alarm (rule 4) ----------------------------------------------------------

    def _wheel_arm(self, when: float) -> None:
        """Make the base loop wake at ``when`` at the latest."""
        alarm = self._wheel_alarm
        if alarm._in_heap:
            if when < alarm._when:
                alarm._when = when
                # The heap holds only the alarm unless someone pushed into it directly.
                if len(self._scheduled) > 1:  # type: ignore[attr-defined]
                    heapq.heapify(self._scheduled)  # type: ignore[attr-defined]
            return
        alarm._when = when
        alarm._in_heap = True
        heapq.heappush(self._scheduled, alarm)  # type: ignore[attr-defined]

    def _wheel_due(self) -> None:
        """Append every due wheel timer to the ready queue in deadline order, re-arm."""
        end = self.time() + self._clock_resolution  # type: ignore[attr-defined]
        near = self._wheel_near
        self._wheel_collect(end)
        ready = self._ready  # type: ignore[attr-defined]
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
        wake = self._wheel_next_wake()
        if wake != math.inf:
            # Never at or before ``end``: the base loop would take the alarm again in
            # this same pass (its own end time is at most ours).
            self._wheel_arm(max(wake, end))

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the base loop, then drop every wheel timer (nothing pins memory)."""
        super().close()
        self._wheel_drop()
        self._wheel_alarm._in_heap = False


@dataclass(frozen=True, slots=True)
class OwnerTimers:
    """The pending timers of one owner (see :func:`timer_owner`)."""

    owner: str
    count: int
    next_when: float
    """The earliest ``when`` (``loop.time()``) among them: the next to fall due."""
    last_when: float
    """The latest ``when`` among them: how far ahead this owner holds timers."""


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A wheel loop's pending timers at one instant (:meth:`timer_stats`)."""

    count: int
    owners: tuple[OwnerTimers, ...]
    """One row per owner, most timers first (ties by name)."""
    time: float
    """``loop.time()`` when counted: ``next_when - time`` is how soon a timer is due."""


def timer_owner(callback: Callable[..., object], args: Sequence[object] = ()) -> str:
    """Who a timer's callback belongs to, as ``module.qualname``.

    - a bound method: its object's class ``module.qualname`` and the method's name;
    - a :class:`functools.partial`: the function it wraps (and its arguments first);
    - a task's wake-up: the task's coroutine (``module.qualname``);
    - what ``asyncio`` itself schedules for a waiting task: ``asyncio.sleep`` and 3.11's
      ``wait_for`` put a function of ``asyncio`` whose first argument is the future the
      task waits on, ``asyncio.timeout`` (and 3.12's ``wait_for``) a method of its
      ``Timeout``: each resolves to the waiting task's coroutine, the code that asked;
    - any other function: its ``module.qualname``.
    """
    for _ in range(8):  # partials of partials, without trusting an unbounded chain
        if not isinstance(callback, functools.partial):
            break
        args = (*callback.args, *args)
        callback = callback.func
    bound = getattr(callback, "__self__", None)
    if bound is not None and not isinstance(bound, types.ModuleType):  # builtins: a module
        if isinstance(bound, asyncio.Task):
            return _task_owner(bound)
        cls = type(bound)
        if cls.__module__.startswith("asyncio"):
            # asyncio's Timeout keeps its task in a private slot; no public accessor.
            task = getattr(bound, "_task", None)
            if isinstance(task, asyncio.Task):
                return _task_owner(task)
        name = getattr(callback, "__name__", "?")
        return f"{cls.__module__}.{cls.__qualname__}.{name}"
    module = getattr(callback, "__module__", None) or "?"
    qualname = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    if module.startswith("asyncio") and args and isinstance(args[0], asyncio.Future):
        task = _waiting_task(args[0])
        if task is not None:
            return _task_owner(task)
    return f"{module}.{qualname}"


def _fixed_owner(callback: Callable[..., object]) -> bool:
    """Whether :func:`timer_owner` of ``callback`` depends only on its function and the
    class of its ``__self__``: not a partial, nor anything of asyncio (which resolves
    to a task, through its arguments or its object)."""
    if isinstance(callback, functools.partial):
        return False
    bound = getattr(callback, "__self__", None)
    if isinstance(bound, asyncio.Task):  # a Task subclass of any module: per task
        return False
    module = (
        type(bound).__module__
        if bound is not None and not isinstance(bound, types.ModuleType)
        else getattr(callback, "__module__", None) or ""
    )
    return not module.startswith("asyncio") and not module.startswith("_asyncio")


def _waiting_task(future: asyncio.Future[Any]) -> asyncio.Task[Any] | None:
    """The task that awaits ``future``: its wake-up is among the future's callbacks."""
    # Private (both the C and the Python Future have it); read only, when asked.
    for item in getattr(future, "_callbacks", None) or ():
        callback = item[0] if isinstance(item, tuple) else item
        bound = getattr(callback, "__self__", None)
        if isinstance(bound, asyncio.Task):
            return bound
    return None


def _task_owner(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    qualname = getattr(coro, "__qualname__", None) or type(coro).__qualname__
    frame = getattr(coro, "cr_frame", None)
    module = frame.f_globals.get("__name__") if frame is not None else None
    return f"{module}.{qualname}" if module else qualname


_classes: dict[type[asyncio.AbstractEventLoop], type[asyncio.AbstractEventLoop]] = {}


def wheel_loop_class(base: type[asyncio.AbstractEventLoop] | None = None) -> type[Any]:
    """The wheel-loop subclass of ``base`` (one class per base, made on first use).

    ``base`` is an ``asyncio.BaseEventLoop`` subclass (woken by the alarm of rule 4)
    or ``uvloop.Loop`` or a subclass of it (woken by one uvloop timer: see
    ``aiopurgatory._loop_uv``, imported only then).

    Raises:
        TypeError: ``base`` is neither an ``asyncio.BaseEventLoop`` subclass nor a
            ``uvloop.Loop`` subclass.
    """
    if base is None:
        base = asyncio.SelectorEventLoop
    cls = _classes.get(base)
    if cls is not None:
        return cls
    if not isinstance(base, type):
        raise TypeError(f"base must be an event loop class, got {base!r}")
    if _is_uvloop(base):
        from ._loop_uv import uv_wheel_loop_class  # the only place uvloop's code enters

        cls = uv_wheel_loop_class(base)
        _classes[base] = cls
        return cls
    if not issubclass(base, asyncio.BaseEventLoop):
        raise TypeError(
            f"base must be an asyncio.BaseEventLoop subclass that schedules its timers "
            f"through call_at, or uvloop.Loop, got {base.__qualname__}"
        )
    if issubclass(base, _WheelLoopMixin):
        cls = base
    else:
        # The base's own methods first, then the wheel's, then BaseEventLoop's: a
        # base that overrides call_at (to record or adjust timers) still sees each one.
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": f"Wheel{base.__qualname__}",
        }
        base_call_at = base.call_at
        base_call_later = base.call_later
        if (
            base_call_at is not asyncio.BaseEventLoop.call_at
            and base_call_later is asyncio.BaseEventLoop.call_later
        ):
            # The wheel's call_later does not go through call_at (one frame less on
            # the hot path); asyncio's does, through the base's override.
            namespace["call_later"] = asyncio.BaseEventLoop.call_later
        cls = type(f"Wheel{base.__name__}", (base, _WheelLoopMixin), namespace)
    _classes[base] = cls
    return cls


def _is_uvloop(base: type) -> bool:
    """Whether ``base`` is uvloop's loop or a subclass of it (known without importing
    uvloop: by the module of a class of its MRO)."""
    return any(c.__module__.split(".")[0] == "uvloop" for c in base.__mro__)


def new_event_loop(base: type[asyncio.AbstractEventLoop] | None = None) -> Any:
    """A new event loop of a subclass of ``base`` whose timers run on the wheel."""
    return wheel_loop_class(base)()


def loop_factory(base: type[asyncio.AbstractEventLoop] | None = None) -> Callable[[], Any]:
    """A zero-argument factory for ``asyncio.Runner(loop_factory=...)``."""
    # The class itself takes no argument; made now so that a bad base fails here,
    # not inside the runner.
    return wheel_loop_class(base)


def is_wheel_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` runs its timers on the wheel."""
    return isinstance(loop, _WheelBase)


class WheelEventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """asyncio's default policy whose new loops are wheel loops."""

    def __init__(self, base: type[asyncio.AbstractEventLoop] | None = None) -> None:
        super().__init__()
        self._wheel_factory = loop_factory(base)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self._wheel_factory()
        return loop


def install(base: type[asyncio.AbstractEventLoop] | None = None) -> WheelEventLoopPolicy:
    """Set a policy so that ``asyncio.run()`` and ``asyncio.new_event_loop()`` make
    wheel loops; returns it (``asyncio.set_event_loop_policy(None)`` undoes it)."""
    policy = WheelEventLoopPolicy(base)
    asyncio.set_event_loop_policy(policy)
    return policy
