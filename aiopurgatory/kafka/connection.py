"""Connections: framing, the in-flight byte budget, idle and size limits, the serve loop.

Ground rules: one request at a time per connection, as Kafka processes them (answers
go back in request order; a parked fetch holds only its own connection). Every wait is
bounded by a limit (:class:`~.limits.Limits`): a frame's size, the idle time, the room
in the shared :class:`ByteBudget`. What the request means is the dispatcher's
(:class:`~aiopurgatory.kafka.KafkaBroker`); this module only moves bytes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable

from .limits import Limits

__all__ = [
    "ByteBudget",
    "ClosingConnection",
    "ConnectionState",
    "current_connection",
    "serve_connection",
]


class ByteBudget:
    """Bytes held by requests and answers in flight, over all connections, bounded.

    ``acquire`` waits until the bytes fit, first come first served, at most ``timeout``
    seconds (TimeoutError); a single reservation larger than the whole budget is let
    through alone, so nothing waits forever. Answers (``answer=True``) are served
    before request frames: an answer finishes work already admitted and then frees
    what it holds, a frame admits more, so while answers wait no new request is read
    and the bytes in flight cannot grow past the budget by the requests those answers
    are for.

    The rule that keeps the budget from deadlocking is the caller's: a connection
    holding bytes never waits for more (see ``KafkaBroker._reserve_answer``), so every
    holder is handling, reading or writing, each bounded by its own timeout,
    and releases.
    """

    __slots__ = ("_answers", "_requests", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._answers: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._requests: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, count: int) -> bool:
        return self.used == 0 or self.used + count <= self.limit

    def try_acquire(self, count: int, *, answer: bool = False) -> bool:
        """Take ``count`` bytes if they fit now without passing anyone waiting before
        (every waiter, or only answers for an answer); False otherwise."""
        ahead = self._answers if answer else self._answers or self._requests
        if ahead or not self._fits(count):
            return False
        self.used += count
        return True

    async def acquire(self, count: int, timeout: float | None, *, answer: bool = False) -> None:
        """Take ``count`` bytes, waiting at most ``timeout`` seconds (TimeoutError)."""
        if self.try_acquire(count, answer=answer):
            return
        queue = self._answers if answer else self._requests
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, waiter)
        queue.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException:  # cancelled, or the timeout (itself a cancellation)
            if waiter.done() and not waiter.cancelled():
                self.release(count)  # granted, but nobody will use it
            else:
                # Still queued: leave. (``_grant`` drops the entries of waiters that
                # are done, so a waiter cancelled before it was served may be gone.)
                with contextlib.suppress(ValueError):
                    queue.remove(entry)
                self._grant()  # those behind it may fit now that it left the head
            raise

    def release(self, count: int) -> None:
        self.used -= count
        self._grant()

    def _grant(self) -> None:
        while True:
            queue = self._answers or self._requests
            if not queue:
                return
            count, waiter = queue[0]
            if waiter.done():  # cancelled: it removes nothing more itself
                queue.popleft()
                continue
            if not self._fits(count):
                return
            queue.popleft()
            self.used += count
            waiter.set_result(None)


@dataclasses.dataclass(slots=True)
class ConnectionState:
    """What a connection's handlers share: the client id, the budget it holds."""

    client_id: str = ""
    held: int = 0


current_connection: contextvars.ContextVar[ConnectionState] = contextvars.ContextVar("connection")
"""The state of the connection whose task is running (each connection is a task)."""


class ClosingConnection(Exception):
    """What Kafka answers by closing the connection (a request it cannot parse)."""


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    limits: Limits,
    budget: ByteBudget,
    dispatch: Callable[[bytes], Awaitable[bytes | None]],
) -> None:
    """Read request frames and write what ``dispatch`` answers, until the peer goes.

    Raises ClosingConnection for a frame Kafka would close the connection over,
    TimeoutError when the peer idles or the budget has no room in time, and what the
    stream raises when the peer goes.
    """
    state = ConnectionState()
    current_connection.set(state)  # this connection's task has its own context
    try:
        while True:
            async with asyncio.timeout(limits.idle_seconds):
                size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 8 <= size <= limits.max_request_bytes:
                raise ClosingConnection(f"frame size {size} outside [8, max request bytes]")
            await budget.acquire(size, limits.budget_wait_seconds)
            state.held += size
            async with asyncio.timeout(limits.idle_seconds):
                frame = await reader.readexactly(size)
            response = await dispatch(frame)
            if response is not None:
                writer.write(response)
                # A client that stops reading cannot hold its answer's budget forever.
                async with asyncio.timeout(limits.idle_seconds):
                    await writer.drain()
            del frame, response
            budget.release(state.held)
            state.held = 0
    finally:
        budget.release(state.held)
        state.held = 0
