"""uvloop as the base of a wheel loop: its alarm is one uvloop timer.

Imported by :func:`aiopurgatory.loop.wheel_loop_class` only when the base is
``uvloop.Loop`` (or a subclass of it); it never imports uvloop itself.

uvloop has no ``_scheduled`` heap or ``_run_once`` to hook (rule 4 of
:mod:`aiopurgatory.loop`): its timers are libuv's. So this mixin, placed *before*
the uvloop class, overrides ``call_later`` / ``call_at`` (uvloop's Cython methods
would otherwise win) and wakes itself with a single timer of the base class, armed
through the base's own ``call_later`` at the earliest time the wheel or the near heap
has work. When that timer fires, :meth:`_UvWheelMixin._wheel_uv_fire`:

1. takes out of the timers' store (:class:`~aiopurgatory.looptimers.LoopTimers`, as
   on asyncio's loops), in ``(when, sequence)`` order, every live handle whose
   ``when`` is at or before ``loop.time()`` read once at the start;
2. runs them one by one. Timers
   that those callbacks schedule, even already due ones, wait for the next pass, as
   on asyncio (a callback that re-arms itself in the past cannot starve I/O); a
   handle cancelled by an earlier callback of the pass is skipped;
3. re-arms in a ``finally``: a ``KeyboardInterrupt`` or ``SystemExit`` out of a
   callback (uvloop stops the loop and re-raises it from ``run_*``) puts the pass's
   handles not yet run back in the near heap, their order kept, so none is lost.

Never early, by ``loop.time()``: uvloop's ``time()`` is libuv's millisecond clock
(``uv_now`` after ``uv_update_time``), and stock uvloop turns a delay into whole
milliseconds with ``round()``, so its timers run up to half a millisecond before
their ``when`` (more with a stale cached time). Here a handle runs only when
``when <= loop.time()``, the alarm is armed for ``ceil`` of the milliseconds left
(libuv fires a timer when its clock reaches start + timeout, with start read after
``uv_update_time``), and a wake-up that still comes early only re-arms for the rest.

uvloop's own timers (its transports', its ``UVTimer`` handles) are not touched: only
what goes through the loop's Python-visible ``call_later`` / ``call_at`` is on the
wheel.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from contextvars import Context
from typing import Any, Final

from ._loop_wheel import _wheel_class, _WheelBase
from .looptimers import TimerHandle

_ALARM_EPSILON_MS: Final = 1e-6
"""Subtracted from the milliseconds left before ``ceil``: float noise in
``when - now`` must not add a whole millisecond (an early wake-up only re-arms)."""

_logger: Final = logging.getLogger("asyncio")  # asyncio's and uvloop's logger


class _UvWheelMixin(_WheelBase, asyncio.AbstractEventLoop):
    """The timer methods of a wheel loop on uvloop; mixed in before ``uvloop.Loop``."""

    # The uvloop class's own call_later (set per class by uv_wheel_loop_class): called
    # with the loop as first argument, for the alarm only.
    _wheel_uv_base_call_later: Callable[..., asyncio.Handle]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._wheel_uv_alarm: asyncio.Handle | None = None
        self._wheel_uv_when = math.inf  # what the alarm was armed for
        self._wheel_uv_busy = False  # in a pass: it re-arms once, at its end
        # The alarm's callback runs in this context: no copy of the caller's per arm.
        self._wheel_uv_context = Context()
        self._wheel_setup()  # uvloop's time() is its own (libuv's clock)

    def _wheel_check(self, callback: Callable[..., object]) -> None:
        """uvloop's checks, as asyncio words them (uvloop's own are not reachable from
        Python): a closed loop, and in debug mode the thread and the callback."""
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        if not self.get_debug():
            return
        running = asyncio._get_running_loop()
        if self.is_running() and running is not self:
            raise RuntimeError(
                "Non-thread-safe operation invoked on an event loop other than the current one"
            )
        # asyncio's check reads nothing of the loop: a coroutine (function) is refused
        # with asyncio's message, naming call_at as asyncio does.
        asyncio.BaseEventLoop._check_callback(self, callback, "call_at")  # type: ignore[attr-defined]

    # -- the alarm -----------------------------------------------------------------

    def _wheel_arm(self, when: float) -> None:
        """Make the loop wake at ``when`` at the latest (one uvloop timer)."""
        if when >= self._wheel_uv_when or self._wheel_uv_busy:
            return
        alarm = self._wheel_uv_alarm
        if alarm is not None:
            alarm.cancel()
        left = when - self.time()
        # Whole milliseconds, rounded up (uvloop would round() them): never early.
        ms = max(1, math.ceil(left * 1000 - _ALARM_EPSILON_MS)) if left > 0 else 0
        self._wheel_uv_when = when
        self._wheel_uv_alarm = self._wheel_uv_base_call_later(
            self, ms / 1000, self._wheel_uv_fire, context=self._wheel_uv_context
        )

    def _wheel_uv_fire(self) -> None:
        """The alarm's callback: run the due timers in deadline order, then re-arm."""
        self._wheel_uv_alarm = None
        self._wheel_uv_when = math.inf
        timers = self._wheel_timers
        due: list[TimerHandle] = []
        # Those whose when is at or before now: before the next float after it.
        timers.due(math.nextafter(self.time(), math.inf), due)
        self._wheel_uv_busy = True
        ran = 0
        try:
            debug = self.get_debug()
            for handle in due:
                ran += 1
                if handle._cancelled:  # by an earlier callback of this pass
                    continue
                if debug:
                    self._wheel_uv_run_timed(handle)
                else:
                    handle._run()
        finally:
            self._wheel_uv_busy = False
            for handle in due[ran:]:  # a BaseException left these: back, order kept
                if not handle._cancelled:
                    handle._scheduled = True
                    handle._entry = timers.add(handle, handle._when)
            wake = timers.next_wake()
            if wake != math.inf:
                self._wheel_arm(wake)

    def _wheel_uv_run_timed(self, handle: TimerHandle) -> None:
        """Run ``handle`` and warn, as uvloop does, if it held the loop too long.

        uvloop times the alarm as a whole (one more warning when a pass is slow);
        this names the timer's own callback.
        """
        started = time.monotonic()
        handle._run()
        took = time.monotonic() - started
        if took > self.slow_callback_duration:
            _logger.warning("Executing %r took %.3f seconds", handle, took)

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the base loop (which drops the alarm), then every wheel timer."""
        super().close()
        self._wheel_timers.closed = self.is_closed()
        self._wheel_timers.clear()
        self._wheel_uv_alarm = None
        self._wheel_uv_when = math.inf


def uv_wheel_loop_class(base: type[asyncio.AbstractEventLoop]) -> type[Any]:
    """The wheel-loop subclass of ``base``, a ``uvloop.Loop`` (subclass).

    The mixin goes first: uvloop's ``call_later`` / ``call_at`` are its own Cython
    methods, which would otherwise win. The alarm uses the ``call_later`` of uvloop's
    own class (not of a subclass that might override it).
    """
    base_call_later = next(
        c.__dict__["call_later"]
        for c in base.__mro__
        if c.__module__.split(".")[0] == "uvloop" and "call_later" in c.__dict__
    )
    namespace: dict[str, Any] = {
        "__module__": "aiopurgatory.loop",
        "__qualname__": f"Wheel{base.__qualname__}",
        "_wheel_uv_base_call_later": staticmethod(base_call_later),
    }
    return _wheel_class(f"Wheel{base.__name__}", (_UvWheelMixin, base), namespace)
