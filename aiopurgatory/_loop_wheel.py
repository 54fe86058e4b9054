"""What every wheel loop has, whatever its base: the timers' store, the hot path,
cancellation, the mirror of the debug flag, and introspection by owner.

Ground rules: this module knows asyncio's loop interface but no base loop's insides;
how a loop is woken for the wheel is each kind's own (``_wheel_arm``): the alarm in
asyncio's heap (:mod:`aiopurgatory.loop`) or one uvloop timer
(``aiopurgatory._loop_uv``). Both of those import this module; it imports neither,
so the two kinds of wheel loop share code without a cycle between them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import types
from collections.abc import Callable, Sequence
from contextvars import Context
from dataclasses import dataclass
from typing import Any, Final

from . import looptimers as _looptimers
from .looptimers import LoopTimers, TimerHandle

__all__ = ["TICK", "WHEEL_SIZE", "OwnerTimers", "TimerStats", "timer_owner"]

TICK: Final = 0.001
"""Seconds per wheel tick. Precision does not depend on it
(:mod:`aiopurgatory.loop`'s rule 2): it sets how many
entries share a bucket and how often an idle loop with far timers wakes for a cascade."""

WHEEL_SIZE: Final = 256
"""Buckets per wheel level: 256 ms at level 0, about 65 s at level 1, 4.7 h at level 2."""


class _WheelBase(asyncio.AbstractEventLoop):
    """What every wheel loop has, whatever its base: the timers' store, the hot path
    (compiled with it), the slow path of a closed loop or debug mode, cancellation,
    the mirror of the debug flag, and introspection.

    Mixed in by ``aiopurgatory.loop``'s ``_WheelLoopMixin`` (asyncio's loops, woken by
    the alarm of that module's rule 4) and by ``aiopurgatory._loop_uv`` (uvloop's,
    woken by one uvloop timer). Each kind provides ``_wheel_arm`` (how the loop is told
    to wake) and ``_wheel_check`` (its base's checks before a timer is made, outside
    the hot path).
    """

    _wheel_timers: LoopTimers

    def _wheel_setup(self, clock: Callable[[], float] | None = None) -> None:
        """The timers' store; called once the base loop's ``__init__`` has run."""
        timers = LoopTimers(self.time, self._wheel_arm, TICK, WHEEL_SIZE, clock)
        timers.debug = self.get_debug()  # as the base's __init__ set it
        timers.closed = self.is_closed()
        self._wheel_timers = timers

    def _wheel_arm(self, when: float) -> None:
        """Make the loop wake at ``when`` at the latest (each kind's own)."""
        raise NotImplementedError

    def _wheel_check(self, callback: Callable[..., object]) -> None:
        """The base loop's checks of a new timer on a closed loop or in debug mode."""
        raise NotImplementedError

    # -- scheduling ----------------------------------------------------------------

    # Compiled with the hot path: asyncio's checks, the handle asyncio would make, on
    # the wheel, with the closed and debug cases sent to _wheel_timer_checked.
    call_later = _looptimers.call_later  # type: ignore[assignment]
    call_at = _looptimers.call_at  # type: ignore[assignment]

    def _wheel_timer_checked(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: Context | None,
    ) -> TimerHandle:
        """A timer of a closed loop or in debug mode: the base loop's checks in its order,
        and asyncio's constructor (its source traceback) for the handle."""
        self._wheel_check(callback)  # raises if closed
        handle = TimerHandle(when, callback, args, self, context)
        traceback = handle._source_traceback
        if traceback:
            # End at the caller's line, as the base's: drop this package's loop frames
            # (and the pure-Python build's call_later / call_at).
            while traceback and traceback[-1].filename in _OWN_FILES:
                del traceback[-1]
        handle._scheduled = True
        handle._entry = self._wheel_timers.add(handle, when)
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """Called by ``TimerHandle.cancel()`` while scheduled: free the entry now."""
        if isinstance(handle, TimerHandle):
            entry = handle._entry
            if entry is not None:
                handle._entry = None
                entry.cancel()
            return
        super()._timer_handle_cancelled(handle)  # type: ignore[misc]

    def set_debug(self, enabled: bool) -> None:
        """The base's ``set_debug``, mirrored where the timers read it per timer."""
        super().set_debug(enabled)
        timers: LoopTimers | None = getattr(self, "_wheel_timers", None)  # None: __init__
        if timers is not None:
            timers.debug = self.get_debug()

    def wheel_timers(self) -> int:
        """Timers waiting on the wheel or in the near heap (cancelled ones excluded)."""
        return self._wheel_timers.live()

    def timer_stats(self) -> TimerStats:
        """The pending timers (those of :meth:`wheel_timers`) counted by owner.

        O(timers), computed now from the wheel's entries and the near heap (about 1 µs
        per timer, and it holds the loop meanwhile); call it from the loop's thread (a
        debugging page, a metrics scrape on the loop).
        """
        rows: dict[str, list[float]] = {}  # owner -> [count, earliest when, latest when]
        handles: list[TimerHandle | None] = self._wheel_timers.handles()
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


_OWN_FILES: Final = frozenset(
    os.path.join(os.path.dirname(__file__), f"{name}.py")
    for name in ("loop", "looptimers", "_loop_uv", "_loop_wheel")
)
"""The wheel loops' source files: frames to drop from a debug-mode handle's source
traceback (the compiled hot path has no frames)."""


def _wheel_class(name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> type[Any]:
    """The wheel-loop class, with ``_wheel_timers`` in a slot of its own if it can have one.

    ``call_later`` reads that attribute per timer: a slot is a data descriptor of the
    class, found before the instance dict is searched (a loop has some thirty
    attributes), about 140 instructions less per call. A base that cannot take a slot
    (a variable-size C type) keeps it in the instance dict: slower, the same behaviour.
    """
    try:
        return type(name, bases, {**namespace, "__slots__": ("_wheel_timers",)})
    except TypeError:
        return type(name, bases, namespace)
