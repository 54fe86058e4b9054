"""Drives a :class:`~aiopurgatory.wheel.TimingWheel` from a clock, as one asyncio task.

Ground rules:

* **One task.** Each timer runs one asyncio task (named ``aiopurgatory-timer:<name>``,
  created on the first :meth:`Timer.add`) that sleeps until the earliest non-empty
  bucket. An internal alarm (one ``clock.call_at``) wakes it; a bucket earlier than
  the armed one moves the alarm. Nothing is armed while the wheel is empty, so an idle
  timer makes no wake-up at all. The task is gone after :meth:`Timer.close`.
* **Never early.** A tick ``k`` stands for the clock reading ``origin + k * tick``. A
  deadline maps to the first tick at or after it and a clock reading to the last tick
  at or before it, and before a task fires its float deadline is compared with the
  clock once more, so rounding can only make it later, never earlier. A clock that
  moves backwards therefore fires nothing early either: it just reaches no new tick.
* **Bounded work.** No conversion loops with the size of a value: ticks are clamped to
  ``[0, MAX_TICK]``. A deadline beyond ``MAX_TICK`` ticks from the timer's start (its
  :attr:`~Timer.horizon`: 142 thousand years at the default 1 ms tick, 142 years at the
  smallest tick accepted, :data:`MIN_TICK`) is *far future*: it sits in the wheel's
  last tick, cancellable and resettable, and never fires. One wake-up moves or fires
  at most ``max_work_per_pass`` entries, then yields to the loop and goes on.
* **Hook code cannot stop it.** ``Exception`` and ``CancelledError`` from a task's
  ``_timer_fired`` go to the loop's exception handler and the batch goes on.
  ``KeyboardInterrupt`` / ``SystemExit`` propagate, but the entries not yet fired stay
  queued and a fresh task takes over, so the timer is whole if the loop runs again.
  Should the task itself fail, ``on_failure`` hears of it (a purgatory then finishes
  its pending operations with the error) and so does the loop's exception handler.
* **Pending tasks are hidden from the cyclic GC** (compiled build). A task waiting in
  the wheel cannot be garbage: the wheel holds it, the loop holds the timer (its alarm,
  or its task when it has work), and the timer task ending (``asyncio.run`` cancels
  it) closes the timer, which releases every entry. So the compiled module untracks a
  task as it enters the wheel and tracks it again the moment it leaves: cancelled,
  fired (before ``_timer_fired`` runs), or released by :meth:`Timer.close`. Why: a
  server keeps 100k+ of them pending, allocated faster than they die; tracked, they
  filled the young generations and every collection walked them (milliseconds per
  young collection, tens per full one, landing in expiry bursts), and freeing one
  unlinked it from a GC list among objects long out of cache. Untracking hides only
  the task's own references, so it can keep objects alive longer, never free one
  early; what it can keep is a cycle through a task of a timer that is never closed
  on a loop that is closed without cancelling its tasks. Pure Python cannot untrack.
* **Coarse loop clocks.** uvloop rounds alarms to milliseconds and may wake the task
  up to half a millisecond early. An early alarm re-arms at least
  :data:`EARLY_WAKE_RETRY` later instead of spinning, so a due bucket costs at most
  two wake-ups.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Final, Protocol

from .wheel import NO_EXPIRATION, TimerEntry, TimingWheel

__all__ = [
    "DEFAULT_MAX_WORK_PER_PASS",
    "EARLY_WAKE_RETRY",
    "MAX_TICK",
    "MIN_TICK",
    "NOT_TIMED",
    "Cancellable",
    "Clock",
    "Timer",
    "TimerTask",
    "clock_tick",
    "collectable",
    "deadline_tick",
    "is_timed",
]

DEFAULT_MAX_WORK_PER_PASS: Final = 2048
"""Entries one wake-up may move or expire before yielding to the loop."""

MAX_TICK: Final = 2**52
"""The last tick a timer distinguishes; deadlines beyond it are far future and never fire.

2**52 keeps every tick an exact float, so a single rounding correction is enough in
the conversions below; at 1 ms ticks it is 142 thousand years after the timer started."""

MIN_TICK: Final = 1e-6
"""The smallest tick a timer accepts (1 µs), so that its horizon is at least 142 years.

A timer counts ticks from the clock reading at its creation and distinguishes
:data:`MAX_TICK` of them: its *horizon* (:attr:`Timer.horizon`) is ``MAX_TICK * tick``
seconds of uptime, after which its clock reaches no new tick and nothing fires any
more. At 1 µs that is 2**52 µs, 142 years; at 1 ns it would be 52 days. Refusing short
ticks at construction keeps the per-operation conversions free of any extra check."""

EARLY_WAKE_RETRY: Final = 0.001
"""After an alarm that came before its time, the next one is at least this much later:
the millisecond granularity of libuv's timers, which uvloop rounds to."""

_INFINITY: Final = math.inf
NOT_TIMED: Final = math.nan
"""A task's ``_deadline`` while it has none (its ``deadline`` property says None). A
float, a C double when compiled, rather than None: timing a task stores a number
instead of allocating a float object that the task's end would touch again, a cache
miss per operation at 1M pending."""
_NOT_TIMED: Final = NOT_TIMED  # compiled: a C constant (timer.pxd)

try:
    import cython
except ImportError:  # Cython is needed to build, never to run
    from . import _nocython as cython

# The conversions below run once per add: compiled, they compare against C constants
# and call C's ceil instead of looking up module globals and calling math.ceil.
_MAX_TICK_F: Final = float(MAX_TICK)  # exact: 2**52 is a float
_MAX_TICK_I: Final = MAX_TICK
_NO_EXPIRATION: Final = NO_EXPIRATION
if not cython.compiled:
    _ceil = math.ceil  # compiled: C's ceil (declared in timer.pxd)
    # Compiled on Linux: CLOCK_MONOTONIC read in C, as time.monotonic() reads it
    # (timer.pxd). Pure Python: time.monotonic itself.
    _HAS_C_MONOTONIC = True
    _monotonic = time.monotonic

    # Compiled, CPython's own functions (declared in timer.pxd): see the ground rule
    # on the cyclic GC. Pure Python cannot untrack an object.
    def _gc_untrack(op: object) -> None:
        """Stop the cyclic GC from tracking ``op`` (a no-op in pure Python)."""

    def _gc_track(op: object) -> None:
        """Let the cyclic GC track ``op`` again (a no-op in pure Python)."""

    def _gc_is_tracked(op: object) -> bool:
        return True


def collectable(task: TimerEntry) -> None:
    """Let the cyclic GC track ``task`` again if a timer had untracked it: a task that
    leaves a timer's custody (every exit the timer itself sees does this)."""
    # None would pass the compiled signature, and tracking it would corrupt memory.
    if task is not None and not _gc_is_tracked(task):
        _gc_track(task)


# Ticks and seconds meet through one expression, origin + k * tick, which never
# decreases as k grows. Both conversions start from a float estimate and correct it by
# one step against that expression, so "tick reached" implies "deadline reached"
# whatever the division rounded to; the work is constant whatever the values.


def deadline_tick(deadline: float, tick: float, origin: float = 0.0) -> int:
    """The first tick whose time is at or after ``deadline`` (``MAX_TICK`` if beyond it)."""
    x = (deadline - origin) / tick
    if not x < _MAX_TICK_F:  # also inf and nan: far future
        return _MAX_TICK_I
    if x <= 0.0:
        return 0
    k = int(_ceil(x))  # exact below 2**52
    if origin + k * tick < deadline:
        k += 1
    elif k > 0 and origin + (k - 1) * tick >= deadline:
        k -= 1
    return k if k < _MAX_TICK_I else _MAX_TICK_I


def clock_tick(now: float, tick: float, origin: float = 0.0) -> int:
    """The last tick whose time is at or before the clock reading ``now`` (clamped).

    Readings before ``origin`` map to tick 0 and readings past the far-future horizon
    to ``MAX_TICK - 1``, so far-future deadlines are never reached.
    """
    x = (now - origin) / tick
    if not x >= 0.0:  # also nan
        return 0
    if x >= _MAX_TICK_F - 1.0:
        return _MAX_TICK_I - 1
    k = int(x)
    if origin + (k + 1) * tick <= now:
        k += 1
    elif k > 0 and origin + k * tick > now:
        k -= 1
    return k


COMPILED_ENTRIES: Final[bool] = bool(cython.compiled)
"""Whether :class:`TimerTask` (and the wheel's entry under it) are extension types,
whose allocator sets every field to None / 0, so subclasses may skip their __init__
if they set ``_deadline = NOT_TIMED`` (the one field whose zero is not "unset").

True in the compiled module (Cython evaluates ``cython.compiled`` at build time); False
from Cython's pure-Python shadow module, or without Cython, when this runs as Python.
"""


def is_timed(task: TimerTask) -> bool:
    """Whether ``task`` waits in a timer: ``task.scheduled``, as a C call when compiled
    (the purgatory asks twice per operation, and a property is a Python look-up)."""
    return task._bucket is not None


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where a timer reads time and arms its alarm; an asyncio loop is one."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Cancellable: ...


class TimerTask(TimerEntry):
    """Something a :class:`Timer` can hold; ``_timer_fired`` runs when it expires."""

    __slots__ = ("_deadline",)

    def __init__(self) -> None:
        if not COMPILED_ENTRIES:  # compiled, the allocator has set the entry's fields
            super().__init__()
        self._deadline: float = _NOT_TIMED

    @property
    def deadline(self) -> float | None:
        """Clock time (seconds) at which the task expires; None while not timed."""
        deadline = self._deadline
        return None if deadline != deadline else deadline  # NaN: not timed

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self._deadline = _NOT_TIMED if value is None else value

    def _timer_fired(self) -> None:
        raise NotImplementedError


class Timer:
    """Tasks that fire at clock deadlines, kept in a hierarchical timing wheel.

    Use it from one event loop; the first :meth:`add` starts the driving task there.
    """

    __slots__ = (
        "__weakref__",
        "_armed_tick",
        "_c_clock",
        "_call_at",
        "_closed",
        "_due",
        "_due_index",
        "_early_alarm",
        "_handle",
        "_lag_last",
        "_lag_max",
        "_loop",
        "_max_work",
        "_more",
        "_name",
        "_on_failure",
        "_origin",
        "_running",
        "_signalled",
        "_task",
        "_tick",
        "_time",
        "_wake",
        "_wakeups",
        "_wheel",
        "_when",
    )

    def __init__(
        self,
        clock: Clock,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        max_work_per_pass: int = DEFAULT_MAX_WORK_PER_PASS,
        name: str = "timer",
        on_failure: Callable[[BaseException], object] | None = None,
    ) -> None:
        self.check_config(tick, wheel_size, max_work_per_pass)
        self._tick = float(tick)
        self._time: Callable[[], float] = clock.time
        self._c_clock = False
        if getattr(type(clock), "time", None) is asyncio.BaseEventLoop.time:
            # asyncio's loops read time.monotonic(): call it directly, sparing a Python
            # frame on every add (uvloop's time is its cached loop time: kept as is).
            # Compiled on Linux, read the same clock in C (_monotonic, timer.pxd): the
            # same double time.monotonic() returns, without a call through Python.
            self._time = time.monotonic
            self._c_clock = _HAS_C_MONOTONIC
        self._call_at = clock.call_at
        origin = float(clock.time())
        if not math.isfinite(origin):
            raise ValueError(f"the clock must read a finite time, got {origin!r}")
        self._origin = origin
        self._max_work = max_work_per_pass
        self._name = name
        self._on_failure = on_failure
        self._wheel = TimingWheel(wheel_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # The alarm: a clock callback that wakes the task. Invariant: whenever the wheel
        # is non-empty and the task is asleep, an alarm is armed for a tick no later
        # than every non-empty bucket's.
        self._handle: Cancellable | None = None
        self._armed_tick: int | None = None
        self._when = 0.0  # clock time the armed alarm asked for
        self._wake: asyncio.Future[None] | None = None  # what the sleeping task awaits
        self._signalled = False  # an alarm came and the task has not worked on it yet
        self._early_alarm = False
        self._more = False  # due work left over from the last pass
        self._running = False  # inside a pass (hooks may call add/cancel/reset)
        # Entries collected as due and not fired yet: a batch interrupted by
        # KeyboardInterrupt resumes from here.
        self._due: list[TimerEntry] = []
        self._due_index = 0
        self._closed = False
        self._wakeups = 0
        self._lag_last = 0.0
        self._lag_max = 0.0
        attach = getattr(clock, "attach_driver", None)
        if attach is not None:  # a virtual clock waits for us to settle
            attach(self)

    @staticmethod
    def check_config(tick: float, wheel_size: int, max_work_per_pass: int) -> None:
        """Raise TypeError / ValueError naming the first bad setting."""
        if isinstance(tick, bool) or not isinstance(tick, int | float):
            raise TypeError(f"tick must be a number of seconds, got {tick!r}")
        if not (math.isfinite(tick) and tick > 0):
            raise ValueError(f"tick must be a finite number of seconds > 0, got {tick!r}")
        if tick < MIN_TICK:
            raise ValueError(
                f"tick must be at least {MIN_TICK!r} s (1 µs), got {tick!r}: a timer counts"
                f" at most 2**52 ticks, so it would stop firing after {tick * MAX_TICK:.3g} s"
                " of uptime"
            )
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
    def horizon(self) -> float:
        """Seconds after its creation until which this timer fires on time.

        ``MAX_TICK * tick``: 142 thousand years at the default 1 ms tick, 142 years at
        the smallest (:data:`MIN_TICK`). Deadlines beyond it are far future: they stay
        pending, cancellable and resettable, and never fire."""
        return self._tick * _MAX_TICK_F

    @property
    def wheel(self) -> TimingWheel:
        return self._wheel

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The driving task, once started (None before the first add and after close)."""
        return self._task

    @property
    def wakeups(self) -> int:
        """Passes the task made (alarms and continuation passes)."""
        return self._wakeups

    @property
    def lag_last(self) -> float:
        """How late the latest pass that fired anything was: seconds from the earliest
        deadline it fired to the clock reading it fired at (0 until something fires)."""
        return self._lag_last

    @property
    def lag_max(self) -> float:
        """The largest :attr:`lag_last` so far."""
        return self._lag_max

    @property
    def busy(self) -> bool:
        """Whether the task has work it has not finished (an alarm came, or a batch runs)."""
        return self._signalled or self._more or self._running

    @property
    def closed(self) -> bool:
        return self._closed

    def now(self) -> float:
        return _monotonic() if self._c_clock else self._time()

    # -- adding and removing --------------------------------------------------------

    def add(self, task: TimerTask, timeout: float, *, start: float | None = None) -> None:
        """Fire ``task`` ``timeout`` seconds (finite, >= 0) after ``start``.

        ``start`` is a clock reading no later than now (default: now). A deadline that
        has already passed fires synchronously, inside this call.
        """
        now = self.now()
        self._place(task, (now if start is None else start) + timeout, now)

    def _place(self, task: TimerTask, deadline: float, now: float) -> None:
        """Time ``task`` for ``deadline``, given ``now``, a reading of this timer's clock.

        A deadline not after ``now`` fires inside this call. The purgatory's
        registration passes the reading it took at its start (one clock read for
        both): a deadline that passed since then fires at the timer's next pass, late
        by that much, never early.
        """
        if self._closed:
            raise RuntimeError("timer is closed")
        if task._bucket is not None:
            raise ValueError("task is already in a timer")
        task._deadline = deadline
        if deadline <= now:
            self._fire(task)
        else:
            self._schedule(task, deadline)

    def reset(self, task: TimerTask, timeout: float) -> None:
        """Set a task's deadline to now + ``timeout``; cheap when it only moves later.

        Works on a task that is pending, not timed yet, or collected as due in the
        batch now running (it then does not fire in that batch).
        """
        if self._closed:
            raise RuntimeError("timer is closed")
        now = self._time()
        deadline = now + timeout
        task._deadline = deadline
        if deadline <= now:
            self._wheel.remove(task)
            self._fire(task)
        elif task._bucket is None:
            self._schedule(task, deadline)
        else:
            self._arm_for(self._wheel.reschedule(task, self._due_tick(deadline)))

    def cancel(self, task: TimerTask) -> bool:
        """Remove ``task`` in O(1); False if it was not pending here.

        A task collected as due in the batch now running is cancelled too (it will not
        fire), though this returns False for it.
        """
        wheel = self._wheel
        removed = wheel.remove(task)
        collectable(task)  # out of the wheel, or of the batch now running
        if not removed:
            if self._running:
                task._deadline = _NOT_TIMED  # it may be in the batch: the batch skips it
            return False
        if not len(wheel):
            self._disarm()
        return True

    def close(self) -> None:
        """Stop: disarm, end the task, release every entry. Tasks still pending never fire."""
        if self._closed:
            return
        self._closed = True
        self._disarm()
        for entry in self._due[self._due_index :]:
            collectable(entry)
        self._due.clear()
        self._due_index = 0
        self._more = False
        self._signalled = False
        for entry in self._wheel.clear():
            collectable(entry)
            if isinstance(entry, TimerTask):
                entry._deadline = _NOT_TIMED
        self._wake_task()

    async def wait_closed(self) -> None:
        """After :meth:`close`: return once the task has ended."""
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return
        await asyncio.wait([task])

    # -- the task -------------------------------------------------------------------

    def _schedule(self, task: TimerTask, deadline: float) -> None:
        wheel = self._wheel
        if not len(wheel) and not self._running:
            wheel.restart(clock_tick(self._time(), self._tick, self._origin))
        expiration = wheel.schedule(task, self._due_tick(deadline))
        _gc_untrack(task)  # in the wheel's custody: see the ground rule on the cyclic GC
        if expiration != _NO_EXPIRATION:  # usually its bucket is already armed
            self._arm_for(expiration)

    def _due_tick(self, deadline: float) -> int:
        """The wheel tick for ``deadline``: never one the wheel has already reached."""
        # Not before the next tick: the clock went back, or a rounding edge.
        return self._wheel.clamp_future(deadline_tick(deadline, self._tick, self._origin))

    def _arm_for(self, expiration: int) -> None:
        if expiration == _NO_EXPIRATION or self._running:
            return  # a running pass arms for whatever is next when it ends
        armed = self._armed_tick
        if armed is None or expiration < armed:
            if self._task is None:
                self._start()
            self._arm(expiration, early=False)

    def _arm(self, expiration: int, *, early: bool) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
        self._armed_tick = expiration
        if expiration >= MAX_TICK:
            return  # only far-future entries are left: no clock reaches them
        when = self._origin + expiration * self._tick
        if early:
            when = max(when, self._time() + EARLY_WAKE_RETRY)
        self._when = when
        self._handle = self._call_at(when, self._alarm)

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_tick = None

    def _alarm(self) -> None:
        """The clock's callback: wake the task."""
        self._handle = None
        self._armed_tick = None
        self._signalled = True
        self._wake_task()

    def _wake_task(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            loop = self._loop
            if loop is not None and not loop.is_closed():
                wake.set_result(None)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._task = task = loop.create_task(self._drive(), name=f"aiopurgatory-timer:{self._name}")
        task.add_done_callback(self._task_done)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                if self._more:
                    await asyncio.sleep(0)  # let the loop run between chunks
                elif not self._signalled:
                    self._wake = wake = loop.create_future()
                    try:
                        await wake
                    finally:
                        self._wake = None
                if self.closed:  # a property: mypy must not narrow across the await
                    break
                self._work()
        except (KeyboardInterrupt, SystemExit):
            # The state is consistent (entries not yet fired are queued in _due): hand
            # over to a fresh task, then let it propagate.
            if not self._closed:
                self._more = True
                self._start()
            raise

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """The task ended: by close, by a handover, or by a failure nobody must miss."""
        if self._task is task:
            self._task = None
        if self._closed:
            if not task.cancelled():
                task.exception()  # retrieved: whatever it was, close already handled it
            return
        error: BaseException | None
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        if error is None or isinstance(error, KeyboardInterrupt | SystemExit):
            return  # handed over to a fresh task
        self.close()
        callback = self._on_failure
        if callback is not None:
            callback(error)
        elif not isinstance(error, asyncio.CancelledError):
            task.get_loop().call_exception_handler(
                {"message": f"aiopurgatory timer task {self._name!r} failed", "exception": error}
            )

    def _work(self) -> None:
        """One pass: fire what is due, within the work bound; then re-arm."""
        self._wakeups += 1
        alarm = self._signalled
        self._signalled = False
        wheel = self._wheel
        now = self._time()
        now_tick = clock_tick(now, self._tick, self._origin)
        # Lag is measured against the real deadlines this pass fires, not the tick the
        # alarm was armed for (a split ahead of a coarse bucket, or a tick rounded up).
        earliest = _INFINITY
        due = self._due
        self._running = True
        try:
            finished = True
            if not due:
                finished = wheel.collect_due(now_tick, due, self._max_work)
            i = self._due_index
            while i < len(due):
                task = due[i]
                i += 1
                self._due_index = i
                assert isinstance(task, TimerTask)  # only TimerTasks are added
                deadline = task._deadline
                # Skip what was cancelled (NaN), or rescheduled into the wheel, by an
                # earlier callback of this batch.
                if deadline != deadline or task._bucket is not None:
                    continue
                if deadline <= now:
                    if deadline < earliest:
                        earliest = deadline
                    self._fire(task)
                elif not self._closed:  # a rounding edge: not quite due yet
                    self._schedule(task, deadline)
            due.clear()
            self._due_index = 0
        finally:
            self._running = False
            if earliest < _INFINITY:
                lag = now - earliest
                self._lag_last = lag
                if lag > self._lag_max:
                    self._lag_max = lag
        if self._closed:
            return
        if not finished:
            self._more = True
            return
        self._more = False
        nxt = wheel.next_expiration()
        if nxt is None:
            self._disarm()
        else:
            self._arm(nxt, early=alarm and now < self._when)

    def _fire(self, task: TimerTask) -> None:
        collectable(task)  # out of the wheel: collectable before its hook runs
        try:
            task._timer_fired()
        except (Exception, asyncio.CancelledError) as exc:  # the driver survives user code
            asyncio.get_running_loop().call_exception_handler(
                {"message": "timer task raised", "exception": exc, "task": task}
            )
