"""uvloop as the base of a wheel loop: its alarm is one uvloop timer.

Imported by :func:`aiopurgatory.loop.wheel_loop_class` only when the base is
``uvloop.Loop`` (or a subclass of it); it never imports uvloop itself.

uvloop has no ``_scheduled`` heap or ``_run_once`` to hook (rule 4 of
:mod:`aiopurgatory.loop`): its timers are libuv's. So this mixin, placed *before*
the uvloop class, overrides ``call_later`` / ``call_at`` (uvloop's Cython methods
would otherwise win) and wakes itself with a single timer of the base class, armed
through the base's own ``call_later`` at the earliest time the wheel or the near heap
has work. When that timer fires, :meth:`_UvWheelMixin._wheel_uv_fire`:

1. moves the wheel's due entries to the near heap (shared with the asyncio loops);
2. takes out, in ``(when, sequence)`` order, every live handle whose ``when`` is at or
   before ``loop.time()`` read once at the start, and runs them one by one. Timers
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
import heapq
import logging
import math
import time
from collections.abc import Callable
from contextvars import Context, copy_context
from typing import Any, Final, cast

from .loop import TimerHandle, _WheelBase, _WheelLoopMixin

_ALARM_EPSILON_MS: Final = 1e-6
"""Subtracted from the milliseconds left before ``ceil``: float noise in
``when - now`` must not add a whole millisecond (an early wake-up only re-arms)."""

_logger: Final = logging.getLogger("asyncio")  # asyncio's and uvloop's logger


class _UvWheelMixin(_WheelBase, asyncio.AbstractEventLoop):
    """The timer methods of a wheel loop on uvloop; mixed in before ``uvloop.Loop``."""

    # The uvloop class's own call_later (set per class by uv_wheel_loop_class): called
    # with the loop as first argument, for the alarm only.
    _wheel_uv_base_call_later: Callable[..., asyncio.Handle]
    # uvloop's (a read-only attribute of its Cython class).
    _closed: bool

    # The wheel loops' own insertion (rule 2), one function for both bases: typed as
    # called on an instance (the asyncio mixin's method, unbound, takes any loop that
    # has the wheel's state and a _wheel_arm).
    _wheel_add: Callable[[TimerHandle, float], None] = cast(Any, _WheelLoopMixin._wheel_add)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wheel_setup()
        self._wheel_uv_alarm: asyncio.Handle | None = None
        self._wheel_uv_when = math.inf  # what the alarm was armed for
        self._wheel_uv_busy = False  # in a pass: it re-arms once, at its end
        # The alarm's callback runs in this context: no copy of the caller's per arm.
        self._wheel_uv_context = Context()
        # uvloop's debug flag, kept here: uvloop's own is not readable from Python and
        # get_debug() would be one call more per call_later.
        self._wheel_uv_debug = super().get_debug()

    def set_debug(self, enabled: bool) -> None:
        """uvloop's ``set_debug``, and the flag the timer methods read."""
        super().set_debug(enabled)
        self._wheel_uv_debug = bool(enabled)

    # -- scheduling ----------------------------------------------------------------

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> TimerHandle:
        """Schedule ``callback(*args)`` ``delay`` seconds from now, on the wheel."""
        if delay is None:
            raise TypeError("delay must not be None")
        when = self.time() + delay
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._wheel_uv_debug:
            self._wheel_uv_check(callback)
            handle = TimerHandle(when, callback, args, self, context)
            if handle._source_traceback:
                # Drop this frame: the traceback ends at the caller's line.
                del handle._source_traceback[-1]
        else:
            # As the asyncio mixin's call_later: asyncio's __init__ frames only fill
            # the slots outside debug mode.
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
        if when is None:
            raise TypeError("when cannot be None")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._wheel_uv_debug:
            self._wheel_uv_check(callback)
        handle = TimerHandle(when, callback, args, self, context)
        if handle._source_traceback:
            del handle._source_traceback[-1]
        self._wheel_add(handle, when)
        return handle

    def _wheel_uv_check(self, callback: Callable[..., object]) -> None:
        """asyncio's debug-mode checks (uvloop's own are not reachable from Python)."""
        running = asyncio._get_running_loop()
        if self.is_running() and running is not self:
            raise RuntimeError(
                "Non-thread-safe operation invoked on an event loop other than the current one"
            )
        # asyncio's check reads nothing of the loop: a coroutine (function) is refused
        # with asyncio's message, naming call_at as asyncio does.
        asyncio.BaseEventLoop._check_callback(self, callback, "call_at")  # type: ignore[attr-defined]

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """What asyncio's ``TimerHandle.cancel`` calls (the wheel's handles override
        ``cancel`` and never do): free the entry now, as the asyncio mixin does."""
        if isinstance(handle, TimerHandle) and handle._entry is not None:
            entry = handle._entry
            handle._entry = None
            self._wheel.remove(entry)
            entry.handle = None

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
        now = self.time()
        self._wheel_collect(now)
        near = self._wheel_near
        due: list[tuple[float, int, TimerHandle]] = []
        while near and near[0][0] <= now:
            item = heapq.heappop(near)
            if not item[2]._cancelled:
                due.append(item)
        self._wheel_uv_busy = True
        ran = 0
        try:
            debug = self._wheel_uv_debug
            for _, _, handle in due:
                ran += 1
                if handle._cancelled:  # by an earlier callback of this pass
                    continue
                handle._scheduled = False
                if debug:
                    self._wheel_uv_run_timed(handle)
                else:
                    handle._run()
        finally:
            self._wheel_uv_busy = False
            for item in due[ran:]:  # a BaseException left these: back, order kept
                heapq.heappush(near, item)
            wake = self._wheel_next_wake()
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
        self._wheel_drop()
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
    return type(f"Wheel{base.__name__}", (_UvWheelMixin, base), namespace)
