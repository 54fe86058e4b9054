"""Drives a :class:`~aiopurgatory.wheel.TimingWheel` from a clock on the event loop.

The timer converts seconds to ticks and keeps exactly one wake-up armed: a single
``call_at`` for the earliest non-empty bucket, re-armed only when a bucket with an
earlier expiration appears. Nothing is armed while the wheel is empty, so an idle
timer costs the loop nothing.

Never early: a deadline is rounded *up* to the next tick and a tick is only
considered reached once the clock has passed it, so a task never fires before
``added_at + timeout`` on the timer's clock. Late by at most one tick plus loop
latency, unless a wake-up has more due work than ``max_work_per_pass``: then the
rest continues in the next loop pass (``call_soon``), so other callbacks keep running
while a large bucket cascades or expires.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Final, Protocol

from .wheel import NO_EXPIRATION, TimerEntry, TimingWheel

__all__ = [
    "DEFAULT_MAX_WORK_PER_PASS",
    "Cancellable",
    "Clock",
    "Timer",
    "TimerTask",
    "clock_tick",
    "deadline_tick",
]

DEFAULT_MAX_WORK_PER_PASS: Final = 2048
"""Entries one wake-up may move or expire before yielding to the loop."""

_MAX_TICK: Final = 2**62
"""Deadlines further away are clamped here (146 million years at 1 ms ticks): firing
that late is indistinguishable from never, and it bounds the number of levels."""


# Ticks and seconds meet through one float product, k * tick, which only grows with
# k. A deadline maps to the first tick whose product is >= it and a clock reading to
# the last tick whose product is <= it, so "tick reached" implies "deadline reached"
# whatever the division rounded to.


def deadline_tick(deadline: float, tick: float) -> int:
    """The first tick at or after ``deadline`` seconds (clamped to a far horizon)."""
    k = math.ceil(deadline / tick)
    while k * tick < deadline:
        k += 1
    while (k - 1) * tick >= deadline:
        k -= 1
    return k if k < _MAX_TICK else _MAX_TICK


def clock_tick(now: float, tick: float) -> int:
    """The last tick at or before the clock reading ``now``."""
    k = math.floor(now / tick)
    while k * tick > now:
        k -= 1
    while (k + 1) * tick <= now:
        k += 1
    return k


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where a timer reads time and arms its wake-up; an asyncio loop is one."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Cancellable: ...

    def call_soon(self, callback: Callable[[], object], /) -> Cancellable: ...


class TimerTask(TimerEntry):
    """Something a :class:`Timer` can hold; ``_timer_fired`` runs when it expires."""

    __slots__ = ("deadline",)

    def __init__(self) -> None:
        super().__init__()
        self.deadline: float | None = None
        """Clock time (seconds) at which the task expires; None while not timed."""

    def _timer_fired(self) -> None:
        raise NotImplementedError


class Timer:
    """Tasks that fire at clock deadlines, kept in a hierarchical timing wheel."""

    __slots__ = (
        "_armed_tick",
        "_call_at",
        "_call_soon",
        "_closed",
        "_handle",
        "_lag_last",
        "_lag_max",
        "_max_work",
        "_running",
        "_tick",
        "_time",
        "_wakeups",
        "_wheel",
    )

    def __init__(
        self,
        clock: Clock,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        max_work_per_pass: int = DEFAULT_MAX_WORK_PER_PASS,
    ) -> None:
        self.check_config(tick, wheel_size, max_work_per_pass)
        self._tick = float(tick)
        self._time = clock.time
        self._call_at = clock.call_at
        self._call_soon = clock.call_soon
        self._max_work = max_work_per_pass
        self._wheel = TimingWheel(wheel_size, clock_tick(clock.time(), self._tick))
        self._handle: Cancellable | None = None
        # Tick the armed wake-up serves; invariant: <= every non-empty bucket's
        # expiration whenever the wheel is non-empty and no wake-up is running.
        self._armed_tick: int | None = None
        self._running = False
        self._closed = False
        self._wakeups = 0
        self._lag_last = 0.0
        self._lag_max = 0.0

    @staticmethod
    def check_config(tick: float, wheel_size: int, max_work_per_pass: int) -> None:
        """Raise TypeError / ValueError naming the first bad setting."""
        if isinstance(tick, bool) or not isinstance(tick, int | float):
            raise TypeError(f"tick must be a number of seconds, got {tick!r}")
        if not (math.isfinite(tick) and tick > 0):
            raise ValueError(f"tick must be a finite number of seconds > 0, got {tick!r}")
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int):
            raise TypeError(f"wheel_size must be an int, got {wheel_size!r}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size!r}")
        if isinstance(max_work_per_pass, bool) or not isinstance(max_work_per_pass, int):
            raise TypeError(f"max_work_per_pass must be an int, got {max_work_per_pass!r}")
        if max_work_per_pass < 1:
            raise ValueError(f"max_work_per_pass must be at least 1, got {max_work_per_pass!r}")

    def __len__(self) -> int:
        return len(self._wheel)

    @property
    def tick(self) -> float:
        return self._tick

    @property
    def wheel(self) -> TimingWheel:
        return self._wheel

    @property
    def wakeups(self) -> int:
        """Times the driver woke (armed wake-ups and continuation passes)."""
        return self._wakeups

    @property
    def lag_last(self) -> float:
        """Seconds the latest armed wake-up came after the tick it was armed for."""
        return self._lag_last

    @property
    def lag_max(self) -> float:
        return self._lag_max

    def now(self) -> float:
        return self._time()

    def add(self, task: TimerTask, timeout: float, *, start: float | None = None) -> None:
        """Fire ``task`` ``timeout`` seconds (finite, >= 0) after ``start``.

        ``start`` is a clock reading no later than now (default: now).
        """
        if self._closed:
            raise RuntimeError("timer is closed")
        if task._bucket is not None:
            raise ValueError("task is already in a timer")
        now = self._time() if start is None else start
        deadline = now + timeout
        task.deadline = deadline
        wheel = self._wheel
        if not len(wheel):
            wheel.restart(clock_tick(now, self._tick))
        if deadline > now:
            due = deadline_tick(deadline, self._tick)
            # A past ``start`` may put the deadline at or before the wheel's tick:
            # then it has passed (that tick was reached), and it fires below.
            if due > wheel.now:
                expiration = wheel.schedule(task, due)
                if expiration != NO_EXPIRATION:  # usually its bucket is already armed
                    self._arm_for(expiration)
                return
        self._fire(task)

    def reset(self, task: TimerTask, timeout: float) -> None:
        """Set a task's deadline to now + ``timeout``; cheap when it only moves later."""
        if self._closed:
            raise RuntimeError("timer is closed")
        now = self._time()
        deadline = now + timeout
        task.deadline = deadline
        if deadline <= now:
            self.cancel(task)
            self._fire(task)
            return
        wheel = self._wheel
        if not len(wheel):
            wheel.restart(clock_tick(now, self._tick))
        self._arm_for(wheel.reschedule(task, deadline_tick(deadline, self._tick)))

    def cancel(self, task: TimerTask) -> bool:
        """Remove ``task`` in O(1); False if it was not pending here."""
        if not self._wheel.remove(task):
            return False
        if not len(self._wheel):
            self._disarm()
        return True

    def close(self) -> None:
        """Stop driving: disarm the wake-up. Tasks still pending never fire."""
        self._closed = True
        self._disarm()

    def _arm_for(self, expiration: int) -> None:
        if expiration == NO_EXPIRATION or self._running:
            return
        armed = self._armed_tick
        if armed is None or expiration < armed:
            self._disarm()
            self._armed_tick = expiration
            self._handle = self._call_at(expiration * self._tick, self._wake)

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_tick = None

    def _wake(self) -> None:
        """The armed wake-up: note how late it came, then work."""
        first = self._wheel.next_expiration()
        if first is not None:
            lag = self._time() - first * self._tick
            if lag >= 0:
                self._lag_last = lag
                if lag > self._lag_max:
                    self._lag_max = lag
        self._work()

    def _work(self) -> None:
        """Collect and fire what is due, within the work bound; then re-arm."""
        self._handle = None
        self._armed_tick = None
        self._wakeups += 1
        wheel = self._wheel
        now_tick = clock_tick(self._time(), self._tick)
        due: list[TimerEntry] = []
        self._running = True
        try:
            finished = wheel.collect_due(now_tick, due, self._max_work)
            for task in due:
                self._fire(task)  # type: ignore[arg-type]  # only TimerTasks are added
        finally:
            self._running = False
        if self._closed:
            return
        if not finished:
            self._armed_tick = now_tick
            self._handle = self._call_soon(self._work)  # the rest, next loop pass
            return
        nxt = wheel.next_expiration()
        if nxt is not None:
            self._armed_tick = nxt
            self._handle = self._call_at(nxt * self._tick, self._wake)

    @staticmethod
    def _fire(task: TimerTask) -> None:
        try:
            task._timer_fired()
        except Exception as exc:  # the driver must survive user code
            asyncio.get_running_loop().call_exception_handler(
                {"message": "timer task raised", "exception": exc, "task": task}
            )
