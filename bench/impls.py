"""The implementations compared, behind two small interfaces the workloads share.

``Timers``: one-shot timers named by an int token (the ``timer`` and ``expiry``
suites). ``Purgatories``: operations watched under keys, completed by a completer or
by timeout (the ``purgatory`` and ``memory`` suites). Each has these implementations:

* ``wheel``: aiopurgatory (its ``Timer``, and its ``Purgatory`` with a
  ``DelayedOperation`` subclass), as built: compiled when the extension modules are;
* ``pure``: the same, forced to the pure-Python modules (``AIOPURGATORY_NO_EXTENSIONS``;
  the runner gives it a fresh interpreter);
* ``heap``: one ``loop.call_later`` per operation, cancelled on completion (the handle
  stays in asyncio's heap until the loop drops it);
* ``task``: one task per operation waiting on a future under ``asyncio.timeout_at``;
* ``floor`` (``timer`` and ``churn`` only): no timing and no watching at all, only what
  any implementation pays in these workloads: the benchmark's own loop, the calls
  through this interface, and making the same task or operation object (the
  operation's constructor is user code). Its rate is the ceiling no implementation can
  pass; ``1/wheel - 1/floor`` is what the library itself costs per pair;
* ``hooks`` (``churn`` only): the floor plus what the operation does on its own, with
  no purgatory: the user's ``try_complete`` at registration and, to finish, ``cancel``
  or ``try_complete`` -> ``force_complete`` -> ``on_complete``. Every purgatory must
  make those calls, so ``1/wheel - 1/hooks`` is what the timer and the watcher lists
  cost per pair.

The baselines keep watchers exactly as the wheel's purgatory does (an insertion-
ordered dict per key, left at once on completion), so only the timing differs.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Collection, Hashable
from typing import Any, Final, Generic, TypeVar, cast

import aiopurgatory as ap
from aiopurgatory.timer import Timer, TimerTask

__all__ = [
    "DEFAULT_IMPLS",
    "FLOOR",
    "HOOKS",
    "IMPLS",
    "PURE",
    "Purgatories",
    "Timers",
    "make_purgatories",
    "make_timers",
]

IMPLS: Final = ("wheel", "pure", "heap", "task")
DEFAULT_IMPLS: Final = ("wheel", "heap", "task")
FLOOR: Final = "floor"
"""The no-op implementation of the steady pair suites (``timer`` and ``churn``)."""
HOOKS: Final = "hooks"
"""The floor plus the operation's own calls, no timer and no watchers (``churn``)."""
PURE: Final = "pure"
"""Runs in an interpreter of its own, with AIOPURGATORY_NO_EXTENSIONS=1."""

TICK: Final = 0.001
WHEEL_SIZE: Final = 20
PURGE_INTERVAL: Final = 1000

FireCallback = Callable[[int], None]
DoneCallback = Callable[[int, bool], None]
"""Told ``(token, expired)`` when an operation finishes."""

H = TypeVar("H")
Op = TypeVar("Op")


# -- timers ---------------------------------------------------------------------------


class Timers(abc.ABC, Generic[H]):
    """One-shot timers; ``on_fire(token)`` runs when one expires."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_fire: FireCallback) -> None:
        self.loop = loop
        self.on_fire = on_fire

    @abc.abstractmethod
    def add(self, token: int, timeout: float) -> H:
        """Start a timer firing ``timeout`` seconds from now; returns its handle."""

    @abc.abstractmethod
    def cancel(self, handle: H) -> None:
        """Stop a pending timer (the workloads never cancel one that fired)."""

    @abc.abstractmethod
    def pending(self) -> int: ...

    def wakeups(self) -> int | None:
        """Times the implementation's own driver woke, if it has one."""
        return None

    def close(self) -> None:
        """Release the loop resources of timers still pending."""


class _WheelTask(TimerTask):
    __slots__ = ("owner", "token")

    def __init__(self, owner: Timers[Any], token: int) -> None:
        super().__init__()
        self.owner = owner
        self.token = token

    def _timer_fired(self) -> None:
        self.owner.on_fire(self.token)


class WheelTimers(Timers[_WheelTask]):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_fire: FireCallback) -> None:
        super().__init__(loop, on_fire)
        self.timer = Timer(loop, tick=TICK, wheel_size=WHEEL_SIZE)

    def add(self, token: int, timeout: float) -> _WheelTask:
        task = _WheelTask(self, token)
        self.timer.add(task, timeout)
        return task

    def cancel(self, handle: _WheelTask) -> None:
        self.timer.cancel(handle)

    def pending(self) -> int:
        return len(self.timer)

    def wakeups(self) -> int:
        return self.timer.wakeups

    def close(self) -> None:
        self.timer.close()


class FloorTimers(Timers[_WheelTask]):
    """Makes the wheel's task object and touches it on cancel, as any cancel must."""

    def add(self, token: int, timeout: float) -> _WheelTask:
        return _WheelTask(self, token)

    def cancel(self, handle: _WheelTask) -> None:
        handle.token = -1

    def pending(self) -> int:
        return 0


class HeapTimers(Timers[asyncio.TimerHandle]):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_fire: FireCallback) -> None:
        super().__init__(loop, on_fire)
        self._call_later = loop.call_later
        self._added = 0
        self._gone = 0

    def add(self, token: int, timeout: float) -> asyncio.TimerHandle:
        self._added += 1
        return self._call_later(timeout, self._fire, token)

    def cancel(self, handle: asyncio.TimerHandle) -> None:
        self._gone += 1
        handle.cancel()

    def _fire(self, token: int) -> None:
        self._gone += 1
        self.on_fire(token)

    def pending(self) -> int:
        return self._added - self._gone


class TaskTimers(Timers["asyncio.Future[None]"]):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_fire: FireCallback) -> None:
        super().__init__(loop, on_fire)
        self._pending = 0
        # Futures cancelled by their timeout whose task had not run yet when the
        # timer was cancelled: the cancel wins, the task must not report a fire.
        self._revoked: set[asyncio.Future[None]] = set()

    def add(self, token: int, timeout: float) -> asyncio.Future[None]:
        loop = self.loop
        future: asyncio.Future[None] = loop.create_future()
        # No task set is needed: the future's callback and the timeout's handle keep
        # the task alive until it ends.
        loop.create_task(self._wait(future, loop.time() + timeout, token))
        self._pending += 1
        return future

    async def _wait(self, future: asyncio.Future[None], deadline: float, token: int) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                await future
        except TimeoutError:
            # A result set in the same loop pass as the timeout wins over it.
            if not future.cancelled():
                return
            if future in self._revoked:
                self._revoked.discard(future)
            else:
                self.on_fire(token)
        finally:
            self._pending -= 1

    def cancel(self, handle: asyncio.Future[None]) -> None:
        if handle.done():
            self._revoked.add(handle)
        else:
            handle.set_result(None)

    def pending(self) -> int:
        return self._pending


def make_timers(impl: str, loop: asyncio.AbstractEventLoop, on_fire: FireCallback) -> Timers[Any]:
    kinds: dict[str, type[Timers[Any]]] = {
        "wheel": WheelTimers,
        "pure": WheelTimers,
        "heap": HeapTimers,
        "task": TaskTimers,
        FLOOR: FloorTimers,
    }
    return kinds[impl](loop, on_fire)


# -- purgatories ----------------------------------------------------------------------


class Purgatories(abc.ABC, Generic[Op]):
    """Operations watched under keys; ``on_done(token, expired)`` when one finishes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: DoneCallback) -> None:
        self.loop = loop
        self.on_done = on_done

    @abc.abstractmethod
    def register(self, token: int, keys: Collection[Hashable], timeout: float) -> Op:
        """Kafka's tryCompleteElseWatch: check, watch ``keys``, check again, time it."""

    @abc.abstractmethod
    def force_complete(self, op: Op) -> bool:
        """Complete ``op`` by its condition; True for the one call that did."""

    @abc.abstractmethod
    def cancel(self, op: Op) -> bool:
        """Cancel ``op`` (its completion never runs); True if it was pending."""

    @abc.abstractmethod
    def set_ready(self, op: Op) -> None:
        """Make ``op``'s condition hold (a later check of a key it watches completes it)."""

    @abc.abstractmethod
    def check_and_complete(self, key: Hashable) -> int: ...

    @abc.abstractmethod
    def pending(self) -> int: ...

    def close(self) -> None:
        """Release the loop resources of operations still pending."""


class _WheelOp(ap.DelayedOperation[None]):
    __slots__ = ("ready", "sink", "token")

    def __init__(self, timeout: float, token: int, sink: DoneCallback) -> None:
        super().__init__(timeout)
        self.ready = False
        self.token = token
        self.sink = sink

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> None:
        self.sink(self.token, self.expired)


class WheelPurgatories(Purgatories[_WheelOp]):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: DoneCallback) -> None:
        super().__init__(loop, on_done)
        self.purgatory = ap.Purgatory(
            "bench", tick=TICK, wheel_size=WHEEL_SIZE, purge_interval=PURGE_INTERVAL
        )

    def register(self, token: int, keys: Collection[Hashable], timeout: float) -> _WheelOp:
        return self.purgatory.try_complete_else_watch(_WheelOp(timeout, token, self.on_done), keys)

    def force_complete(self, op: _WheelOp) -> bool:
        return op.force_complete()

    def cancel(self, op: _WheelOp) -> bool:
        return op.cancel()

    def set_ready(self, op: _WheelOp) -> None:
        op.ready = True

    def check_and_complete(self, key: Hashable) -> int:
        return self.purgatory.check_and_complete(key)

    def pending(self) -> int:
        return self.purgatory.num_delayed()

    def close(self) -> None:
        self.purgatory.close()


class FloorPurgatories(Purgatories[_WheelOp]):
    """Makes the wheel's operation object (the user's constructor) and nothing more:
    no check, no timer, no watcher lists, no hooks."""

    def register(self, token: int, keys: Collection[Hashable], timeout: float) -> _WheelOp:
        return _WheelOp(timeout, token, self.on_done)

    def force_complete(self, op: _WheelOp) -> bool:
        return True

    def cancel(self, op: _WheelOp) -> bool:
        op.token = -1  # touch it, as any cancel must
        return True

    def set_ready(self, op: _WheelOp) -> None:
        op.ready = True

    def check_and_complete(self, key: Hashable) -> int:
        return 0

    def pending(self) -> int:
        return 0


class HooksPurgatories(FloorPurgatories):
    """The floor plus what the operation does with no owner: the user's ``try_complete``
    at registration, and to finish ``cancel`` or ``try_complete`` -> ``force_complete``
    -> ``on_complete``. No timer and no watcher lists: the completing check finds its
    operation as the one made ready last, where a purgatory looks its key up."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: DoneCallback) -> None:
        super().__init__(loop, on_done)
        self._ready: _WheelOp | None = None

    def register(self, token: int, keys: Collection[Hashable], timeout: float) -> _WheelOp:
        op = _WheelOp(timeout, token, self.on_done)
        op.try_complete()
        return op

    def force_complete(self, op: _WheelOp) -> bool:
        return op.force_complete()  # the operation's own call, not the floor's constant

    def cancel(self, op: _WheelOp) -> bool:
        return op.cancel()

    def set_ready(self, op: _WheelOp) -> None:
        op.ready = True
        self._ready = op

    def check_and_complete(self, key: Hashable) -> int:
        op = self._ready
        assert op is not None
        return 1 if op.try_complete() else 0


class _BaselineOp:
    __slots__ = ("done", "keys", "ready", "timer", "token")

    def __init__(self, token: int, keys: Collection[Hashable]) -> None:
        self.token = token
        self.keys = keys
        self.done = False
        self.ready = False
        self.timer: asyncio.TimerHandle | asyncio.Future[None] | None = None


class _WatcherPurgatories(Purgatories[_BaselineOp]):
    """Watcher lists shared by the baselines; subclasses add the timing."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: DoneCallback) -> None:
        super().__init__(loop, on_done)
        self._watchers: dict[Hashable, dict[_BaselineOp, None]] = {}
        self._pending = 0

    def register(self, token: int, keys: Collection[Hashable], timeout: float) -> _BaselineOp:
        op = _BaselineOp(token, keys)
        self._pending += 1
        if op.ready and self.force_complete(op):
            return op
        watchers = self._watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                ops = watchers[key] = {}
            ops[op] = None
        if op.ready and self.force_complete(op):
            return op
        self._start_timer(op, timeout)
        return op

    @abc.abstractmethod
    def _start_timer(self, op: _BaselineOp, timeout: float) -> None: ...

    def set_ready(self, op: _BaselineOp) -> None:
        op.ready = True

    def check_and_complete(self, key: Hashable) -> int:
        ops = self._watchers.get(key)
        if not ops:
            return 0
        completed = 0
        for op in list(ops):
            if op.ready and self.force_complete(op):
                completed += 1
        return completed

    def pending(self) -> int:
        return self._pending

    def _leave(self, op: _BaselineOp) -> None:
        self._pending -= 1
        watchers = self._watchers
        for key in op.keys:
            ops = watchers[key]
            del ops[op]
            if not ops:
                del watchers[key]

    def _finish(self, op: _BaselineOp, expired: bool) -> None:
        self._leave(op)
        self.on_done(op.token, expired)


class HeapPurgatories(_WatcherPurgatories):
    def _start_timer(self, op: _BaselineOp, timeout: float) -> None:
        op.timer = self.loop.call_later(timeout, self._expire, op)

    def force_complete(self, op: _BaselineOp) -> bool:
        if not self._stop(op):
            return False
        self._finish(op, False)
        return True

    def cancel(self, op: _BaselineOp) -> bool:
        if not self._stop(op):
            return False
        self._leave(op)
        return True

    def _stop(self, op: _BaselineOp) -> bool:
        """Mark ``op`` done and cancel its handle; False if it was done already."""
        if op.done:
            return False
        op.done = True
        if op.timer is not None:
            op.timer.cancel()
        return True

    def _expire(self, op: _BaselineOp) -> None:
        op.done = True  # a completed operation's handle was cancelled and never runs
        self._finish(op, True)


class TaskPurgatories(_WatcherPurgatories):
    def _start_timer(self, op: _BaselineOp, timeout: float) -> None:
        loop = self.loop
        future: asyncio.Future[None] = loop.create_future()
        op.timer = future
        loop.create_task(self._wait(op, future, loop.time() + timeout))

    async def _wait(self, op: _BaselineOp, future: asyncio.Future[None], deadline: float) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                await future
        except TimeoutError:
            if not op.done:
                op.done = True
                self._finish(op, True)

    def force_complete(self, op: _BaselineOp) -> bool:
        if op.done:
            return False
        op.done = True
        future = cast("asyncio.Future[None] | None", op.timer)
        # Done already if the timeout fired but the task has not run since: this
        # completion still wins, as the task sees ``op.done``.
        if future is not None and not future.done():
            future.set_result(None)  # its task then ends
        self._finish(op, False)
        return True

    def cancel(self, op: _BaselineOp) -> bool:
        if op.done:
            return False
        op.done = True
        future = cast("asyncio.Future[None] | None", op.timer)
        if future is not None and not future.done():
            future.set_result(None)
        self._leave(op)
        return True


def make_purgatories(
    impl: str, loop: asyncio.AbstractEventLoop, on_done: DoneCallback
) -> Purgatories[Any]:
    kinds: dict[str, type[Purgatories[Any]]] = {
        "wheel": WheelPurgatories,
        "pure": WheelPurgatories,
        "heap": HeapPurgatories,
        "task": TaskPurgatories,
        FLOOR: FloorPurgatories,
        HOOKS: HooksPurgatories,
    }
    return kinds[impl](loop, on_done)
