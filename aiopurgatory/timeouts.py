"""Timeouts, delayed callbacks and sleeps kept on a purgatory's timing wheel.

``asyncio.timeout()`` puts one handle per scope in the event loop's heap: O(log n) to
arm, and a cancelled handle stays in the heap until the loop gets round to dropping
it. A server with 100k requests in flight pays for that on every request. The
classes here keep the same deadlines on the purgatory's wheel instead: O(1) to arm
and to cancel, and one loop alarm for the whole wheel.

They follow asyncio on purpose, so that code can switch with a one-word change:

* :class:`Timeout` has :class:`asyncio.Timeout`'s semantics: it cancels the task at
  the deadline and turns that cancellation (and only that one: the ``uncancel()``
  count is compared with the one it saw on entry) into :class:`TimeoutError`; it nests
  and composes with ``asyncio.timeout``, ``TaskGroup`` and anyio's cancel scopes;
  ``when()``, ``reschedule()`` and ``expired()`` mean the same.
* :class:`TimerHandle` is ``loop.call_later``'s handle: ``cancel()``,
  ``cancelled()``, ``when()``; the callback runs in the context current at
  ``call_later`` (or the one given), and what it raises goes to the loop's exception
  handler.
* :meth:`WheelTimeouts.sleep` is ``asyncio.sleep``.

What differs, on purpose:

* Times are read on the purgatory's clock (the loop's by default, a
  :class:`~aiopurgatory.ManualClock` in tests). Nothing ever fires before its deadline
  on that clock; at the default 1 ms tick it fires within about a tick after it.
* Nothing, for delays and deadlines: a delay of zero or less (``-inf`` included) and
  a deadline already passed (``timeout_at``, ``reschedule``) are due at once, as in
  asyncio: a timeout expires at the next loop iteration (``TimeoutError`` at the next
  await), a ``call_later`` callback runs at the next iteration (never inside
  ``call_later`` itself) and a sleep takes one pass of the loop. ``inf`` and deadlines
  beyond the wheel's horizon (about 142 thousand years at a 1 ms tick) never fire.
  NaN raises ``ValueError`` (asyncio would misbehave with it), anything but a number
  ``TypeError``, naming the value, and an int too large for a float
  ``OverflowError``, as in asyncio.
* When the purgatory closes, what is still waiting on its wheel is not left hanging:
  a timeout cancels its task and its block raises
  :class:`~aiopurgatory.PurgatoryClosed`, a sleep raises it (a sleep at ``inf``
  included), and a delayed callback is cancelled (it never runs). A timeout with no
  deadline (None or ``inf``) does not wait on the wheel and is left alone; its
  ``reschedule`` raises ``PurgatoryClosed`` from then on.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, TypeVar

from .errors import PurgatoryClosed
from .timer import COMPILED_ENTRIES, NOT_TIMED, Timer, TimerTask

__all__ = ["Timeout", "TimerHandle", "WheelTimeouts"]

T = TypeVar("T")

_INF: Final = math.inf

# Timeout states, as asyncio names them (its repr shows the same words).
_CREATED: Final = "created"
_ENTERED: Final = "active"
_EXPIRING: Final = "expiring"
_EXPIRED: Final = "expired"
_EXITED: Final = "finished"
_CLOSING: Final = "closing"  # the purgatory closed while the block was running

# 3.13's asyncio.Timeout records the timeout in the exception chain when something other
# than the CancelledError leaves an expired block (code in a ``finally`` raised, or a
# TaskGroup's children did): the chain then reads "ZeroDivisionError during handling of
# TimeoutError caused by CancelledError" instead of hiding why the block was cancelled.
# 3.11 and 3.12 leave that exception as it is. We follow the running version, so that
# switching between asyncio.timeout and ours changes no traceback.
_CHAINS_TIMEOUT_ERROR: Final = sys.version_info >= (3, 13)

# What a delay or a deadline may be (bool excluded): a constant, since ``int | float``
# would build a union object on every check.
_NUMBER: Final = (int, float)


def check_delay(name: str, delay: object) -> float:
    """``delay`` as float seconds, as asyncio takes it: any number but NaN.

    Zero or less is due at once, ``inf`` never; an int too big for a float raises
    ``OverflowError``, as asyncio's timeouts do. Anything else raises ``TypeError`` /
    ``ValueError`` naming the value.
    """
    if type(delay) is float and delay == delay:  # the common case (NaN fails the test)
        return delay
    if isinstance(delay, bool) or not isinstance(delay, _NUMBER):
        raise TypeError(f"{name} must be a number of seconds, got {delay!r}")
    seconds = float(delay)  # an int beyond the float range: OverflowError, as asyncio
    if seconds != seconds:
        raise ValueError(f"{name} must be a number of seconds, not NaN, got {delay!r}")
    return seconds


def check_deadline(name: str, when: object) -> float | None:
    """``when`` as a float clock reading (past, ``-inf`` included, future or ``inf``)
    or None; NaN and anything but a number raise."""
    if when is None:
        return None
    if isinstance(when, bool) or not isinstance(when, _NUMBER):
        raise TypeError(f"{name} must be a clock time in seconds or None, got {when!r}")
    seconds = float(when)
    if seconds != seconds:
        raise ValueError(f"{name} must be a clock time in seconds, got {when!r}")
    return seconds


class WheelTimeouts:
    """The timeouts, delayed callbacks and sleeps of one purgatory's timer.

    A purgatory makes one on first use (see :meth:`Purgatory.timeout
    <aiopurgatory.Purgatory.timeout>`); it uses the timer through its public API only.
    """

    __slots__ = ("_closed", "_live", "_loop", "_name", "_timer")

    def __init__(self, timer: Timer, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._timer = timer
        self._loop = loop
        self._name = name
        # What is armed on the wheel, so that close can finish it: a dict, since
        # insertion and removal are O(1) and cheap next to the rest of a scope.
        # What close() must finish, each with whether it is on the wheel: a sleep or a
        # callback at ``inf`` is not (it never fires), yet the close must end it too.
        self._live: dict[TimerTask, bool] = {}
        self._closed = False

    def __len__(self) -> int:
        """Timeouts, callbacks and sleeps waiting on the wheel."""
        return len(self._live)

    @property
    def closed(self) -> bool:
        """Whether its purgatory has closed (nothing new may be armed)."""
        return self._closed

    def time(self) -> float:
        """The clock the deadlines are read on (the purgatory's)."""
        return self._timer.now()

    def timeout(self, delay: float | None) -> Timeout:
        """A :class:`Timeout` expiring ``delay`` seconds from now, to use with ``async with``.

        The deadline is fixed now, when the timeout is made, as ``asyncio.timeout``
        does. Armed on entry in O(1) (one wheel entry), disarmed on exit in O(1).

        Args:
            delay: seconds from now; None for no deadline, ``inf`` for one that never
                comes; zero or less expires at the first await after entering.

        Raises:
            TypeError: ``delay`` is neither a number nor None.
            ValueError: ``delay`` is NaN.
            OverflowError: ``delay`` is an int too large for a float.
        """
        if delay is None:
            return Timeout(self, None)
        return Timeout(self, self._timer.now() + check_delay("delay", delay))

    def timeout_at(self, when: float | None) -> Timeout:
        """A :class:`Timeout` expiring at clock time ``when``, to use with ``async with``.

        Args:
            when: a reading of :meth:`time` (the purgatory's clock); None for no
                deadline; a time already passed expires at the first await after
                entering.

        Raises:
            TypeError: ``when`` is neither a number nor None.
            ValueError: ``when`` is NaN.
            OverflowError: ``when`` is an int too large for a float.
        """
        return Timeout(self, check_deadline("when", when))

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now, like ``loop.call_later``.

        O(1) to arm and to cancel (one wheel entry). What the callback raises goes to
        the loop's exception handler. If the purgatory closes first, the handle is
        cancelled and the callback never runs.

        Args:
            delay: seconds from now; zero or less runs it at the next loop iteration
                (never inside this call), ``inf`` never.
            callback: a plain callable, run on the loop.
            *args: its positional arguments.
            context: the ``contextvars.Context`` to run it in (None: a copy of the
                current one, taken now).

        Returns:
            Its :class:`TimerHandle` (``cancel()``, ``when()``).

        Raises:
            TypeError: ``delay`` is not a number, or ``callback`` is not callable.
            ValueError: ``delay`` is NaN.
            OverflowError: ``delay`` is an int too large for a float.
            PurgatoryClosed: the purgatory has closed.
        """
        seconds = check_delay("delay", delay)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self._check_open()
        if context is None:
            context = contextvars.copy_context()
        handle = TimerHandle(self, callback, args, context, self._timer.now() + seconds)
        handle._arm()
        return handle

    async def sleep(self, delay: float, result: T = None) -> T:  # type: ignore[assignment]
        """Return ``result`` after ``delay`` seconds, like ``asyncio.sleep``.

        O(1) to arm, and to disarm when the sleeping task is cancelled.

        Args:
            delay: seconds; zero or less takes one pass of the loop
                (``asyncio.sleep(0)``), ``inf`` until the task is cancelled or the
                purgatory closes.
            result: what to return.

        Returns:
            ``result``.

        Raises:
            TypeError: ``delay`` is not a number.
            ValueError: ``delay`` is NaN.
            OverflowError: ``delay`` is an int too large for a float.
            PurgatoryClosed: the purgatory has closed, before the sleep or during it.
        """
        seconds = check_delay("delay", delay)
        self._check_open()
        if seconds <= 0.0:
            await asyncio.sleep(0)  # as asyncio does: one pass of the loop
            return result
        future: asyncio.Future[T] = self._loop.create_future()
        wakeup = _Wakeup(self, future, result)
        if not self._arm(wakeup, self._timer.now() + seconds):
            future.set_result(result)  # already due: cannot happen for seconds > 0
        try:
            return await future
        finally:
            self._disarm(wakeup)

    def close(self) -> None:
        """Finish what is still waiting: the purgatory is closing (its timer is closed)."""
        if self._closed:
            return
        self._closed = True
        live = self._live
        while live:
            entry = next(iter(live))
            del live[entry]
            assert isinstance(entry, _Armed)
            entry._closed(self._closed_error())

    # -- shared by the entries --------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self._name!r} is closed")

    def _closed_error(self) -> PurgatoryClosed:
        return PurgatoryClosed(f"purgatory {self._name!r} closed")

    def _arm(self, entry: TimerTask, when: float) -> bool:
        """Put ``entry`` on the wheel for clock time ``when``; False if it is already due.

        The wheel fires ``entry`` only once its clock reads at least ``when``.
        """
        now = self._timer.now()
        if when <= now:
            return False
        if when == _INF:  # never fires: not on the wheel, but close() must still end it
            self._live[entry] = False
            return True
        delay = when - now
        # The timer takes a delay from now; now + delay may round below ``when``,
        # which would make the deadline early by an ulp: nudge it up instead.
        if now + delay < when:
            delay = math.nextafter(delay, _INF)
        self._timer.add(entry, delay)
        self._live[entry] = True
        return True

    def _disarm(self, entry: TimerTask) -> None:
        """Take ``entry`` off the wheel, if it is still there (not fired, not closed)."""
        if self._live.pop(entry, False):  # True: it is on the wheel
            self._timer.cancel(entry)

    def _fired(self, entry: TimerTask) -> None:
        self._live.pop(entry, None)


class _Armed(TimerTask):
    """A wheel entry that the closing of its purgatory must finish.

    Subclasses call :meth:`_attach` from their ``__init__`` where they would call
    ``super().__init__()``: compiled, that is one C call where two Python-level
    ``super()`` calls would be made for every timeout, callback and sleep.
    """

    __slots__ = ("_owner",)

    def _attach(self, owner: WheelTimeouts) -> None:
        if not COMPILED_ENTRIES:
            TimerTask.__init__(self)
        else:  # the allocator has set the entry's fields (see COMPILED_ENTRIES)
            self._deadline = NOT_TIMED
        self._owner = owner

    def _closed(self, error: PurgatoryClosed) -> None:
        raise NotImplementedError


class Timeout(_Armed):
    """``async with purgatory.timeout(delay):`` -- :class:`asyncio.Timeout` on the wheel.

    Make one with :meth:`Purgatory.timeout <aiopurgatory.Purgatory.timeout>` or
    :meth:`Purgatory.timeout_at <aiopurgatory.Purgatory.timeout_at>`, not directly.
    Entering arms one wheel entry and leaving takes it off, each in O(1).

    Raises:
        TimeoutError: (on leaving the block) the deadline passed while it ran; the
            ``CancelledError`` that interrupted it is the ``__cause__``.
        PurgatoryClosed: (on leaving) the purgatory closed while the block waited for
            its deadline; or (on entering) it had closed already.
        RuntimeError: (on entering) it was entered before, or outside a task.
    """

    __slots__ = ("_cancelling", "_soon", "_state", "_task", "_when")

    def __init__(self, owner: WheelTimeouts, when: float | None) -> None:
        self._attach(owner)
        self._when = when
        self._state = _CREATED
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._soon: asyncio.Handle | None = None  # a deadline already due when armed

    def when(self) -> float | None:
        """The deadline, a time on the purgatory's clock (None: no deadline)."""
        return self._when

    def expired(self) -> bool:
        """Whether the deadline passed while the block ran (it then raises TimeoutError)."""
        return self._state is _EXPIRING or self._state is _EXPIRED

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to clock time ``when`` (None: no deadline), in O(1).

        Only inside the block, before it expired. A time already passed expires it at
        the next loop iteration (``TimeoutError`` at the next await), as in asyncio.

        Args:
            when: a reading of the purgatory's clock (:meth:`WheelTimeouts.time`), or
                None.

        Raises:
            RuntimeError: the block has not been entered, has expired or exited.
            PurgatoryClosed: the purgatory has closed.
            TypeError: ``when`` is neither a number nor None.
            ValueError: ``when`` is NaN.
            OverflowError: ``when`` is an int too large for a float.
        """
        state = self._state
        if state is not _ENTERED:
            if state is _CREATED:
                raise RuntimeError("Timeout has not been entered")
            raise RuntimeError(f"Cannot change state of {state} Timeout")
        deadline = check_deadline("when", when)
        self._owner._check_open()  # PurgatoryClosed, whatever the new deadline
        self._cancel_alarm()
        self._when = deadline
        if deadline is not None:
            self._set_alarm(deadline)

    def __repr__(self) -> str:
        when = ""
        if self._state is _ENTERED:
            when = " when=" + repr(round(self._when, 3) if self._when is not None else None)
        return f"<Timeout [{self._state}]{when}>"

    async def __aenter__(self) -> Timeout:
        if self._state is not _CREATED:
            raise RuntimeError("Timeout has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._owner._check_open()
        self._state = _ENTERED
        self._task = task
        # Cancellations requested before the block are not ours to turn into a
        # TimeoutError: remember how many there were.
        self._cancelling = task.cancelling()
        if self._when is not None:
            self._set_alarm(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cancel_alarm()
        state = self._state
        if state is _ENTERED:
            self._state = _EXITED
            return
        self._state = _EXPIRED if state is _EXPIRING else _EXITED
        task = self._task
        assert task is not None
        # Take back our cancel request. Only if no other request is left over (from an
        # outer scope, a TaskGroup, task.cancel()) is the CancelledError ours to turn
        # into TimeoutError; otherwise it must go on propagating.
        if task.uncancel() <= self._cancelling and exc_type is not None:
            if issubclass(exc_type, asyncio.CancelledError):
                if state is _CLOSING:
                    raise self._owner._closed_error() from exc
                raise TimeoutError from exc
            if _CHAINS_TIMEOUT_ERROR and state is _EXPIRING and exc is not None:
                # Another exception leaves the expired block (3.13's rule, above): put
                # the TimeoutError where the CancelledError is in its context chain, and
                # in each of a TaskGroup's exceptions.
                _insert_timeout_error(exc)
                if isinstance(exc, ExceptionGroup):
                    for member in exc.exceptions:
                        _insert_timeout_error(member)

    # -- the alarm ----------------------------------------------------------------

    def _set_alarm(self, when: float) -> None:
        if when == _INF:
            # A deadline that never comes, like None: the block does not wait on the
            # wheel, so the purgatory's close leaves it alone (a sleep at inf does wait
            # on it, and is ended).
            return
        if not self._owner._arm(self, when):
            # Already due: expire at the next loop iteration, as asyncio does, so that
            # a block that finishes without awaiting is not cancelled afterwards.
            self._soon = asyncio.get_running_loop().call_soon(self._expire)

    def _cancel_alarm(self) -> None:
        soon = self._soon
        if soon is not None:
            soon.cancel()
            self._soon = None
        else:
            self._owner._disarm(self)

    def _timer_fired(self) -> None:
        self._owner._fired(self)
        self._expire()

    def _expire(self) -> None:
        self._soon = None
        if self._state is not _ENTERED:
            return  # cannot happen: leaving the block disarms
        task = self._task
        assert task is not None
        task.cancel()
        self._state = _EXPIRING

    def _closed(self, error: PurgatoryClosed) -> None:
        if self._state is _ENTERED and self._task is not None:
            self._task.cancel()
            self._state = _CLOSING


def _insert_timeout_error(exc: BaseException) -> None:
    """Make the first CancelledError in ``exc``'s context chain the cause of a
    TimeoutError that takes its place (as 3.13's ``asyncio.Timeout`` does)."""
    while exc.__context__ is not None:
        if isinstance(exc.__context__, asyncio.CancelledError):
            error = TimeoutError()
            error.__context__ = error.__cause__ = exc.__context__
            exc.__context__ = error
            return
        exc = exc.__context__


class TimerHandle(_Armed):
    """A callback that ``purgatory.call_later`` will run: ``loop.call_later``'s handle.

    Made by :meth:`WheelTimeouts.call_later` (through ``Purgatory.call_later``), not
    directly.
    """

    __slots__ = ("_args", "_callback", "_cancelled", "_context", "_soon", "_when")

    def __init__(
        self,
        owner: WheelTimeouts,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context,
        when: float,
    ) -> None:
        self._attach(owner)
        self._callback: Callable[..., object] | None = callback
        self._args: tuple[Any, ...] | None = args
        self._context = context
        self._when = when
        self._cancelled = False
        self._soon: asyncio.Handle | None = None

    def when(self) -> float:
        """When the callback is due, a time on the purgatory's clock."""
        return self._when

    def cancel(self) -> None:
        """Do not run the callback, in O(1) (no effect once it has run or been cancelled).

        Drops the callback and its arguments at once, so they are not kept alive.
        """
        if self._cancelled:
            return
        self._cancelled = True
        soon = self._soon
        if soon is not None:
            soon.cancel()
            self._soon = None
        else:
            self._owner._disarm(self)
        self._callback = self._args = None  # drop what the callback keeps alive

    def cancelled(self) -> bool:
        """Whether it was cancelled (by :meth:`cancel`, or by the purgatory's close)."""
        return self._cancelled

    def __repr__(self) -> str:
        state = " cancelled" if self._cancelled else ""
        return f"<TimerHandle{state} when={self._when} {self._callback!r}>"

    def _arm(self) -> None:
        if not self._owner._arm(self, self._when):
            # Due now (a delay of 0): run in the next loop iteration, never inside
            # call_later itself, as asyncio does.
            self._soon = asyncio.get_running_loop().call_soon(self._run)

    def _timer_fired(self) -> None:
        self._owner._fired(self)
        self._run()

    def _run(self) -> None:
        self._soon = None
        callback, args = self._callback, self._args
        if callback is None or args is None:
            return
        try:
            self._context.run(callback, *args)
        except (Exception, asyncio.CancelledError) as exc:  # as asyncio's handles do
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"Exception in callback {callback!r}", "exception": exc, "handle": self}
            )

    def _closed(self, error: PurgatoryClosed) -> None:
        self._cancelled = True
        self._callback = self._args = None


class _Wakeup(_Armed):
    """What a sleep waits for."""

    __slots__ = ("_future", "_result")

    def __init__(self, owner: WheelTimeouts, future: asyncio.Future[Any], result: object) -> None:
        self._attach(owner)
        self._future = future
        self._result = result

    def _timer_fired(self) -> None:
        self._owner._fired(self)
        future = self._future
        if not future.done():
            future.set_result(self._result)

    def _closed(self, error: PurgatoryClosed) -> None:
        future = self._future
        if not future.done():
            future.set_exception(error)
