"""Ready-made operations for callers who would rather not subclass."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from .operation import DelayedOperation

__all__ = ["DelayedFuture", "PredicateOperation"]

T = TypeVar("T")


class PredicateOperation(DelayedOperation[bool]):
    """Completes when ``predicate()`` is true: result True, or False on timeout."""

    __slots__ = ("predicate",)

    def __init__(self, predicate: Callable[[], object], timeout: float | None) -> None:
        if not callable(predicate):
            raise TypeError(f"predicate must be callable, got {predicate!r}")
        super().__init__(timeout)
        self.predicate = predicate

    def try_complete(self) -> bool:
        return bool(self.predicate()) and self.force_complete()

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

    __slots__ = ("futures",)

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
