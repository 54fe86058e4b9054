"""Blocking pop over TCP: a line protocol whose BPOP waits in a purgatory.

    python examples/blocking_queue/server.py --host 127.0.0.1 --port 7000

One command per line (UTF-8), one reply line per command, in order:

    PUSH queue value    -> OK                  (value: the rest of the line), or ERR
                           when storing it would pass a limit (nothing is stored)
    BPOP queue timeout  -> VALUE value, or NIL once timeout seconds pass (0: no limit)
    STATS               -> OK {"pending": 0, ...}   the purgatory's and the store's
                           counts as JSON
    anything else       -> ERR reason          (the connection stays usable)

Like Redis BLPOP: BPOP answers as soon as the queue has a value, and clients
waiting on one queue are served first come, first served. A client that hangs up
while its BPOP waits leaves nothing behind.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import signal
from collections import deque
from dataclasses import dataclass, fields
from typing import Final

import aiopurgatory as ap


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server holds at most; every field is a command-line option."""

    max_line: int = 64 * 1024
    """Longest command line in bytes; a longer one is refused whole with one ERR."""
    max_queued: int = 1000
    """Commands a client may send ahead of their replies before it is disconnected."""
    max_connections: int = 10_000
    """Open connections at once; more are answered ERR and closed."""
    idle_timeout: float = 300.0
    """Seconds a connection may stay silent with no command running before it is closed."""
    max_timeout: float = 3600.0
    """Cap on a BPOP's timeout in seconds (0, no limit, waits this long too)."""
    max_queue_values: int = 100_000
    """Values one queue holds; a PUSH beyond gets ERR."""
    max_stored_bytes: int = 64 * 1024 * 1024
    """Bytes held across all queues: each value's UTF-8 bytes plus VALUE_OVERHEAD,
    each queue's name plus QUEUE_OVERHEAD; a PUSH beyond gets ERR."""
    max_queues: int = 10_000
    """Queues holding values at once; a PUSH creating one more gets ERR. A queue
    emptied by BPOPs is forgotten, so it stops counting."""

    def __post_init__(self) -> None:
        for name in (
            "max_line",
            "max_queued",
            "max_connections",
            "max_queue_values",
            "max_stored_bytes",
            "max_queues",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_line > 16 * 1024 * 1024:
            raise ValueError(f"max_line must be at most 16 MiB, got {self.max_line}")
        for name in ("idle_timeout", "max_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 86_400 * 365):
                raise ValueError(f"{name} must be seconds in (0, 1 year], got {value!r}")
        # The longest line's value must fit an empty server, or some PUSH never could.
        smallest = self.max_line + VALUE_OVERHEAD + QUEUE_OVERHEAD
        if self.max_stored_bytes < smallest:
            raise ValueError(
                f"max_stored_bytes must be at least max_line + {VALUE_OVERHEAD + QUEUE_OVERHEAD}"
                f" ({smallest}), got {self.max_stored_bytes}"
            )


VALUE_OVERHEAD: Final = 128
"""Bytes charged per stored value besides its text (the str object, its deque slot),
so that a flood of tiny values is bounded by max_stored_bytes too."""

QUEUE_OVERHEAD: Final = 1024
"""Bytes charged per queue besides its name (an empty deque is about 600 bytes, plus
its dict entry), so that many one-value queues are bounded too."""

TOO_LONG: Final = b"\0too long"
"""Queued in place of a line longer than max_line (compared by identity)."""

USAGE: Final = {
    "PUSH": "PUSH queue value",
    "BPOP": "BPOP queue timeout",
    "STATS": "STATS",
}


class StoreFull(ValueError):
    """A PUSH that would take the store past one of its limits; nothing was stored."""


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


class Store:
    """The queues' values, within ``limits``, and what they are charged.

    A queue exists while it holds a value: the pop taking its last value forgets it,
    so a queue emptied by BPOPs no longer counts against ``max_queues`` (nor its name
    against ``max_stored_bytes``). Waiting BPOPs are not in the store at all.
    """

    __slots__ = ("limits", "queues", "stored_bytes", "values")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.queues: dict[str, deque[str]] = {}
        self.values = 0
        self.stored_bytes = 0

    def append(self, name: str, value: str) -> None:
        """Store ``value`` last in queue ``name``, whatever the limits (see push)."""
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = deque()
            self.stored_bytes += _utf8_len(name) + QUEUE_OVERHEAD
        queue.append(value)
        self.values += 1
        self.stored_bytes += _utf8_len(value) + VALUE_OVERHEAD

    def take(self, name: str) -> str | None:
        """The first value of queue ``name`` (removed), or None if it has none."""
        queue = self.queues.get(name)
        if not queue:
            return None
        return self._remove(name, queue, queue.popleft())

    def retract(self, name: str) -> None:
        """Undo the last append to queue ``name``."""
        queue = self.queues[name]
        self._remove(name, queue, queue.pop())

    def _remove(self, name: str, queue: deque[str], value: str) -> str:
        self.values -= 1
        self.stored_bytes -= _utf8_len(value) + VALUE_OVERHEAD
        if not queue:  # forgotten: it frees its place among max_queues
            del self.queues[name]
            self.stored_bytes -= _utf8_len(name) + QUEUE_OVERHEAD
        return value

    def excess(self, name: str) -> str | None:
        """Why the store, just appended to in queue ``name``, is past a limit; or None."""
        limits = self.limits
        queue = self.queues.get(name)
        if queue is None:
            return None
        if len(self.queues) > limits.max_queues:  # the append created this one
            return f"too many queues (at most {limits.max_queues})"
        if len(queue) > limits.max_queue_values:
            return f"queue {name!r} is full (at most {limits.max_queue_values} values)"
        if self.stored_bytes > limits.max_stored_bytes:
            return f"the server is full (at most {limits.max_stored_bytes} bytes stored)"
        return None

    def counts(self) -> dict[str, int]:
        return {
            "queues": len(self.queues),
            "values": self.values,
            "stored_bytes": self.stored_bytes,
        }


class Pop(ap.DelayedOperation[str | None]):
    """Takes the first value of a queue; the result is None if the timeout passes."""

    __slots__ = ("name", "store", "value")

    def __init__(self, store: Store, name: str, timeout: float | None) -> None:
        super().__init__(timeout)
        self.store = store
        self.name = name
        self.value: str | None = None

    def try_complete(self) -> bool:
        value = self.store.take(self.name)
        if value is None:
            return False
        self.value = value
        return self.force_complete()

    def on_complete(self) -> str | None:
        return self.value


class QueueServer:
    """The queues and the purgatory of waiting BPOPs, shared by every connection."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.store = Store(self.limits)
        self.purgatory = ap.Purgatory("bpop")
        self.connections: dict[Connection, asyncio.Task[None]] = {}

    def push(self, name: str, value: str) -> None:
        """Append ``value`` to queue ``name`` and wake its oldest waiter; raises
        StoreFull, storing nothing, if the value would stay past a limit."""
        store = self.store
        # Appended before the check, which a waiter's pop needs; a value that a waiter
        # takes at once is never stored, so it passes even when the store is full
        # (while a BPOP waits on a queue, the queue is empty: the value goes to it).
        store.append(name, value)
        try:
            # Synchronously, not notify(): the oldest waiter takes the value before a
            # BPOP arriving later can, which is what makes waiters first come, first
            # served. One value wakes one waiter: limit=1 stops at the first that takes it.
            self.purgatory.check_and_complete(name, limit=1)
        except BaseException:  # closed: nothing is stored after shutting down
            store.retract(name)
            raise
        # Still stored (nobody waited), hence last in its queue: over a limit, undone.
        excess = store.excess(name)
        if excess is not None:
            store.retract(name)
            raise StoreFull(excess)

    def pop(self, name: str, timeout: float | None) -> Pop:
        return self.purgatory.try_complete_else_watch(Pop(self.store, name, timeout), [name])

    async def serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(self.connections) >= self.limits.max_connections:
            writer.write(b"ERR too many connections\n")
            writer.close()
            return
        connection = Connection(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self.connections[connection] = task
        try:
            await connection.serve()
        finally:
            del self.connections[connection]

    async def shutdown(self) -> None:
        """Answer every waiting BPOP, finish the commands read so far, hang up."""
        self.purgatory.close()
        for connection in self.connections:
            connection.reader.feed_eof()
        tasks = list(self.connections.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=5.0)
            for connection, task in list(self.connections.items()):
                if task in late:  # a client that does not read its replies
                    connection.writer.transport.abort()


class Connection:
    """One client. Its lines are read as they arrive and run in order by a worker.

    Reading ahead of the worker is what notices a hang-up while a BPOP waits: the
    waiting operation is then cancelled, which takes it out of the purgatory at
    once, and answered NIL (a client that only half-closed still reads its replies).
    Commands sent before the end still run, as in Redis, but none waits.
    """

    def __init__(
        self, server: QueueServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        # A line, TOO_LONG (a line refused whole), or None: no more lines.
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0
        """Bytes of the queued lines: at most 4 * max_line, else the client is cut off."""
        self.hung_up = False
        self.waiting: Pop | None = None
        self.busy = False
        """The worker is running a command."""
        self._idle = asyncio.get_running_loop().call_later(
            self.limits.idle_timeout, self._idle_check
        )

    async def serve(self) -> None:
        worker = asyncio.create_task(self._run_commands())
        try:
            await self._read_lines()
        finally:
            self.hung_up = True
            if self.waiting is not None:
                self.waiting.cancel()
            self.lines.put_nowait(None)
            await asyncio.wait([worker])
            self._idle.cancel()
            self.writer.close()

    def _touch(self) -> None:
        self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(
            self.limits.idle_timeout, self._idle_check
        )

    def _idle_check(self) -> None:
        """Silent for idle_timeout: closed unless a command is running or queued."""
        if self.busy or not self.lines.empty():
            self._touch()
            return
        self.writer.transport.abort()

    async def _read_lines(self) -> None:
        reader = self.reader
        discarding = False  # inside a line too long: dropped up to its newline
        limits = self.limits
        while self.lines.qsize() < limits.max_queued and self.queued_bytes <= 4 * limits.max_line:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                # Over max_line: drop what is buffered and the rest up to the newline,
                # answer one ERR for the whole line; nothing of it ever runs.
                await reader.readexactly(exc.consumed)
                if not discarding:
                    self.lines.put_nowait(TOO_LONG)
                    discarding = True
                self._touch()
                continue
            except asyncio.IncompleteReadError as exc:  # the end, maybe mid-line
                if exc.partial and not discarding:
                    self.lines.put_nowait(exc.partial)  # a last line without newline
                return
            except ConnectionError:
                return
            self._touch()
            if discarding:
                discarding = False  # this was the tail of the long line
                continue
            self.queued_bytes += len(line)
            self.lines.put_nowait(line)

    async def _run_commands(self) -> None:
        while (line := await self.lines.get()) is not None:
            self.queued_bytes -= len(line) if line is not TOO_LONG else 0
            self.busy = True
            try:
                reply = await self._execute(line)
            finally:
                self.busy = False
            self._touch()
            self.writer.write(reply.encode() + b"\n")
            try:
                await self.writer.drain()
            except ConnectionError:
                return

    async def _execute(self, line: bytes) -> str:
        if line is TOO_LONG:
            return f"ERR line longer than {self.limits.max_line} bytes"
        try:
            text = line.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            return "ERR line is not valid UTF-8"
        words = text.split(maxsplit=2)
        if not words:
            return "ERR empty line"
        command = words[0].upper()
        try:
            match [command, *words[1:]]:
                case ["PUSH", name, value]:
                    self.server.push(name, value)
                    return "OK"
                case ["BPOP", name, timeout]:
                    seconds = _parse_timeout(timeout, self.limits.max_timeout)
                    popped = await self._bpop(name, seconds)
                    return "NIL" if popped is None else f"VALUE {popped}"
                case ["STATS"]:
                    counts = dataclasses.asdict(self.server.purgatory.stats)
                    return "OK " + json.dumps(counts | self.server.store.counts())
                case [name, *_] if name in USAGE:
                    return f"ERR usage: {USAGE[name]}"
                case _:
                    return f"ERR unknown command {words[0]!r}"
        except ValueError as exc:
            return f"ERR {exc}"
        except ap.PurgatoryClosed:
            return "ERR the server is shutting down"

    async def _bpop(self, name: str, timeout: float) -> str | None:
        op = self.server.pop(name, timeout)
        if self.hung_up:  # the client sent its last line: nothing waits
            op.cancel()
        self.waiting = op
        try:
            return await op
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if op.cancelled() and task is not None and not task.cancelling():
                return None  # cancelled by the end of the input: NIL
            raise
        finally:
            self.waiting = None


def _parse_timeout(text: str, cap: float) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0, got {text!r}")
    # 0 waits without a limit, as in Redis: here up to the cap, as huge timeouts do.
    return min(seconds or cap, cap)


async def serve(host: str, port: int, limits: Limits | None = None) -> None:
    limits = limits or Limits()
    queue_server = QueueServer(limits)
    # limit: the stream buffers about twice max_line at most before it stops reading.
    server = await asyncio.start_server(
        queue_server.serve_client, host, port, limit=limits.max_line, backlog=1024
    )
    bound_port = server.sockets[0].getsockname()[1]
    print(f"blocking-queue server listening on {host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        await queue_server.shutdown()
        await server.wait_closed()
    print(f"stopped: {queue_server.purgatory.stats}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Blocking-pop TCP server on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7000, help="0 picks a free port")
    docs = {
        "max_line": "longest command line in bytes; longer ones are refused whole",
        "max_queued": "commands sent ahead of their replies before the client is cut off",
        "max_connections": "open connections at once (more get ERR and are closed)",
        "idle_timeout": "seconds a silent connection with no command running stays open",
        "max_timeout": "cap on a BPOP's timeout in seconds (0 waits this long)",
        "max_queue_values": "values one queue holds (a PUSH beyond gets ERR)",
        "max_stored_bytes": (
            f"bytes held across all queues, {VALUE_OVERHEAD} charged per value and"
            f" {QUEUE_OVERHEAD} per queue besides their text (a PUSH beyond gets ERR)"
        ),
        "max_queues": "queues holding values at once (a PUSH creating one more gets ERR)",
    }
    for field in fields(Limits):
        default = field.default
        assert isinstance(default, int | float)
        option = "--" + field.name.replace("_", "-")
        help = f"{docs[field.name]} (default {default})"
        parser.add_argument(option, type=type(default), default=default, help=help)
    args = parser.parse_args()
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    try:
        limits = Limits(**{field.name: getattr(args, field.name) for field in fields(Limits)})
    except ValueError as exc:
        parser.error(str(exc).replace("_", "-"))
    asyncio.run(serve(args.host, args.port, limits))


if __name__ == "__main__":
    main()
