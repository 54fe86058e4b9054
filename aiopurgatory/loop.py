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
5. The per-timer work is :mod:`aiopurgatory.looptimers` (compiled with the hot path):
   the handle class, ``call_later`` / ``call_at`` / ``cancel`` outside debug mode, and
   the wheel plus near heap (:class:`~aiopurgatory.looptimers.LoopTimers`). The wheel
   itself knows nothing of asyncio.
6. The wheel-loop class of ``base`` puts the base's own methods first, then this
   module's, then ``BaseEventLoop``'s: a base that overrides ``call_at`` (CPython's
   virtual-time ``TestLoop``) still sees every timer, and then ``call_later`` is
   asyncio's own, through that override. In debug mode (and on a closed loop) handles
   are built by asyncio's constructor, so source tracebacks end at the caller's line.

Introspection. :meth:`~_WheelLoopMixin.timer_stats` counts the pending timers by
the owner of their callback (:func:`timer_owner`), walking the wheel's entries only
when asked (:meth:`TimingWheel.entries <aiopurgatory.wheel.TimingWheel.entries>`):
nothing is kept for it on the ``call_later`` / ``cancel`` path.

uvloop. ``uvloop.Loop`` (or a subclass) is a base too, but it has no ``_scheduled``
heap nor ``_run_once`` (rule 4) and its ``call_later`` is Cython: its wheel loops are
made by ``aiopurgatory._loop_uv`` (imported only then; this module never imports
uvloop), whose mixin goes *before* the base and wakes the loop with one uvloop timer.
Rules 1-3 and 5 hold there as here; what the two kinds share (the timers' store, the
hot path, cancellation, introspection) is ``aiopurgatory._loop_wheel``, below both.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from ._loop_wheel import (
    TICK,
    WHEEL_SIZE,
    OwnerTimers,
    TimerStats,
    _wheel_class,
    _WheelBase,
    timer_owner,
)
from .looptimers import HANDLE_FIELDS as HANDLE_FIELDS
from .looptimers import TimerHandle

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


class _WheelLoopMixin(_WheelBase, asyncio.BaseEventLoop):  # type: ignore[misc]
    """The timer methods of a wheel loop on asyncio; mixed in after the base loop class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wheel_alarm = _Alarm(self)
        # call_later reads the clock itself: asyncio's time() is time.monotonic().
        self._wheel_setup(time.monotonic if type(self).time is asyncio.BaseEventLoop.time else None)

    def _wheel_check(self, callback: Callable[..., object]) -> None:
        self._check_closed()  # type: ignore[attr-defined]
        if self._debug:  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]

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
        wake = self._wheel_timers.due(end, self._ready)  # type: ignore[attr-defined]
        if wake != math.inf:
            # Never at or before ``end``: the base loop would take the alarm again in
            # this same pass (its own end time is at most ours).
            self._wheel_arm(max(wake, end))

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the base loop, then drop every wheel timer (nothing pins memory)."""
        super().close()
        self._wheel_timers.closed = self.is_closed()
        self._wheel_timers.clear()
        self._wheel_alarm._in_heap = False


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
        cls = _wheel_class(f"Wheel{base.__name__}", (base, _WheelLoopMixin), namespace)
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
