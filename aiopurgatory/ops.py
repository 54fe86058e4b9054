"""Ready-made operations for callers who would rather not subclass."""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import Callable, Coroutine, Iterable
from typing import Final, Generic, NoReturn, TypeVar

from .operation import DelayedOperation

__all__ = ["DelayedFuture", "PredicateOperation"]

T = TypeVar("T")

_ASYNC_CODE: Final = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class PredicateOperation(DelayedOperation[bool]):
    """Completes when ``predicate()`` is true: result True, or False on timeout.

    The predicate is a plain function: it is called synchronously, on the loop, at
    registration and at each event on the keys. An ``async def`` predicate is refused
    (its coroutine object would always be true and never be awaited).
    :meth:`Purgatory.wait_for <aiopurgatory.Purgatory.wait_for>` makes and awaits one.

    Args:
        predicate: called with no argument; any truthy value completes the operation.
        timeout: seconds from registration until it gives up; None for never.

    Raises:
        TypeError: ``predicate`` is not callable, or is an ``async def`` function (or
            an async generator function); ``timeout`` is neither a number nor None.
        ValueError: ``timeout`` is negative or NaN.
    """

    __slots__ = ("predicate",)

    def __init__(self, predicate: Callable[[], object], timeout: float | None) -> None:
        if not callable(predicate):
            raise TypeError(f"predicate must be callable, got {predicate!r}")
        if _is_async_function(predicate):
            raise TypeError(
                f"predicate must be a plain function returning a truth value, got the async"
                f" function {predicate!r}: it is called synchronously at every event, and"
                " its coroutine would never be awaited. Await elsewhere, then notify the key."
            )
        super().__init__(timeout)
        self.predicate = predicate

    def try_complete(self) -> bool:
        """Call the predicate; complete if it returned a truthy value.

        Returns:
            True if this call completed the operation.

        Raises:
            TypeError: the predicate returned an awaitable or an async generator (an
                async callable that did not look like one); a coroutine is closed so
                that it does not warn. Like anything the predicate raises, it finishes
                the operation: ``await op`` raises it.
        """
        ready = self.predicate()
        if ready is True:
            return self.force_complete()
        if not ready:
            return False
        if inspect.isawaitable(ready) or inspect.isasyncgen(ready):
            self._refuse(ready)  # an async callable that does not look like one
        return self.force_complete()

    def _refuse(self, ready: object) -> NoReturn:
        if isinstance(ready, Coroutine | types.GeneratorType):
            ready.close()  # never started: closing it silences "never awaited"
        raise TypeError(
            f"predicate {self.predicate!r} returned {ready!r}, not a truth value: it must be"
            " a plain function (an async one is called, never awaited)"
        )

    def on_complete(self) -> bool:
        """The result: True when the predicate held, False when the timeout won."""
        return not self.expired


class DelayedFuture(DelayedOperation[list[T]], Generic[T]):
    """Completes when every future is done; the result lists their results in order.

    A failed future's exception is raised by ``await`` (the first in order); a
    cancelled future finishes the operation as cancelled. If the timeout passes first,
    the futures still pending are cancelled and ``TimeoutError`` is raised.
    Register it with :meth:`Purgatory.watch_futures`, which re-checks it as the
    futures finish.

    Args:
        futures: the futures (or tasks) to wait for, kept as a tuple in this order.
        timeout: seconds from registration until it gives up; None for never.

    Raises:
        TypeError: ``timeout`` is neither a number nor None.
        ValueError: ``timeout`` is negative or NaN.
    """

    __slots__ = ("__weakref__", "futures")

    def __init__(self, futures: Iterable[asyncio.Future[T]], timeout: float | None) -> None:
        super().__init__(timeout)
        self.futures = tuple(futures)

    def try_complete(self) -> bool:
        """Complete if every future is done (O(futures) per check).

        Returns:
            True if this call completed the operation.
        """
        return all(f.done() for f in self.futures) and self.force_complete()

    def on_complete(self) -> list[T]:
        """The futures' results, in the order given.

        Raises:
            TimeoutError: on the timeout path, after cancelling the futures not done
                (the message says how many).
            Exception: the first failed future's exception, in the order given.
            asyncio.CancelledError: the first failing future was cancelled.
        """
        unfinished = [future for future in self.futures if not future.done()]
        if unfinished:  # only reachable on the timeout path
            for future in unfinished:
                future.cancel()
            raise TimeoutError(f"{len(unfinished)} of {len(self.futures)} futures not done in time")
        return [future.result() for future in self.futures]


def _is_async_function(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine or an async generator."""
    if type(fn) is types.FunctionType:  # the common case, without inspect's unwrapping
        return bool(fn.__code__.co_flags & _ASYNC_CODE)
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
