"""Virtual time for tests: pass a :class:`ManualClock` as a purgatory's ``clock``."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .purgatory import Purgatory

__all__ = ["ManualClock", "assert_idle", "pending_report"]


class Driver(Protocol):
    """Something that arms wake-ups on a clock and then works in a task of its own."""

    @property
    def busy(self) -> bool:
        """True from the moment one of its wake-ups fires until its work is done."""
        ...


class _Handle:
    __slots__ = ("_clock", "callback", "cancelled")

    def __init__(self, clock: ManualClock, callback: Callable[[], object]) -> None:
        self._clock = clock
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self._clock._soon.discard(self)


class ManualClock:
    """A clock that moves only when told to (it may start anywhere, negative included).

    ``time()`` reads it; ``await advance(seconds)`` moves it forward, stopping at each
    armed wake-up on the way so that timers fire at the instants they asked for, and
    returns once every expiration due by the new time has run (including work a timer
    continues in later loop passes).
    """

    __slots__ = ("_drivers", "_now", "_seq", "_soon", "_timers")

    def __init__(self, start: float = 0.0) -> None:
        _check_seconds("start", start, allow_negative=True)
        self._now = float(start)
        self._timers: list[tuple[float, int, _Handle]] = []
        self._soon: set[_Handle] = set()
        self._seq = itertools.count()
        self._drivers: weakref.WeakSet[Driver] = weakref.WeakSet()

    def time(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], object], /) -> _Handle:
        handle = _Handle(self, callback)
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def call_soon(self, callback: Callable[[], object], /) -> _Handle:
        handle = _Handle(self, callback)
        self._soon.add(handle)
        asyncio.get_running_loop().call_soon(self._run_soon, handle)
        return handle

    def attach_driver(self, driver: Driver) -> None:
        """Make :meth:`advance` wait for ``driver`` to finish the work its wake-ups start.

        A timer attaches itself when it is created on this clock.
        """
        self._drivers.add(driver)

    def pending_wakeups(self) -> int:
        """Armed, not cancelled ``call_at`` wake-ups (0 means nothing would ever wake)."""
        return sum(1 for _, _, handle in self._timers if not handle.cancelled)

    def jump(self, seconds: float) -> None:
        """Move time forward without running anything, as if the loop were blocked.

        The next :meth:`advance` then finds every wake-up already overdue.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        self._now += seconds

    def rewind(self, seconds: float) -> None:
        """Move time back without running anything, as a clock that is not monotonic may.

        Timers on this clock fire nothing early against it: they wait until it reaches
        their deadlines again.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        self._now -= seconds

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and run everything due meanwhile."""
        _check_seconds("seconds", seconds, allow_negative=False)
        target = self._now + seconds
        timers = self._timers
        while True:
            await self._settle()
            while timers and timers[0][2].cancelled:
                heapq.heappop(timers)
            if not timers or timers[0][0] > target:
                break
            when, _, handle = heapq.heappop(timers)
            self._now = max(self._now, when)
            handle.callback()
        self._now = target
        await self._settle()

    async def _settle(self) -> None:
        # Let the work the wake-ups started run until no driver is busy and no
        # call_soon is outstanding; one extra pass lets the tasks woken by that work
        # take their step.
        while self._soon or any(driver.busy for driver in self._drivers):  # noqa: ASYNC110
            await asyncio.sleep(0)
        await asyncio.sleep(0)

    def _run_soon(self, handle: _Handle) -> None:
        if handle.cancelled:
            return
        self._soon.discard(handle)
        handle.callback()


def pending_report(purgatory: Purgatory) -> str:
    """What ``purgatory`` still holds, in words; empty when it holds nothing.

    Counts operations not finished, and entries on its wheel: operations with a
    timeout, and the timeouts, sleeps and ``call_later`` callbacks still waiting.
    """
    stats = purgatory.stats
    if not stats.pending and not stats.timed:
        return ""
    return (
        f"purgatory {purgatory.name!r} was left with {stats.pending} operation(s) pending"
        f" and {stats.timed} entr{'y' if stats.timed == 1 else 'ies'} on its wheel"
        " (operations with a timeout, timeouts, sleeps, call_later callbacks)"
    )


def assert_idle(purgatory: Purgatory) -> None:
    """Raise ``AssertionError`` unless ``purgatory`` holds nothing pending."""
    report = pending_report(purgatory)
    if report:
        raise AssertionError(report)


def _check_seconds(name: str, value: float, *, allow_negative: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or (value < 0 and not allow_negative):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
