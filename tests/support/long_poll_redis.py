"""The Redis-backed long-poll examples run as real worker processes (aiohttp and ASGI) in
front of one redis-server or cluster: start and stop them, poll, post, park, and read
their stats.

Shared by the example's test modules (standalone, failures, store, cluster); a worker is
a subprocess, so the tests see what a deployment sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import pytest

from . import servers
from .redis_server import RedisServer, RespValue, free_port, read_reply

SCRIPTS: Final = {
    "aiohttp": "examples/long_poll/server.py",
    "asgi": "examples/asgi_long_poll/server.py",
}

APP: Final = "examples.asgi_long_poll.server:app"

WORKERS: Final = 4

REDIS_TIMEOUT: Final = 2.0
"""--redis-timeout of the servers under test: a POST Redis does not answer gets 503
within about 3 times this. Not lower: with the suite's other workers on the same cores,
a command to a healthy Redis took more than 0.5 s, and then more than 1 s (4 of 2,000
polls got 503 while parking, in a full run on 2 cores)."""

POLL_TIMEOUT: Final = 25.0

# Imported by name: mypy knows the examples as top-level modules (long_poll.*), the
# tests import them from the repository's root (examples.long_poll.*).
redis_topics: Any = importlib.import_module("examples.long_poll.redis_topics")

topics: Any = importlib.import_module("examples.long_poll.topics")


@dataclass
class Workers:
    """A server started with ``--workers``; ``pids`` the workers seen on /stats."""

    kind: str
    process: subprocess.Popen[str]
    url: str
    pids: set[int] = field(default_factory=set)


def start_workers(kind: str, redis_url: str, workers: int = WORKERS) -> Workers:
    """A server as its README documents it: the script with ``--workers N --redis URL``,
    or ``uvicorn APP --workers N`` with ``REDIS_URL`` in the environment."""
    if kind == "uvicorn":
        port = free_port()
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "LONG_POLL_REDIS_OPTIONS": json.dumps({"timeout": REDIS_TIMEOUT}),
        }
        command = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
        process = subprocess.Popen(command, cwd=servers.ROOT, env=env, text=True)
        return Workers(kind, process, f"http://127.0.0.1:{port}")
    options = ["--workers", str(workers), "--redis", redis_url]
    options += ["--redis-timeout", str(REDIS_TIMEOUT), "--max-timeout", str(POLL_TIMEOUT)]
    process, url = servers.start_server(SCRIPTS[kind], r"(http://127\.0\.0\.1:\d+)", *options)
    return Workers(kind, process, url)


def stop_workers(server: Workers) -> int | None:
    """SIGTERM to the parent (it stops its workers); any worker left is killed.
    Returns the parent's exit status (None if it had ended already)."""
    status = None
    try:
        if server.process.poll() is None:
            status = servers.stop_server(server.process)
    finally:
        deadline = time.monotonic() + 5
        for pid in server.pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                pytest.fail(f"worker {pid} outlived its server")
    return status


@contextlib.asynccontextmanager
async def fresh_connections() -> AsyncIterator[aiohttp.ClientSession]:
    """A session opening a connection per request (so the kernel picks a worker each
    time), with no cap on connections at once."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=POLL_TIMEOUT + 10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def worker_stats(
    session: aiohttp.ClientSession,
    server: Workers | Sequence[Workers],
    condition: Callable[[dict[int, dict[str, Any]]], bool],
    timeout: float = 15.0,
) -> dict[int, dict[str, Any]]:
    """GET /stats (a new connection each) of ``server`` (or of every one of several
    servers, all together) until ``condition`` holds on the latest answer of every
    worker seen; returns those answers by worker pid."""
    every = [server] if isinstance(server, Workers) else list(server)
    latest: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while True:
        for one in every:
            try:
                async with session.get(f"{one.url}/stats") as response:
                    if response.status == 200:
                        stats = await response.json()
                        latest[stats["worker"]] = stats
                        one.pids.add(stats["worker"])
            except aiohttp.ClientConnectionError:
                pass  # uvicorn binds once its workers are up
        if condition(latest):
            return latest
        if time.monotonic() > deadline:
            raise AssertionError(f"/stats never met the condition; last seen: {latest}")
        await asyncio.sleep(0.005)


def all_connected(latest: dict[int, dict[str, Any]]) -> bool:
    return len(latest) == WORKERS and all(s["redis"] for s in latest.values())


def parked(count: int) -> Callable[[dict[int, dict[str, Any]]], bool]:
    def condition(latest: dict[int, dict[str, Any]]) -> bool:
        return len(latest) == WORKERS and sum(s["pending"] for s in latest.values()) == count

    return condition


async def poll(
    session: aiohttp.ClientSession, server: Workers, topic: str, after: int = -1, **params: Any
) -> tuple[int, Any]:
    query = {"after": str(after), "timeout": str(POLL_TIMEOUT)}
    query.update({k: str(v) for k, v in params.items()})
    async with session.get(f"{server.url}/topics/{topic}", params=query) as response:
        body = await response.json() if response.status == 200 else None
        return response.status, body


async def post(session: aiohttp.ClientSession, server: Workers, topic: str, text: str) -> int:
    async with session.post(f"{server.url}/topics/{topic}", data=text.encode()) as response:
        assert response.status == 200, await response.text()
        offset: int = (await response.json())["offset"]
        return offset


async def park(
    session: aiohttp.ClientSession, server: Workers, topic: str, count: int, pending_before: int = 0
) -> tuple[list[asyncio.Task[tuple[int, Any]]], dict[int, dict[str, Any]]]:
    """``count`` polls of ``topic``, each on its own connection, parked over the
    workers; returns their tasks and the workers' stats once all wait."""
    polls = [asyncio.create_task(poll(session, server, topic)) for _ in range(count)]
    all_parked = parked(pending_before + count)

    def condition(latest: dict[int, dict[str, Any]]) -> bool:
        early = [task.result() for task in polls if task.done() and not task.exception()]
        if early:  # fail now, not when the others time out
            raise AssertionError(f"{len(early)} polls answered before any POST: {early[:3]}")
        return all_parked(latest)

    try:
        latest = await worker_stats(session, server, condition, 30.0)
    except BaseException:
        for task in polls:
            task.cancel()
        raise
    return polls, latest


def publish_args(topic: str, message: str) -> list[str | bytes | int]:
    """ARGV of the servers' publish script, as a POST runs it (default limits)."""
    from aiopurgatory.redis import RedisFanout

    limits = topics.Limits()
    prefix = redis_topics.PREFIX
    fanout = RedisFanout("redis://127.0.0.1:1/0", prefix=f"{prefix}:wake")
    channel, payload = fanout.message_for(topic)
    return [
        prefix,
        topic,
        message,
        len(message.encode()) + topics.MESSAGE_OVERHEAD,
        limits.max_retained_bytes,
        limits.max_topics,
        int(limits.topic_ttl * 1000),
        "PUBLISH",
        channel,
        payload,
    ]


def eval_publish(topic: str, message: str) -> list[bytes | str | int]:
    return ["EVAL", redis_topics.PUBLISH_LUA, 0, *publish_args(topic, message)]


def transaction(server: RedisServer, *commands: list[Any]) -> list[RespValue]:
    """``commands`` in one MULTI/EXEC on one connection: nothing runs in between."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        parts = []
        for command in [["MULTI"], *commands, ["EXEC"]]:
            parts.append(b"*%d\r\n" % len(command))
            for arg in command:
                data = arg if isinstance(arg, bytes) else str(arg).encode()
                parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        sock.sendall(b"".join(parts))
        reader = sock.makefile("rb")
        replies = [read_reply(reader) for _ in range(len(commands) + 2)]
    result = replies[-1]
    assert isinstance(result, list), replies
    return result


GUIDE_WORKER: Final = "examples/redis_worker/worker.py"
"""The Redis guide's worker, shipped as an example (run as the guide runs it)."""


def start_guide_worker(redis_url: str) -> tuple[subprocess.Popen[str], str]:
    """``python worker.py 0 REDIS_URL`` as the guide runs it; returns it and its URL."""
    process = subprocess.Popen(
        [sys.executable, GUIDE_WORKER, "0", redis_url],
        cwd=servers.ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(servers.ROOT)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the first line, or "" if it died
    match = re.fullmatch(r"listening on (\d+)\n", line)
    if match is None:
        servers.stop_server(process)
        pytest.fail(f"the worker did not report its port: {line!r}")
    return process, f"http://127.0.0.1:{match[1]}"
