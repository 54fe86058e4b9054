"""Both long-poll examples as several worker processes on one port, joined by Redis.

A real redis-server (tests/support/redis_server.py) and real clients over loopback: each
connection goes to whichever worker the kernel hands it to, so the polls of a test
land on several workers and the POST that must wake them on one of them; /stats says
which worker answered (its process id).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from ..support import servers
from ..support.long_poll_redis import (
    GUIDE_WORKER,
    SCRIPTS,
    WORKERS,
    Workers,
    all_connected,
    fresh_connections,
    park,
    poll,
    post,
    start_guide_worker,
    start_workers,
    stop_workers,
    worker_stats,
)
from ..support.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture, imported to be found by pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # The servers run their own loops in their own processes; the clients' loop does
    # not matter, and running every multi-process test twice would double the time.
    return "asyncio"


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redis(redis_server: RedisServer) -> RedisServer:
    """The module's server, running (a test may have stopped or frozen it)."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.proc = None
        redis_server.start()
    redis_server.thaw()
    return redis_server


@pytest.fixture(scope="module", params=["aiohttp", "asgi"])
def workers(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Workers]:
    server = start_workers(request.param, redis_server.url)
    try:
        yield server
    finally:
        stop_workers(server)


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["aiohttp", "asgi", "uvicorn"])
async def test_a_post_on_one_worker_wakes_polls_on_the_others(
    kind: str, redis: RedisServer, topic: str
) -> None:
    server = start_workers(kind, redis.url)
    try:
        async with fresh_connections() as session:
            latest = await worker_stats(session, server, all_connected)
            assert len(server.pids) == WORKERS  # distinct processes
            assert server.process.pid not in server.pids  # workers, not the parent
            # A burst of connections may all go to the worker that wakes first (its
            # accept loop takes the whole backlog): park more until two workers hold
            # polls, so that whichever one the POST lands on, another must be woken
            # through Redis.
            polls: list[asyncio.Task[tuple[int, Any]]] = []
            for _ in range(8):
                more, latest = await park(session, server, topic, 10, len(polls))
                polls += more
                holding = [pid for pid, s in latest.items() if s["pending"]]
                if len(holding) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert len(holding) >= 2, latest
            started = time.monotonic()
            assert await post(session, server, topic, "hello") == 0
            results = await asyncio.wait_for(asyncio.gather(*polls), 10)
            woken = time.monotonic() - started
            expected = {"messages": [{"offset": 0, "value": "hello"}]}
            assert results == [(200, expected)] * len(polls)
            print(
                f"\n{kind}: {len(polls)} polls over {len(holding)} workers woken in"
                f" {woken * 1000:.1f} ms"
            )
            # A POST's offset is readable by a GET on any worker once the POST answered.
            for n in range(1, 21):
                assert await post(session, server, topic, f"m{n}") == n
                status, body = await poll(session, server, topic, after=n - 1, timeout=0)
                assert (status, body) == (200, {"messages": [{"offset": n, "value": f"m{n}"}]})
            stats = await worker_stats(session, server, lambda s: len(s) == WORKERS)
            assert all(s["pending"] == s["watched"] == 0 for s in stats.values())
    finally:
        stop_workers(server)


async def test_thousands_of_parked_polls_use_a_handful_of_redis_connections(
    workers: Workers, redis: RedisServer, topic: str
) -> None:
    count = 2000
    async with fresh_connections() as session:
        await worker_stats(session, workers, all_connected)
        polls, latest = await park(session, workers, topic, count)
        assert len([s for s in latest.values() if s["pending"]]) >= 2, latest
        clients = redis.clients()
        subscribers = [c for c in clients if int(c.get("sub", 0)) or int(c.get("ssub", 0))]
        assert len(subscribers) == WORKERS  # one per worker, whatever the number of polls
        pool_size = 4  # the servers' --redis-pool default
        assert len(clients) <= WORKERS * (1 + pool_size), clients
        started = time.monotonic()
        await post(session, workers, topic, "to all")
        results = await asyncio.wait_for(asyncio.gather(*polls), 20)
        woken = time.monotonic() - started
        assert {status for status, _ in results} == {200}
        print(
            f"\n{workers.kind}: {count} parked polls over {WORKERS} workers,"
            f" {len(clients)} Redis connections ({len(subscribers)} subscribers);"
            f" one POST woke them all in {woken * 1000:.0f} ms"
        )


async def test_stats_say_which_worker_answered(workers: Workers, redis: RedisServer) -> None:
    async with fresh_connections() as session:
        latest = await worker_stats(session, workers, all_connected)
    for pid, stats in latest.items():
        assert stats["worker"] == pid
        assert stats["fanout"]["connected"]
        assert stats["fanout"]["channels"] == 16
        assert stats["fanout"]["attached"] == 1


def test_load_script_against_the_workers_loses_nothing(workers: Workers) -> None:
    """Clients following their topics' offsets, each poll on whichever worker: every
    message seen, no gap, hang-ups cleaned up."""
    command = [sys.executable, "examples/long_poll/load.py", "--url", workers.url]
    command += ["--clients", "60", "--duration", "1", "--poll-timeout", "0.3", "--rate", "20"]
    command += ["--ramp-limit", "5"]
    done = subprocess.run(command, cwd=servers.ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(re.findall(r"^(\w[\w ]*?):\s+(\d+)", done.stdout, re.MULTILINE))
    assert int(figures["answered"]) > 0
    assert int(figures["errors"]) == int(figures["lost"]) == 0
    assert int(figures["caught up"]) == 48  # the clients that did not hang up


@pytest.mark.parametrize("kind", ["aiohttp", "asgi", "uvicorn"])
async def test_sigterm_answers_parked_polls_on_every_worker_and_exits(
    kind: str, redis: RedisServer, topic: str
) -> None:
    server = start_workers(kind, redis.url)
    try:
        async with fresh_connections() as session:
            await worker_stats(session, server, all_connected)
            polls, _ = await park(session, server, topic, 40)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*polls), 10)
            assert {status for status, _ in results} == {503}
            while server.process.poll() is None:  # the loop keeps serving our side
                assert time.monotonic() - started < 10, "the server did not exit"
                await asyncio.sleep(0.05)
            assert server.process.returncode == 0
            print(f"\n{kind}: SIGTERM -> exited in {time.monotonic() - started:.2f} s")
    finally:
        stop_workers(server)


@pytest.mark.parametrize("script", sorted(SCRIPTS.values()))
def test_workers_without_redis_are_refused(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, script, "--workers", "2"],
        cwd=servers.ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 2
    assert "--workers above 1 needs --redis" in done.stderr


def test_without_redis_stats_still_name_the_worker() -> None:
    process, url = servers.start_server(SCRIPTS["aiohttp"], r"(http://127\.0\.0\.1:\d+)")
    try:
        stats = httpx.get(f"{url}/stats").json()
        assert stats["worker"] == process.pid
        assert "redis" not in stats
        assert "fanout" not in stats
    finally:
        assert servers.stop_server(process) == 0


# -- the guide's worker (examples/redis_worker/worker.py) ----------------------------------


def test_the_redis_guide_shows_the_worker_it_ships() -> None:
    """The guide's worker is examples/redis_worker/worker.py, word for word (issue 49,
    item 4: the hard part was prose)."""
    guide = (servers.ROOT / "docs" / "guides" / "redis.md").read_text()
    shipped = (servers.ROOT / GUIDE_WORKER).read_text()
    marker = (
        f"<!-- not run: {GUIDE_WORKER}, two of them run by tests/examples/{Path(__file__).name} -->"
    )
    assert f"{marker}\n```python\n{shipped}```\n" in guide


async def test_the_guides_worker_two_workers_over_redis(redis: RedisServer) -> None:
    """Two workers of the guide on one Redis: polls parked on one are answered by a POST
    on the other, and a poll racing a POST (its read, then its watch) misses nothing."""
    (a, url_a), (b, url_b) = start_guide_worker(redis.url), start_guide_worker(redis.url)
    name = f"w-{uuid.uuid4().hex[:8]}"
    try:
        async with aiohttp.ClientSession() as session:

            async def get(url: str, after: int) -> dict[str, Any]:
                async with session.get(f"{url}/{name}", params={"after": after}) as reply:
                    assert reply.status == 200, reply.status
                    result: dict[str, Any] = await reply.json()
                    return result

            async def send(url: str, text: str) -> int:
                async with session.post(f"{url}/{name}", data=text.encode()) as reply:
                    assert reply.status == 200, reply.status
                    return int((await reply.json())["offset"])

            began = time.perf_counter()
            parked = [asyncio.ensure_future(get(url_b, 0)) for _ in range(20)]
            await asyncio.sleep(0.3)  # parked: the worker counted and watches them
            assert not any(p.done() for p in parked)
            assert await send(url_a, "hello") == 1
            answers = await asyncio.wait_for(asyncio.gather(*parked), 10.0)
            assert answers == [{"next": 1, "messages": ["hello"]}] * 20
            first = time.perf_counter() - began
            # Races: each poll asks for the message the POST beside it is storing.
            for i in range(1, 31):
                poll = asyncio.ensure_future(get((url_a, url_b)[i % 2], i))
                assert await send((url_b, url_a)[i % 2], f"m{i}") == i + 1
                assert await asyncio.wait_for(poll, 10.0) == {"next": i + 1, "messages": [f"m{i}"]}
            print(f"\nthe guide's two workers: 20 polls answered {first:.2f} s after the start")
    finally:
        servers.stop_server(a)
        servers.stop_server(b)
