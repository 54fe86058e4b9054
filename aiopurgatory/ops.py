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
        return not self.expired


class DelayedFuture(DelayedOperation[list[T]], Generic[T]):
    """Completes when every future is done; the result lists their results in order.

    A failed future's exception is raised by ``await`` (the first in order). If the
    timeout passes first, the futures still pending are cancelled and ``TimeoutError``
    is raised.
    Register it with :meth:`Purgatory.watch_futures`, which re-checks it as the
    futures finish.
    """

    __slots__ = ("__weakref__", "futures")

    def __init__(self, futures: Iterable[asyncio.Future[T]], timeout: float | None) -> None:
        super().__init__(timeout)
        self.futures = tuple(futures)

    def try_complete(self) -> bool:
        return all(f.done() for f in self.futures) and self.force_complete()

    def on_complete(self) -> list[T]:
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
