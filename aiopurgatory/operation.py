"""``DelayedOperation``: an awaitable that completes exactly once.

An operation completes by one of four paths, and only the first one wins:

* condition: ``try_complete`` sees its condition hold and calls ``force_complete``;
* timeout: its timer fires (``expired`` becomes True before ``on_complete`` runs, and
  ``on_expiration`` runs after it);
* cancellation: ``cancel()``, or cancelling a task that awaits it;
* close: its purgatory closes (``result()`` raises ``PurgatoryClosed``).

``on_complete`` runs only on the first two paths. The operation knows nothing of
wheels or keys: whoever holds it (a purgatory) registers as its owner and is told
synchronously, twice: once when it finishes, before any hook runs, so that it can
forget the operation at once (``_operation_detached``), and once the hooks have run,
with the final outcome (``_operation_recorded``).

Hook code that raises finishes its operation and nothing else:

* ``Exception`` from ``try_complete``, ``on_complete`` or ``on_expiration``: the
  operation finishes with that exception (``await op`` raises it); its outcome is the
  path it took (``COMPLETED``, or ``EXPIRED`` on the timeout path).
* ``CancelledError`` from any of them: the operation finishes *as cancelled*
  (``cancelled()`` is True, outcome ``CANCELLED``, ``await op`` raises it). A
  ``DelayedFuture`` over a cancelled future finishes this way.
* ``KeyboardInterrupt`` / ``SystemExit``: the operation finishes with it, the owner's
  state is made consistent, then it propagates.

To asyncio an operation is a future (``asyncio.isfuture`` is True, with ``get_loop``,
``add_done_callback`` and ``remove_done_callback``): ``wait_for``, ``gather``,
``shield`` and ``wait`` use it directly, so their cancellation reaches it. Like a
future it belongs to one loop and thread: ``cancel``, ``force_complete`` and
``reset_timeout`` from another thread raise ``RuntimeError`` before changing anything.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import enum
import inspect
import math
import threading
import types
from collections.abc import Callable, Generator, Hashable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias, TypeVar, cast

from .errors import PurgatoryClosed
from .timer import COMPILED_ENTRIES, NOT_TIMED, TimerTask

__all__ = ["DelayedOperation", "Outcome", "validate_timeout"]

T = TypeVar("T")

try:
    import cython
except ImportError:  # Cython is needed to build, never to run
    from . import _nocython as cython

if not cython.compiled:
    _thread_ident = threading.get_ident  # compiled: PyThread_get_thread_ident, a C call

_DoneCallback: TypeAlias = "Callable[[DelayedOperation[Any]], object]"

if TYPE_CHECKING:
    from typing import Generic
else:
    # At run time DelayedOperation is a plain class: compiled, it is an extension type,
    # which can have neither typing.Generic nor a metaclass (abc.ABCMeta) among its
    # bases. Subscripting it (DelayedOperation[int]) goes through __class_getitem__.
    class _GenericBase:
        __slots__ = ()

        def __init_subclass__(cls, **kwargs: Any) -> None:
            # Here rather than on DelayedOperation, which, compiled, is an extension
            # type and may not define __init_subclass__; every operation class has
            # this base. The purgatory calls the hooks synchronously: an async def
            # hook would hand it a coroutine nobody awaits (a truthy try_complete that
            # completed nothing, a result that is a coroutine object). Refused where
            # it is written.
            super().__init_subclass__(**kwargs)
            for name in ("try_complete", "on_complete", "on_expiration"):
                hook = cls.__dict__.get(name)
                if inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook):
                    raise TypeError(
                        f"{cls.__qualname__}.{name} must be a plain method, not async: the"
                        " purgatory calls it synchronously on the loop (await the work"
                        " elsewhere and notify() its key when it is done)"
                    )

    class _NoGeneric:
        def __getitem__(self, params: object) -> type:
            return _GenericBase

    Generic = _NoGeneric()


class Outcome(enum.Enum):
    """How an operation finished (:attr:`DelayedOperation.outcome`)."""

    COMPLETED = "completed"
    """By its condition (``force_complete``), or a hook raised on that path."""
    EXPIRED = "expired"
    """By its timeout: ``expired`` is True, ``on_complete`` then ``on_expiration`` ran."""
    CANCELLED = "cancelled"
    """By ``cancel()``, a cancelled awaiting task, or a hook raising ``CancelledError``."""
    CLOSED = "closed"
    """By the close of its purgatory: no hook ran, ``result()`` raises ``PurgatoryClosed``."""


class OperationOwner:
    """What an operation tells whoever registered it (a purgatory), and nothing more.

    A base class rather than a protocol so that, compiled, an operation reaches its
    owner through a C call instead of a Python attribute look-up per message.
    """

    # What threading.get_ident() said where the owner's loop last ran: an operation
    # compares it with its own thread before it changes anything (a C field, compiled).
    __slots__ = ("_thread",)
    _thread: int

    def _operation_detached(self, op: DelayedOperation[Any]) -> None:
        """``op`` is finishing: it must leave the owner's timer and watchers (before hooks)."""
        raise NotImplementedError

    def _operation_recorded(self, op: DelayedOperation[Any], outcome: Outcome) -> None:
        """``op``'s hooks have run and ``outcome`` is final."""
        raise NotImplementedError

    def _reset_timeout(self, op: DelayedOperation[Any], timeout: float | None) -> None:
        """``op`` asked to expire ``timeout`` seconds from now (None: never)."""
        raise NotImplementedError

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the owner runs on, where its operations are awaited; raises a clear
        error if that is not the loop running here."""
        raise NotImplementedError

    def _event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the owner is bound to, unchecked (None if not bound yet)."""
        raise NotImplementedError

    def _check_thread(self, op: DelayedOperation[Any], method: str) -> None:
        """``op.<method>()`` was called in a thread other than ``_thread``: return if
        that is safe (the loop moved to this thread, or no longer runs), else raise."""
        raise NotImplementedError


_NO_RESULT: Final = object()

# The outcomes as module constants: compiled, C globals (operation.pxd), so the hot
# paths compare pointers instead of looking up Outcome and its member each time.
_COMPLETED: Final = Outcome.COMPLETED
_EXPIRED: Final = Outcome.EXPIRED
_CANCELLED: Final = Outcome.CANCELLED
_CLOSED: Final = Outcome.CLOSED

_INFINITY: Final = math.inf
_NOT_TIMED: Final = NOT_TIMED  # compiled: a C constant (operation.pxd)


def validate_timeout(timeout: object) -> float | None:
    """Return ``timeout`` as float seconds, or None for "no timeout" (None or +inf).

    What every operation's timeout goes through (the constructor, ``reset_timeout``).

    Args:
        timeout: seconds (an int or a float, ``bool`` excluded), or None.

    Returns:
        The seconds as a float, or None if ``timeout`` is None or ``inf``.

    Raises:
        TypeError: ``timeout`` is neither a number nor None (a ``bool`` included).
        ValueError: ``timeout`` is negative or NaN.
        OverflowError: ``timeout`` is an int too large for a float.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    seconds = float(timeout)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    return None if math.isinf(seconds) else seconds


def describe_operation(kind: type, state: str, timeout: object) -> str:
    """An operation's repr from its parts: :meth:`DelayedOperation.__repr__`, and the
    message of the close's error, which formats it only when read (see
    ``purgatory._ClosedBefore``)."""
    return f"<{kind.__name__} {state} timeout={timeout!r}>"


class DelayedOperation(TimerTask, Generic[T]):
    """An operation completed by its condition, its timeout, cancellation or close.

    A subclass implements:

    * :meth:`try_complete`: check the condition; if it holds, ``return
      self.force_complete()``, else return False. The purgatory calls it at
      registration and after each event on the operation's keys.
    * :meth:`on_complete`: make the result (what ``await op`` returns). Check
      ``self.expired`` to tell the timeout path from the condition path.
    * optionally :meth:`on_expiration`: extra work when the timeout won (a metric, a
      log line).

    All three are plain methods, run synchronously on the loop; an ``async def`` one
    is refused with ``TypeError`` when the subclass is defined.

    Exactly once: the first of condition, timeout, cancellation and close wins, and
    the others then do nothing (``force_complete`` and ``cancel`` return False).
    ``on_complete`` runs at most once, and only on the condition or timeout path.
    ``await op`` returns ``on_complete``'s value or raises what completed it; any
    number of tasks may await one operation.

    Args:
        timeout: seconds from registration until it expires; None (or ``inf``) for
            never.

    Raises:
        TypeError: ``timeout`` is neither a number nor None.
        ValueError: ``timeout`` is negative or NaN.
        OverflowError: ``timeout`` is an int too large for a float.
    """

    __slots__ = (
        "_callbacks",
        "_checking",
        "_exception",
        "_exception_tb",
        "_keys",
        "_links",
        "_outcome",
        "_owner",
        "_recheck",
        "_result",
        "_waiter",
        "created",
        "expired",
        "timeout",
    )

    __class_getitem__ = classmethod(types.GenericAlias)  # type: ignore[var-annotated]

    label: ClassVar[str | None] = None
    """Name of this kind of operation in traces and metrics (default: the class name)."""

    # What asyncio.isfuture() looks for: asyncio.ensure_future, wait_for, gather, shield
    # and wait then take the operation as the future it is (done callbacks, cancel())
    # instead of wrapping it in a task. Cancelling such a task before it had started
    # never reached the operation: wait_for(op, 0), or a gather cancelled at once, left
    # it pending for ever. Never True: the operation yields its waiter, not itself.
    _asyncio_future_blocking: ClassVar[bool] = False

    def __init__(self, timeout: float | None) -> None:
        if not COMPILED_ENTRIES:
            super().__init__()
        else:
            # The extension type's allocator has already set every field of the timer
            # entry and task to None / 0, which is all their __init__ does but for the
            # deadline; skipping the two Python-level super() calls saves a third of the
            # cost of making an operation.
            self._deadline = _NOT_TIMED
        # The common case skips the checks: a finite, non-negative float.
        if type(timeout) is float and 0.0 <= timeout < _INFINITY:
            self.timeout: float | None = timeout
        else:
            self.timeout = validate_timeout(timeout)
        """Seconds from registration until the operation expires; None = never."""
        self.expired = False
        """True once the operation completed by timeout (set before ``on_complete``)."""
        self.created: float | None = None
        """Clock time (seconds) at which a purgatory registered the operation."""
        self._outcome: Outcome | None = None
        self._result: object = _NO_RESULT
        self._exception: BaseException | None = None
        self._exception_tb: TracebackType | None = None
        self._waiter: asyncio.Future[None] | None = None
        # add_done_callback's (callback, context) pairs, scheduled on the waiter's loop
        # when the operation finishes; None (the common case) while there are none.
        self._callbacks: list[tuple[_DoneCallback, contextvars.Context | None]] | None = None
        self._owner: OperationOwner | None = None
        # Keys the owner watches this operation under. The owner sets and reads
        # them; the operation only reports how many there are.
        self._keys: tuple[Hashable, ...] = ()
        # The owner's entries for this operation in its keys' shared watcher lists
        # (a chain the owner follows to unlink them); None when there are none.
        self._links: Any = None
        self._checking = False
        self._recheck = False

    # -- the subclass API ---------------------------------------------------------

    @abc.abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if it holds, return ``self.force_complete()``.

        Called synchronously at registration and after each event on the keys, never
        while a call is already running (a check asked for meanwhile runs next).

        Returns:
            True if this call completed the operation, else False.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def on_complete(self) -> T:
        """Produce the result; runs at most once, on the condition or timeout path.

        Returns:
            What ``await op`` and ``result()`` return. What it raises is what they
            raise instead.
        """
        raise NotImplementedError

    def on_expiration(self) -> None:
        """Run after ``on_complete`` when the operation timed out."""

    # -- completion ---------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete now by condition: run ``on_complete``, then wake the awaiters.

        Call it from :meth:`try_complete` when the condition holds, or from outside to
        complete early. The owner forgets the operation before ``on_complete`` runs.

        Returns:
            True for the one call that completed it; False if it was already done.

        Raises:
            RuntimeError: called from a thread other than the one its purgatory's
                loop runs in, while that loop runs (nothing changed).
        """
        if self._outcome is not None:
            return False
        owner = self._owner
        if owner is not None and _thread_ident() != owner._thread:
            owner._check_thread(self, "force_complete")
        self._outcome = _COMPLETED
        self._run_completion(_COMPLETED)
        return True

    def cancel(self, msg: str | None = None) -> bool:
        """Cancel the operation and wake its awaiters; ``on_complete`` does not run.

        The awaiters get ``CancelledError(msg)``; the operation leaves its purgatory's
        timer and keys at once.

        Args:
            msg: the message of that ``CancelledError`` (None: none).

        Returns:
            True if it was pending; False if it was already done.

        Raises:
            RuntimeError: called from a thread other than the one its purgatory's
                loop runs in, while that loop runs (nothing changed).
        """
        if self._outcome is not None:
            return False
        owner = self._owner
        if owner is not None and _thread_ident() != owner._thread:
            # Refused before anything changes: from another thread the wheel would be
            # edited under the loop's feet and the awaiter woken only by its next event.
            owner._check_thread(self, "cancel")
        self._outcome = _CANCELLED
        # The CancelledError is made only if someone asks for it (result, exception,
        # an awaiter): most cancelled operations are never looked at again, and an
        # exception object is the dearest thing a cancel would allocate.
        self._result = msg
        self._release()
        return True

    def reset_timeout(self, seconds: float | None) -> None:
        """Expire ``seconds`` from now (None: never), replacing the timeout.

        Before registration it only sets :attr:`timeout` (counted from registration).
        Once registered, O(1) when the deadline moves later (recorded in place); an
        earlier one relinks its wheel entry. 0 expires it at once: the timeout path's
        hooks have run when this returns.

        Args:
            seconds: seconds from now (>= 0), or None / ``inf`` for never.

        Raises:
            TypeError: ``seconds`` is neither a number nor None.
            ValueError: ``seconds`` is negative or NaN.
            OverflowError: ``seconds`` is an int too large for a float.
            asyncio.InvalidStateError: the operation has already completed.
            RuntimeError: called from a thread other than the one its purgatory's
                loop runs in, while that loop runs, or from another event loop.
        """
        timeout = validate_timeout(seconds)
        if self._outcome is not None:
            raise asyncio.InvalidStateError(f"{self!r} has already completed")
        owner = self._owner
        if owner is None:
            self.timeout = timeout
            return
        if _thread_ident() != owner._thread:
            owner._check_thread(self, "reset_timeout")
        owner._reset_timeout(self, timeout)  # sets self.timeout once it accepts the call

    # -- the Future-like view -----------------------------------------------------

    def done(self) -> bool:
        """Whether the operation has finished, by any path (as ``Future.done``)."""
        return self._outcome is not None

    def cancelled(self) -> bool:
        """Whether it finished as cancelled (outcome ``CANCELLED``), as ``Future.cancelled``."""
        return self._outcome is _CANCELLED

    @property
    def outcome(self) -> Outcome | None:
        """How the operation finished, or None while it is pending."""
        return self._outcome

    @property
    def kind(self) -> str:
        """Its name in traces and metrics: :attr:`label`, or else the class name."""
        return self.label or type(self).__name__

    @property
    def num_keys(self) -> int:
        """How many distinct keys it was registered under (0 before registration)."""
        return len(self._keys)

    def result(self) -> T:
        """The result, or raise what completed the operation (like ``Future.result``).

        Raises:
            asyncio.InvalidStateError: the operation has not completed (or its
                ``on_complete`` is still running).
            asyncio.CancelledError: it was cancelled.
            PurgatoryClosed: its purgatory closed first.
            Exception: whatever a hook raised, with its first traceback.
        """
        if self._outcome is None:
            raise asyncio.InvalidStateError(f"{self!r} has not completed")
        if self._exception is not None:
            # The traceback as first caught: re-raising must not grow it call by call.
            raise self._exception.with_traceback(self._exception_tb)
        if self._outcome is _CANCELLED:
            raise self._cancelled_error()
        if self._outcome is _CLOSED:
            raise self._close_error()
        if self._result is _NO_RESULT:
            raise asyncio.InvalidStateError(f"{self!r} is still running on_complete")
        return cast(T, self._result)

    def exception(self) -> BaseException | None:
        """The exception that completed the operation, or None if it has a result.

        Raises:
            asyncio.InvalidStateError: the operation has not completed.
            asyncio.CancelledError: it was cancelled (raised, not returned, as
                ``Future.exception`` does).
        """
        if self._outcome is None:
            raise asyncio.InvalidStateError(f"{self!r} has not completed")
        if self._outcome is _CANCELLED:
            if self._exception is None:
                raise self._cancelled_error()
            raise self._exception.with_traceback(self._exception_tb)
        if self._outcome is _CLOSED and self._exception is None:
            return self._close_error()
        return self._exception

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the operation belongs to (its purgatory's, once registered).

        Raises:
            RuntimeError: it is neither registered nor awaited, and no loop is running.
        """
        waiter = self._waiter
        if waiter is not None:
            return waiter.get_loop()
        owner = self._owner
        if owner is not None:
            loop = owner._event_loop()
            if loop is not None:
                return loop
        return asyncio.get_running_loop()

    def add_done_callback(
        self, fn: _DoneCallback, *, context: contextvars.Context | None = None
    ) -> None:
        """Call ``fn(op)`` on the loop once the operation has finished (by any path,
        after its hooks), as ``asyncio.Future.add_done_callback`` does.

        Already finished: ``fn`` is scheduled at once (with ``call_soon``). What ``fn``
        raises goes to the loop's exception handler.

        Args:
            fn: called with the operation as its only argument.
            context: the ``contextvars.Context`` to run ``fn`` in (None: a copy of the
                one current when the operation finishes).

        Raises:
            RuntimeError: no loop to run ``fn`` on: the operation is neither registered
                nor awaited and no loop is running here.
        """
        if self._outcome is not None:
            # Finished (or finishing: its hooks run synchronously, before the callback).
            self.get_loop().call_soon(fn, self, context=context)
            return
        if self._waiter is None:
            # Its loop is where the callbacks will run. Unchecked (get_loop):
            # loop.run_until_complete(op) adds its callback before the loop runs.
            self._waiter = self.get_loop().create_future()
        callbacks = self._callbacks
        if callbacks is None:
            self._callbacks = [(fn, context)]
        else:
            callbacks.append((fn, context))

    def remove_done_callback(self, fn: _DoneCallback) -> int:
        """Remove every registration of ``fn`` (compared with ``==``).

        Args:
            fn: a callback given to :meth:`add_done_callback`.

        Returns:
            How many registrations were removed (0 if none, or once it has finished:
            the callbacks have then been scheduled already).
        """
        callbacks = self._callbacks
        if not callbacks:
            return 0
        kept = [entry for entry in callbacks if entry[0] != fn]
        self._callbacks = kept or None
        return len(callbacks) - len(kept)

    @property
    def _cancel_message(self) -> object:
        """``asyncio.Future``'s: the message of a cancelled operation (gather reads it)."""
        if self._outcome is not _CANCELLED:
            return None
        error = self._make_cancelled_error()
        return error.args[0] if error.args else None

    def _make_cancelled_error(self) -> BaseException:
        """``asyncio.Future``'s: the CancelledError of a cancelled operation (gather)."""
        exc = self._exception
        if exc is not None:
            return exc
        return self._cancelled_error()

    def _ensure_waiter(self) -> asyncio.Future[None]:
        waiter = self._waiter
        if waiter is None:
            # The owner's loop, which the owner checks is the one running here:
            # asyncio.get_running_loop() costs a getpid() system call per call.
            owner = self._owner
            loop = asyncio.get_running_loop() if owner is None else owner._bound_loop()
            waiter = self._waiter = loop.create_future()
        return waiter

    def __await__(self) -> Generator[Any, None, T]:
        if self._outcome is None:
            waiter = self._waiter
            if waiter is None:
                waiter = self._ensure_waiter()
            try:
                yield from waiter
            except asyncio.CancelledError:
                # Cancelling the awaiting task (task.cancel(), a timeout scope, a
                # TaskGroup, anyio) cancelled the waiter: the operation goes with it,
                # here, before the awaiting code resumes. Not a done-callback on the
                # waiter: that would cost a loop callback on every wake-up.
                if waiter.cancelled():
                    self.cancel()
                raise
        return self.result()

    def __repr__(self) -> str:
        state = "pending" if self._outcome is None else self._outcome.value
        return describe_operation(type(self), state, self.timeout)

    # -- used by the owner and the timer --------------------------------------------

    def _check(self) -> bool:
        """Run ``try_complete`` unless done or already running; True if it completed.

        A check asked for while one is running is not lost: the running one loops.
        Whatever ``try_complete`` does (complete, cancel, raise), the operation is
        consistent afterwards; True means it finished by this check with outcome
        ``COMPLETED``.
        """
        if self._outcome is not None:
            return False
        if self._checking:
            self._recheck = True
            return False
        self._checking = True
        try:
            while True:
                self._recheck = False
                self.try_complete()
                if self.done():  # a method call: mypy must not narrow across try_complete
                    return self._outcome is _COMPLETED
                if not self._recheck:
                    return False
        except (Exception, asyncio.CancelledError) as exc:
            if self.done():
                _report(exc, "try_complete raised after the operation completed", self)
                return self._outcome is _COMPLETED
            cancelled = isinstance(exc, asyncio.CancelledError)
            self._outcome = _CANCELLED if cancelled else _COMPLETED
            self._finish(exc)
            return not cancelled
        except BaseException as exc:
            if self._outcome is None:
                self._outcome = _COMPLETED
                self._finish(exc)
            raise
        finally:
            self._checking = False

    def _timer_fired(self) -> None:
        if self._outcome is not None:
            return
        self._outcome = _EXPIRED
        self.expired = True
        self._run_completion(_EXPIRED)

    def _abandon(self, closing: Callable[[DelayedOperation[Any]], PurgatoryClosed]) -> bool:
        """Complete because the owner closed; on_complete does not run.

        ``closing(self)`` makes the error (``PurgatoryClosed``) when it is first read:
        a close of N pending operations then makes nothing per operation. Made at
        close, the errors and their messages were most of a close's cost (1M pending:
        3-4 s of CPU, the float repr of every timeout and the collections their
        allocations set off), for errors mostly never read.
        """
        if self._outcome is not None:
            return False
        self._outcome = _CLOSED
        self._result = closing  # a closed operation has no result: the slot is free
        self._release()
        return True

    def _close_error(self) -> BaseException:
        """The error of an operation its owner closed, made once, when first read."""
        make = cast(Callable[["DelayedOperation[Any]"], BaseException], self._result)
        exc = make(self)
        self._exception = exc
        self._exception_tb = exc.__traceback__
        self._result = None  # the maker and what it holds (the close's cause) let go
        return exc

    def _run_completion(self, outcome: Outcome) -> None:
        """The condition and timeout paths: leave the owner, run the hooks, record."""
        owner = self._owner
        if owner is not None:
            owner._operation_detached(self)
        try:
            try:
                self._result = self.on_complete()
            except BaseException as exc:
                self._hook_raised(exc)
                if not isinstance(exc, Exception | asyncio.CancelledError):
                    raise
            if outcome is _EXPIRED:
                try:
                    self.on_expiration()
                except BaseException as exc:
                    if self._exception is None:
                        self._hook_raised(exc)
                    elif isinstance(exc, Exception | asyncio.CancelledError):
                        _report(exc, "on_expiration raised after on_complete raised", self)
                    if not isinstance(exc, Exception | asyncio.CancelledError):
                        raise
        finally:
            self._settle(owner)

    def _hook_raised(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            self._outcome = _CANCELLED
        self._exception = exc
        self._exception_tb = exc.__traceback__

    def _cancelled_error(self) -> BaseException:
        """The CancelledError of an operation :meth:`cancel` finished, made once."""
        msg = self._result
        exc = self._exception = (
            asyncio.CancelledError() if msg is None else asyncio.CancelledError(msg)
        )
        return exc

    def _finish(self, exc: BaseException) -> None:
        """Finish without running hooks (close, a raising try_complete)."""
        self._exception = exc
        self._exception_tb = exc.__traceback__
        self._release()

    def _release(self) -> None:
        """Leave the owner and wake the awaiters: the end of every hook-less finish."""
        owner = self._owner
        if owner is not None:
            owner._operation_detached(self)
        self._settle(owner)

    def _settle(self, owner: OperationOwner | None) -> None:
        self._owner = None
        try:
            if owner is not None:
                assert self._outcome is not None
                owner._operation_recorded(self, self._outcome)
        finally:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        callbacks = self._callbacks
        if callbacks is None:  # the common case: awaiters only
            if not waiter.done():
                if waiter.get_loop().is_closed():
                    return  # closed after its loop ended: nobody is left to wake
                waiter.set_result(None)
            return
        self._callbacks = None  # they run once, and do not keep anything alive after
        loop = waiter.get_loop()
        if loop.is_closed():
            return
        if not waiter.done():  # done already if an awaiting task was cancelled
            waiter.set_result(None)
        for fn, context in callbacks:
            loop.call_soon(fn, self, context=context)


def _report(exc: BaseException, message: str, op: DelayedOperation[Any]) -> None:
    asyncio.get_running_loop().call_exception_handler(
        {"message": message, "exception": exc, "operation": op}
    )
