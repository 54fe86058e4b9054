"""The blocking-queue example's line-protocol client, for its tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anyio

SERVER = "examples/blocking_queue/server.py"


class Client:
    """A line-protocol client over one TCP connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, line: bytes | str) -> None:
        self.writer.write((line.encode() if isinstance(line, str) else line) + b"\n")
        await self.writer.drain()

    async def reply(self) -> str:
        with anyio.fail_after(10):
            return (await self.reader.readline()).decode().rstrip("\n")

    async def call(self, line: bytes | str) -> str:
        await self.send(line)
        return await self.reply()

    async def stats(self) -> dict[str, Any]:
        reply = await self.call("STATS")
        assert reply.startswith("OK ")
        stats: dict[str, Any] = json.loads(reply[3:])
        return stats

    async def stats_when(self, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The server's counts once ``condition`` holds (fails after 5 s)."""
        with anyio.fail_after(5):
            while not condition(current := await self.stats()):  # noqa: ASYNC110
                await anyio.sleep(0.01)  # the server is another process: nothing to wait on
        return current

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
