"""Virtual time for tests: pass a :class:`ManualClock` as a purgatory's ``clock``.

* :class:`ManualClock`: ``await clock.advance(seconds)`` runs every wake-up due by then,
  letting the loop go idle before, between and after them (:meth:`ManualClock.settle`).
* :class:`OffsetClock`: the running loop's clock that a test can also move forward
  (``await clock.advance(seconds)``): real time keeps passing as usual, and a jump runs
  what falls due at once. What the Kafka broker's ``advance(seconds)`` moves.
* :func:`settle`: let the running loop run until no task is ready to step.
* :func:`parked`: wait, in real time, until a purgatory holds ``n`` pending operations
  (a request sent over a real socket has reached its handler and waits).
* :func:`pending_report` / :func:`assert_idle`: what a purgatory still holds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from .purgatory import Purgatory

__all__ = [
    "DEFAULT_MAX_PASSES",
    "QUIET_PASSES",
    "ManualClock",
    "OffsetClock",
    "assert_idle",
    "parked",
    "pending_report",
    "settle",
]


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


DEFAULT_MAX_PASSES: Final = 1000
"""Loop passes :meth:`ManualClock.settle` waits at most for the loop to go idle."""

QUIET_PASSES: Final = 3
"""Consecutive passes that must find nothing ready before the loop counts as idle.

One quiet pass runs every callback that was ready before it (the loop runs its ready
queue in order); a plain callback (``loop.call_soon``, not a task) scheduled in that
pass runs in the next one and is only seen through the tasks it wakes. Three passes
see chains of up to two plain callbacks ending in a task's wake-up."""


class ManualClock:
    """A clock that moves only when told to (it may start anywhere, negative included).

    ``time()`` reads it; ``await advance(seconds)`` moves it forward, stopping at each
    armed wake-up on the way so that timers fire at the instants they asked for, and
    returns once every expiration due by the new time has run, including the ones armed
    on the way by code those expirations woke.

    Between steps it waits for the event loop to be *idle* (see :meth:`settle`).

    Pass it as a purgatory's ``clock=``: the purgatory's timer, its operations'
    deadlines and its wheel-backed timeouts then follow it (``asyncio.sleep`` and
    ``asyncio.timeout`` still follow the loop's own clock).

    Args:
        start: the time the clock reads at first, in seconds (any finite number).
        max_passes: the most loop passes one settling step waits for the loop to go
            idle (at least :data:`QUIET_PASSES`); a loop that never goes idle (a task
            spinning on ``asyncio.sleep(0)``) is waited for that long per step.

    Raises:
        TypeError: ``start`` is not a number or ``max_passes`` not an int.
        ValueError: ``start`` is not finite, or ``max_passes`` is below
            :data:`QUIET_PASSES`.
    """

    __slots__ = ("_armed", "_drivers", "_max_passes", "_now", "_seq", "_soon", "_timers")

    def __init__(self, start: float = 0.0, *, max_passes: int = DEFAULT_MAX_PASSES) -> None:
        _check_seconds("start", start, allow_negative=True)
        _check_max_passes(max_passes, minimum=QUIET_PASSES)
        self._now = float(start)
        self._timers: list[tuple[float, int, _Handle]] = []
        self._soon: set[_Handle] = set()
        self._seq = itertools.count()
        self._armed = 0  # call_at and call_soon so far: "something new was scheduled"
        self._max_passes = max_passes
        self._drivers: weakref.WeakSet[Driver] = weakref.WeakSet()

    def time(self) -> float:
        """The clock's current reading, in seconds."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], object], /) -> _Handle:
        """Arm a wake-up: ``callback()`` runs when :meth:`advance` reaches ``when``.

        What a purgatory's timer calls to arm its alarm (the clock protocol). Returns a
        handle whose ``cancel()`` disarms it. O(log n) in the wake-ups armed.
        """
        handle = _Handle(self, callback)
        self._armed += 1
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def call_soon(self, callback: Callable[[], object], /) -> _Handle:
        """Run ``callback()`` in the running loop's next pass, unless cancelled first.

        Counts as armed work: :meth:`settle` waits until it has run. Must be called
        with a loop running (``RuntimeError`` otherwise).
        """
        handle = _Handle(self, callback)
        self._armed += 1
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

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        self._now += seconds

    def rewind(self, seconds: float) -> None:
        """Move time back without running anything, as a clock that is not monotonic may.

        Timers on this clock fire nothing early against it: they wait until it reaches
        their deadlines again.

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        self._now -= seconds

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and run everything due meanwhile.

        In steps: let the loop go idle (:meth:`settle`), so that code started before
        the call (a request, a task just created) has armed its wake-ups; move the
        clock to the earliest wake-up due by the target and run it; let the loop go
        idle again, so that what the wake-up started (and whatever that arms, even
        after a few more awaits) has run; repeat until no wake-up is due by the
        target; then set the clock to the target and settle once more.

        ``advance(3.5)`` over a loop of 1-second waits sees three expiries, at 1, 2
        and 3, each at its own instant.

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        target = self._now + seconds
        timers = self._timers
        while True:
            await self.settle()
            while timers and timers[0][2].cancelled:
                heapq.heappop(timers)
            if not timers or timers[0][0] > target:
                break
            when, _, handle = heapq.heappop(timers)
            self._now = max(self._now, when)
            handle.callback()
        self._now = max(self._now, target)
        await self.settle()

    async def settle(self) -> bool:
        """Let the loop run until it is idle; True if it got idle, False if it never did.

        Idle as :func:`settle` (the function) means it, and besides: no wake-up of
        this clock was armed or due to run, and no timer driving from this clock had
        work left, for :data:`QUIET_PASSES` loop passes in a row. At most
        ``max_passes`` passes (the constructor's).
        """
        armed = self._armed

        def quiet() -> bool:
            nonlocal armed
            if armed != self._armed:
                armed = self._armed
                return False
            return not self._soon and not any(driver.busy for driver in self._drivers)

        return await _wait_idle(quiet, self._max_passes)

    def _run_soon(self, handle: _Handle) -> None:
        if handle.cancelled:
            return
        self._soon.discard(handle)
        handle.callback()


class _OffsetHandle:
    """A wake-up armed on an :class:`OffsetClock`: its time on that clock, and the
    loop's handle that stands for it (armed again whenever the offset grows)."""

    __slots__ = ("_clock", "callback", "cancelled", "loop_handle", "when")

    def __init__(self, clock: OffsetClock, when: float, callback: Callable[[], object]) -> None:
        self._clock = clock
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.loop_handle: asyncio.Handle | None = None

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if self.loop_handle is not None:
            self.loop_handle.cancel()
            self.loop_handle = None
        self._clock._armed.discard(self)


class OffsetClock:
    """The running loop's clock plus an offset that only grows: time a test can skip.

    ``time()`` is the loop's ``time()`` plus the offset, so without :meth:`advance` a
    purgatory on this clock behaves exactly as on the loop (real time, real waits).
    ``await advance(seconds)`` adds to the offset, stopping at each armed wake-up on
    the way (so that timers fire in deadline order, each at its own instant, and a
    deadline armed by an expiration on the way fires too if it falls due by the
    target), and returns once the loop is idle with nothing due.

    Why an offset and not a :class:`ManualClock`: the code under test also waits on
    real time (a broker's parked fetches, a client's own timers, sockets), which must
    keep running; only the deadlines on this clock jump. The clock never goes back, so
    "never early" holds for every timer on it.

    :meth:`wall` is the wall clock (``time.time()``) plus the same offset, for what
    is stamped or compared in epoch time (record timestamps, retention by time).

    The clock binds to the running loop at its first use and is used from that loop
    only.

    Args:
        max_passes: the most loop passes one settling step waits for the loop to go
            idle (at least :data:`QUIET_PASSES`).

    Raises:
        TypeError: ``max_passes`` is not an int.
        ValueError: ``max_passes`` is below :data:`QUIET_PASSES`.
    """

    __slots__ = ("_armed", "_drivers", "_loop", "_max_passes", "_offset")

    def __init__(self, *, max_passes: int = DEFAULT_MAX_PASSES) -> None:
        _check_max_passes(max_passes, minimum=QUIET_PASSES)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._offset = 0.0
        self._armed: set[_OffsetHandle] = set()
        self._max_passes = max_passes
        self._drivers: weakref.WeakSet[Driver] = weakref.WeakSet()

    @property
    def offset(self) -> float:
        """Seconds this clock is ahead of the loop's (the sum of every advance)."""
        return self._offset

    def time(self) -> float:
        """The loop's time plus the offset, in seconds."""
        return self._bind().time() + self._offset

    def wall(self) -> float:
        """``time.time()`` plus the offset: the epoch time this clock stands for."""
        return time.time() + self._offset

    def call_at(self, when: float, callback: Callable[[], object], /) -> _OffsetHandle:
        """Arm a wake-up: ``callback()`` runs once this clock reads ``when`` or later.

        What a purgatory's timer calls to arm its alarm (the clock protocol). Returns a
        handle whose ``cancel()`` disarms it.
        """
        handle = _OffsetHandle(self, when, callback)
        self._armed.add(handle)
        self._arm(handle, self._bind())
        return handle

    def attach_driver(self, driver: Driver) -> None:
        """Make :meth:`advance` wait for ``driver`` to finish the work its wake-ups
        start. A timer attaches itself when it is created on this clock."""
        self._drivers.add(driver)

    def pending_wakeups(self) -> int:
        """Armed wake-ups not yet run nor cancelled."""
        return len(self._armed)

    async def advance(self, seconds: float) -> None:
        """Move this clock ``seconds`` (>= 0) ahead and run everything due by then.

        In steps, as :meth:`ManualClock.advance`: let the loop go idle; move to the
        earliest wake-up due by the target (the loop's time as this call starts plus
        ``seconds``) and let it run and the loop go idle again; repeat; then move to
        the target and settle once more. Real time passing meanwhile counts too.

        Raises:
            TypeError: ``seconds`` is not a number.
            ValueError: ``seconds`` is negative or not finite.
            RuntimeError: called from another loop than the one the clock is bound to.
        """
        _check_seconds("seconds", seconds, allow_negative=False)
        loop = self._bind()
        if asyncio.get_running_loop() is not loop:
            raise RuntimeError("this OffsetClock is bound to another event loop")
        target = self.time() + seconds
        while True:
            await self._settle()
            armed = [h for h in self._armed if not h.cancelled]
            if not armed:
                break
            first = min(armed, key=lambda h: h.when)
            if first.when > target:
                break
            self._shift_to(first.when, loop)
        self._shift_to(target, loop)
        await self._settle()

    def _shift_to(self, when: float, loop: asyncio.AbstractEventLoop) -> None:
        """Grow the offset so that this clock reads at least ``when`` now; arm every
        wake-up again at its new loop time (the ones now due run at the next pass)."""
        gap = when - self.time()
        if gap <= 0:
            return
        self._offset += gap
        for handle in list(self._armed):
            if handle.loop_handle is not None:
                handle.loop_handle.cancel()
            self._arm(handle, loop)

    def _arm(self, handle: _OffsetHandle, loop: asyncio.AbstractEventLoop) -> None:
        handle.loop_handle = loop.call_at(handle.when - self._offset, self._run, handle)

    def _run(self, handle: _OffsetHandle) -> None:
        if handle.cancelled:
            return
        handle.loop_handle = None
        self._armed.discard(handle)
        handle.callback()

    async def _settle(self) -> bool:
        loop = self._bind()

        def quiet() -> bool:
            now = loop.time() + self._offset
            if any(h.when <= now for h in self._armed):
                return False  # a wake-up is due and queued on the loop
            return not any(driver.busy for driver in self._drivers)

        return await _wait_idle(quiet, self._max_passes)

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop


async def settle(*, max_passes: int = DEFAULT_MAX_PASSES) -> bool:
    """Let the running loop run until it is idle; True if it got idle, False if not.

    *Idle* means: for :data:`QUIET_PASSES` loop passes in a row, no task of the loop
    (other than the caller) was ready to run. A task is *ready* when it is scheduled to
    take a step: just created, or woken because what it awaits is done. That is read
    from ``asyncio.Task``'s ``_fut_waiter`` (the future a task waits on), which
    CPython's tasks, pure and C, have always had and which uvloop's loops use too, so
    it works the same on both; no loop internals (asyncio's private ready queue, which
    uvloop does not have) are read.

    Not waited for: a task waiting for real time (``asyncio.sleep(0.1)``), for I/O on
    a socket or pipe, or for a thread (``run_in_executor``): the loop counts as idle
    while they wait (over a real connection use :func:`parked`, which waits in real
    time); a chain of more than two plain callbacks (``call_soon`` from ``call_soon``)
    before a task wakes. A loop that never goes idle (a task or callback that
    reschedules itself at every pass) is waited for ``max_passes`` passes, then this
    returns False.
    """
    _check_max_passes(max_passes, minimum=None)
    return await _wait_idle(None, max_passes)


async def _wait_idle(quiet: Callable[[], bool] | None, max_passes: int) -> bool:
    me = asyncio.current_task()
    calm = 0
    for _ in range(max_passes):
        await asyncio.sleep(0)
        # Evaluated every pass (not short-circuited): ``quiet`` keeps a count up to date.
        still = quiet() if quiet is not None else True
        if _ready_task(me) or not still:
            calm = 0
            continue
        calm += 1
        if calm >= QUIET_PASSES:
            return True
    return False


def _ready_task(me: asyncio.Task[Any] | None) -> bool:
    """Whether a task of the running loop, other than ``me``, is scheduled to step."""
    for task in asyncio.all_tasks():
        if task is me:
            continue
        # A task's _fut_waiter is the future it waits on; None while it is scheduled
        # (created, or stepping through a bare yield such as asyncio.sleep(0)); a done
        # future means its wake-up is queued. A task type without the attribute is
        # taken as waiting: only its effects (new wake-ups) are seen then.
        waiter: asyncio.Future[Any] | None = getattr(task, "_fut_waiter", _WAITING)
        if waiter is None or waiter.done():
            return True
    return False


class _Waiting:
    """Stands for "a future not done" where a task does not say what it waits on."""

    __slots__ = ()

    @staticmethod
    def done() -> bool:
        return False


_WAITING: Final[Any] = _Waiting()


async def parked(purgatory: Purgatory, n: int = 1, *, timeout: float = 5.0) -> None:
    """Return once ``purgatory`` holds at least ``n`` pending operations.

    For tests that start a request (``asyncio.ensure_future(client.get(...))``) and
    must not move virtual time before its handler has parked its operation in the
    purgatory, or the wait would be registered after the jump and never expire. It
    waits in real time, ``timeout`` seconds at most (over real sockets the request
    needs real loop turns and I/O), checking whenever the loop goes idle and every
    millisecond; then raises ``TimeoutError`` saying how many were parked.

    Args:
        purgatory: the purgatory the request parks in.
        n: how many pending operations to wait for (at least 1).
        timeout: the most real seconds to wait.

    Raises:
        TimeoutError: fewer than ``n`` were pending after ``timeout`` seconds (the
            message says how many were).
        RuntimeError: the purgatory closed meanwhile.
        TypeError: ``n`` is not an int, or ``timeout`` not a number.
        ValueError: ``n`` is below 1, or ``timeout`` negative or not finite.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {n!r}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n!r}")
    _check_seconds("timeout", timeout, allow_negative=False)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        if purgatory.num_delayed() >= n:
            return
        if purgatory.closed:
            raise RuntimeError(
                f"purgatory {purgatory.name!r} is closed with {purgatory.num_delayed()}"
                f" operation(s) parked, waiting for {n}"
            )
        if loop.time() >= give_up:
            raise TimeoutError(
                f"purgatory {purgatory.name!r} has {purgatory.num_delayed()} operation(s)"
                f" parked after {timeout} s, waiting for {n}"
            )
        await _wait_idle(None, DEFAULT_MAX_PASSES)
        if purgatory.num_delayed() < n:
            await asyncio.sleep(_PARKED_POLL)


_PARKED_POLL: Final = 0.001


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
    """Raise ``AssertionError`` unless ``purgatory`` holds nothing pending.

    Nothing pending means no operation unfinished and nothing on its wheel (no
    timeout, sleep or ``call_later`` callback waiting). The message is
    :func:`pending_report`'s. What ``@pytest.mark.purgatory(check_pending=True)``
    checks after a test.

    Raises:
        AssertionError: something is still pending.
    """
    report = pending_report(purgatory)
    if report:
        raise AssertionError(report)


def _check_seconds(name: str, value: float, *, allow_negative: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or (value < 0 and not allow_negative):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def _check_max_passes(max_passes: int, *, minimum: int | None) -> None:
    if isinstance(max_passes, bool) or not isinstance(max_passes, int):
        raise TypeError(f"max_passes must be an int, got {max_passes!r}")
    if minimum is not None and max_passes < minimum:
        raise ValueError(f"max_passes must be at least {minimum}, got {max_passes!r}")
