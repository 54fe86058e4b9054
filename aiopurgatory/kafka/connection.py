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
from typing import Any, Final, Protocol

from .limits import Limits

__all__ = [
    "FRAME_CHUNK",
    "ByteBudget",
    "ClosingConnection",
    "ConnectionState",
    "Gate",
    "current_connection",
    "serve_connection",
]


FRAME_CHUNK: Final = 16 * 1024
"""A request frame up to this many bytes is read in one go, then charged to the budget
whole (the fast path: consumers long-polling send small frames). A larger one is
charged as its bytes arrive. Either way a peer that announces a frame and sends nothing
holds nothing of the budget, so stalled peers cannot keep everyone else waiting."""


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
    holding bytes never waits for more (see ``DataApi._reserve_answer``, and
    :func:`serve_connection` for a frame's pieces and an answer), so every holder is
    handling, reading or writing, each bounded by its own timeout, and releases.

    What is charged: a request frame once its bytes have arrived (a small one whole,
    a large one piece by piece, :data:`FRAME_CHUNK`) until it is decoded, and every
    answer until it is
    written; a request parked in a purgatory holds nothing here (what its operation
    keeps is counted by its own table's limit).
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


class Gate(Protocol):
    """A connection's authentication (SASL: :class:`~.sasl_api.SaslGate`), asked about
    every frame until it is open; then it is out of the way."""

    @property
    def open(self) -> bool:
        """Whether the peer has authenticated: frames go to the dispatcher as they come."""

    def frame_bounds(self) -> tuple[int, int]:
        """The sizes a frame may have while closed (Kafka bounds them tighter then)."""

    async def admit(
        self, frame: bytes, dispatch: Callable[[bytes], Awaitable[bytes | None]]
    ) -> bytes | None:
        """Answer ``frame`` while closed: pass it to ``dispatch`` if it may be served,
        answer it itself (a raw SASL token), or raise ClosingConnection."""


@dataclasses.dataclass(slots=True)
class ConnectionState:
    """What a connection's handlers share: the client id, the budget it holds, its
    gate, and whether it is to close once the answer being sent is written."""

    client_id: str = ""
    held: int = 0
    gate: Gate | None = None
    closing: str | None = None
    """Why the connection closes after this answer (Kafka answers a failed
    authentication, then closes)."""
    close_delay: float = 0.0
    """Seconds between that answer and the close."""
    node: int = 0
    """The node whose listener accepted it (a cluster's nodes answer differently)."""


current_connection: contextvars.ContextVar[ConnectionState] = contextvars.ContextVar("connection")
"""The state of the connection whose task is running (each connection is a task)."""


class ClosingConnection(Exception):
    """What Kafka answers by closing the connection (a request it cannot parse)."""


class _Deadline:
    """One timer for all of a connection's waits, each bounded by ``idle_seconds``.

    ``asyncio.timeout`` arms and cancels a loop timer per wait, three per request; a
    consumer long-polling an idle partition would pay for that on every answer. Here a
    wait only writes down its deadline (:meth:`start`); the one timer, when it fires,
    cancels the task if a wait is past its deadline, and otherwise re-arms at the
    current one. So a timer is armed about once per ``idle_seconds``, not per wait, and
    no wait outlives its deadline: the timer always fires at or before it.
    """

    __slots__ = ("_cancelling", "_handle", "_loop", "_task", "expired", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self._loop = loop
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0
        self.when: float | None = None
        """The running wait's deadline (None: no wait running)."""
        self.expired = False

    def start(self, delay: float) -> None:
        self.when = when = self._loop.time() + delay
        self._cancelling = self._task.cancelling()
        handle = self._handle
        if handle is None or handle.when() > when:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(when, self._fire)

    def stop(self) -> None:
        self.when = None

    def close(self) -> None:
        self.when = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        when = self.when
        if when is None:
            return  # no wait running: the next one arms its own deadline
        if self._loop.time() >= when:
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(when, self._fire)

    def timed_out(self) -> bool:
        """In an ``except CancelledError``: whether the cancellation was the deadline's
        (and no other cancellation is pending), so it is to become TimeoutError."""
        return self.expired and self._task.uncancel() <= self._cancelling


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    limits: Limits,
    budget: ByteBudget,
    dispatch: Callable[[bytes], Awaitable[bytes | None]],
    gate: Gate | None = None,
    node: int = 0,
) -> None:
    """Read request frames and write what ``dispatch`` answers, until the peer goes.

    With a ``gate`` (a SASL listener), every frame goes through it until it is open,
    and the connection has ``limits.auth_deadline_seconds`` from now to open it.

    Raises ClosingConnection for a frame Kafka would close the connection over,
    TimeoutError when the peer idles, does not authenticate in time, or the budget has
    no room in time, and what the stream raises when the peer goes.
    """
    state = ConnectionState(gate=gate, node=node)
    current_connection.set(state)  # this connection's task has its own context
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    deadline = _Deadline(loop, task)
    idle = limits.idle_seconds
    # Until the gate opens every wait is bounded by the authentication deadline too,
    # so a peer that never authenticates is closed then, whatever it sends or not.
    auth_end = None if gate is None else loop.time() + limits.auth_deadline_seconds
    transport = writer.transport

    # Called only while authenticating: once the gate opens, every wait is the idle one
    # and a request pays for no closure call.
    def bound() -> float:
        nonlocal auth_end
        if auth_end is None:
            return idle
        if gate is not None and gate.open:
            auth_end = None
            return idle
        return min(idle, auth_end - loop.time())

    try:
        while True:
            deadline.start(idle if auth_end is None else bound())
            try:
                size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
                closed = None if gate is None or gate.open else gate
                low, high = (
                    (8, limits.max_request_bytes) if closed is None else closed.frame_bounds()
                )
                if not low <= size <= high:
                    raise ClosingConnection(f"frame size {size} outside [{low}, {high}]")
                deadline.stop()
                if size <= FRAME_CHUNK:
                    # Read, then charged: what a peer has not sent holds nothing (the
                    # bytes sit in the stream's buffer either way). The connection
                    # holds nothing while it waits for room (ByteBudget's rule).
                    deadline.start(idle if auth_end is None else bound())
                    frame = await reader.readexactly(size)
                    deadline.stop()
                    if not budget.try_acquire(size):
                        await budget.acquire(size, limits.budget_wait_seconds)
                    state.held += size
                else:
                    deadline.start(idle if auth_end is None else bound())
                    frame = await _read_charged(
                        reader, size, state, budget, limits.budget_wait_seconds
                    )
                    deadline.stop()
                # The coroutine holds the frame, this loop does not: the dispatcher lets
                # it go once decoded (a request parked keeps only what it needs).
                answer = dispatch(frame) if closed is None else closed.admit(frame, dispatch)
                del frame
                response = await answer
                if response is not None:
                    if transport.is_closing():
                        # Closed while the request waited (its node stopped): uvloop
                        # raises RuntimeError on a write to a closed transport.
                        raise ConnectionResetError("closed before its answer was written")
                    # Every answer is charged until written, as its request was: a small
                    # request cannot buy room beyond the budget with a big answer. Never
                    # waiting while holding (ByteBudget's rule): what the connection
                    # holds pays first; if the rest does not fit, it gives all back and
                    # waits for the whole answer among the answers.
                    size = len(response)
                    if size > state.held:
                        if budget.try_acquire(size - state.held, answer=True):
                            state.held = size
                        else:
                            budget.release(state.held)
                            state.held = 0
                            await budget.acquire(size, limits.budget_wait_seconds, answer=True)
                            state.held = size
                    writer.write(response)
                    if transport.get_write_buffer_size():
                        # A client that stops reading cannot hold its answer's budget
                        # forever. (All written already: nothing to wait for.)
                        deadline.start(idle if auth_end is None else bound())
                        await writer.drain()
                        deadline.stop()
                if state.closing is not None:
                    # The answer is written: closing the writer sends it before the FIN.
                    # A pause first lets a client read it before it sees the end of the
                    # stream (kafka-python drops what arrives with the end of a TLS one).
                    if state.close_delay > 0:
                        await asyncio.sleep(state.close_delay)
                    raise ClosingConnection(state.closing)
            except asyncio.CancelledError as exc:
                if deadline.timed_out():
                    raise TimeoutError from exc
                raise
            del answer, response
            budget.release(state.held)
            state.held = 0
    finally:
        deadline.close()
        budget.release(state.held)
        state.held = 0


async def _read_charged(
    reader: asyncio.StreamReader, size: int, state: ConnectionState, budget: ByteBudget, wait: float
) -> bytes:
    """A frame's body of ``size`` bytes, each piece charged to ``budget`` once it has
    arrived (what the peer has not sent holds nothing).

    A piece that does not fit is waited for holding nothing (ByteBudget's rule): the
    connection gives back what it holds and waits, at most ``wait`` seconds, for all it
    has read, among the answers (a frame being read is work admitted, as an answer is),
    so partial frames all waiting for room cannot wait for one another. What has been
    read is then uncounted while it waits, as a fetch's request is while its answer
    waits (``DataApi._reserve_answer``). The caller bounds the whole read (the idle
    deadline): a peer holds what it has sent, no more, and no longer.
    """
    pieces: list[bytes] = []
    got = 0
    while got < size:
        piece = await reader.read(min(size - got, 1 << 20))
        if not piece:
            raise asyncio.IncompleteReadError(b"".join(pieces), size)
        pieces.append(piece)
        got += len(piece)
        if budget.try_acquire(len(piece), answer=state.held > 0):
            state.held += len(piece)
        else:
            admitted = state.held > 0
            budget.release(state.held)
            state.held = 0
            await budget.acquire(got, wait, answer=admitted)
            state.held = got
    return b"".join(pieces)
