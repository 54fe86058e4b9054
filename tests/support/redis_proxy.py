"""A loopback TCP proxy in front of a Redis that drops the connection of any client
sending one of the named commands: the rest passes both ways untouched.

For the failures a real Redis cannot be made to have alone: a worker whose data
commands go through while its wake-ups (PUBLISH, SPUBLISH) fail, as a cluster does
when the topic's list and its channel live on different primaries and only the
channel's primary is down. Runs on the test's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

__all__ = ["CommandDropper", "command_dropper"]


class CommandDropper:
    """A proxy (see :func:`command_dropper`): ``proxy.url`` reaches
    the Redis on ``port`` through the proxy; ``proxy.dropped`` counts the connections
    closed for a named command."""

    def __init__(self, redis_port: int, commands: Iterable[str]) -> None:
        self._redis_port = redis_port
        # A command's name is a bulk string of its own in RESP: "\r\nPUBLISH\r\n".
        self._needles = [f"\r\n{name.upper()}\r\n".encode() for name in commands]
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._done: set[asyncio.Future[None]] = set()
        self.dropped = 0
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}/0"

    async def aclose(self) -> None:
        assert self._server is not None
        self._server.close()
        # Closing every socket ends every pump (a read then sees EOF): no task is
        # cancelled under asyncio's streams, which would log the cancellation.
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._done)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.get_running_loop().create_future()
        self._done.add(done)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._redis_port)
            self._writers.add(up_writer)
            # Either direction ending (EOF, a reset, a dropped command) closes both.
            await asyncio.wait(
                [
                    asyncio.ensure_future(self._pump(reader, up_writer, check=True)),
                    asyncio.ensure_future(self._pump(up_reader, writer, check=False)),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            )
            up_writer.close()
        finally:
            writer.close()
            done.set_result(None)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, check: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):  # RuntimeError: closed
            while chunk := await reader.read(65536):
                if check and any(needle in chunk.upper() for needle in self._needles):
                    self.dropped += 1
                    return  # the client sees its connection closed mid-command
                writer.write(chunk)
                await writer.drain()


@contextlib.asynccontextmanager
async def command_dropper(
    redis_port: int, commands: Iterable[str]
) -> AsyncIterator[CommandDropper]:
    """``async with command_dropper(port, ["PUBLISH"]) as proxy``: the proxy listening."""
    proxy = CommandDropper(redis_port, commands)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
