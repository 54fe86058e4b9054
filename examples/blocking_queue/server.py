"""Blocking pop over TCP: a line protocol whose BPOP waits in a purgatory.

    python examples/blocking_queue/server.py --host 127.0.0.1 --port 7000

One command per line (UTF-8), one reply line per command, in order:

    PUSH queue value    -> OK                  (value: the rest of the line)
    BPOP queue timeout  -> VALUE value, or NIL once timeout seconds pass (0: no limit)
    STATS               -> OK {"pending": 0, ...}   the purgatory's counts as JSON
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
from typing import Final

import aiopurgatory as ap

MAX_LINE: Final = 64 * 1024
"""Longest command line, in bytes."""

MAX_QUEUED: Final = 1000
"""Commands a client may send ahead of their replies before it is disconnected."""

USAGE: Final = {
    "PUSH": "PUSH queue value",
    "BPOP": "BPOP queue timeout",
    "STATS": "STATS",
}


class Pop(ap.DelayedOperation[str | None]):
    """Takes the first value of a queue; the result is None if the timeout passes."""

    __slots__ = ("name", "queues", "value")

    def __init__(self, queues: dict[str, deque[str]], name: str, timeout: float | None) -> None:
        super().__init__(timeout)
        self.queues = queues
        self.name = name
        self.value: str | None = None

    def try_complete(self) -> bool:
        queue = self.queues.get(self.name)
        if not queue:
            return False
        self.value = queue.popleft()
        if not queue:
            del self.queues[self.name]
        return self.force_complete()

    def on_complete(self) -> str | None:
        return self.value


class QueueServer:
    """The queues and the purgatory of waiting BPOPs, shared by every connection."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[str]] = {}
        self.purgatory = ap.Purgatory("bpop")
        self.connections: dict[Connection, asyncio.Task[None]] = {}

    def push(self, name: str, value: str) -> None:
        self.queues.setdefault(name, deque()).append(value)
        # Synchronously, not notify(): the oldest waiter takes the value before a
        # BPOP arriving later can, which is what makes waiters first come, first served.
        # One value wakes one waiter: limit=1 stops at the first that takes it.
        self.purgatory.check_and_complete(name, limit=1)

    def pop(self, name: str, timeout: float | None) -> Pop:
        return self.purgatory.try_complete_else_watch(Pop(self.queues, name, timeout), [name])

    async def serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
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
    once. Commands sent before the hang-up still run, as in Redis, but none waits.
    """

    def __init__(
        self, server: QueueServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        # A line, a line too long to read (ValueError), or None: no more lines.
        self.lines: asyncio.Queue[bytes | ValueError | None] = asyncio.Queue()
        self.hung_up = False
        self.waiting: Pop | None = None

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
            self.writer.close()

    async def _read_lines(self) -> None:
        while self.lines.qsize() < MAX_QUEUED:
            try:
                line = await self.reader.readline()
            except ValueError as exc:  # over MAX_LINE; readline has dropped it
                self.lines.put_nowait(exc)
                continue
            except ConnectionError:
                return
            if not line:
                return
            self.lines.put_nowait(line)

    async def _run_commands(self) -> None:
        while (line := await self.lines.get()) is not None:
            reply = await self._execute(line)
            self.writer.write(reply.encode() + b"\n")
            try:
                await self.writer.drain()
            except ConnectionError:
                return

    async def _execute(self, line: bytes | ValueError) -> str:
        if isinstance(line, ValueError):
            return f"ERR line longer than {MAX_LINE} bytes"
        try:
            text = line.decode("utf-8").rstrip("\r\n")
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
                    popped = await self._bpop(name, _parse_timeout(timeout))
                    return "NIL" if popped is None else f"VALUE {popped}"
                case ["STATS"]:
                    return "OK " + json.dumps(dataclasses.asdict(self.server.purgatory.stats))
                case [name, *_] if name in USAGE:
                    return f"ERR usage: {USAGE[name]}"
                case _:
                    return f"ERR unknown command {words[0]!r}"
        except ValueError as exc:
            return f"ERR {exc}"
        except ap.PurgatoryClosed:
            return "ERR the server is shutting down"

    async def _bpop(self, name: str, timeout: float | None) -> str | None:
        op = self.server.pop(name, timeout)
        if self.hung_up:  # nobody is left to wait for an answer
            op.cancel()
        self.waiting = op
        try:
            # If the hang-up cancels op, this raises CancelledError and ends the worker.
            return await op
        finally:
            self.waiting = None


def _parse_timeout(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0, got {text!r}")
    return seconds or None  # 0 waits without a limit, as in Redis


async def serve(host: str, port: int) -> None:
    queue_server = QueueServer()
    server = await asyncio.start_server(queue_server.serve_client, host, port, limit=MAX_LINE)
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
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
