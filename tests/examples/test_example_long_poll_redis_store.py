"""The long-poll examples' Redis store (examples/long_poll/redis_topics.py) in this
process, against a real redis-server (tests/support/redis_server.py): what Redis holds under
the byte limit, the offsets a GET may ask for, and both servers' apps in Redis mode
driven in-process (aiohttp's test server, Starlette's TestClient).

The multi-process behaviour (workers on one port) is in test_example_long_poll_redis.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestClient as AiohttpClient
from aiohttp.test_utils import TestServer
from starlette.testclient import TestClient

import aiopurgatory as ap

from ..support.helpers import watchdog
from ..support.redis_server import RedisServer, fresh, redis_server

__all__ = ["redis_server"]  # the fixture, imported to be found by pytest

pytestmark = pytest.mark.anyio

# Imported by name, as in test_example_long_poll_redis.
redis_topics: Any = importlib.import_module("examples.long_poll.redis_topics")
topics: Any = importlib.import_module("examples.long_poll.topics")
aiohttp_server: Any = importlib.import_module("examples.long_poll.server")
asgi_server: Any = importlib.import_module("examples.asgi_long_poll.server")

PREFIX = redis_topics.PREFIX


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    """The module's server, running and empty at the start of each test."""
    return fresh(redis_server)


@asynccontextmanager
async def started(url: str, limits: Any) -> AsyncIterator[tuple[Any, ap.Purgatory]]:
    """A RedisTopics started with its purgatory, as a server's startup does."""
    store = redis_topics.RedisTopics(url, limits, timeout=1.0)
    async with ap.Purgatory("store") as purgatory:
        store.start(purgatory)
        try:
            assert await store.fanout.wait_connected(5.0)
            yield store, purgatory
        finally:
            await store.aclose()


def held_bytes(server: RedisServer) -> dict[str, int]:
    """What each of the store's keys takes in Redis (MEMORY USAGE, every element)."""
    keys = server.command("KEYS", f"{PREFIX}:*")
    assert isinstance(keys, list)
    held = {}
    for key in keys:
        assert isinstance(key, bytes)
        usage = server.command("MEMORY", "USAGE", key, "SAMPLES", "0")
        assert isinstance(usage, int)
        held[key.decode()[:60]] = usage
    return held


async def test_long_topic_names_are_not_stored_per_message(server: RedisServer) -> None:
    """300 one-byte messages to a 7,000-character topic under a 16 KiB limit: Redis
    holds about the limit, plus the name once per topic, not once per message."""
    limit = 16 * 1024
    limits = topics.Limits(max_retained_bytes=limit, max_message_bytes=1024)
    name = "t" * 7000
    count = 300
    async with started(server.url, limits) as (store, purgatory):
        for start in range(0, count, 50):  # 50 at once: the pool pipelines them
            offsets = await asyncio.gather(
                *(store.publish(name, "x", 1) for _ in range(start, start + 50))
            )
            assert sorted(offsets) == list(range(start, start + 50))
        retained = limit // (1 + topics.MESSAGE_OVERHEAD)  # as in memory
        messages = await store.poll(purgatory, name, count - retained - 1, 0.0)
        assert [m["offset"] for m in messages] == list(range(count - retained, count))
        assert await store.poll(purgatory, name, count - retained - 2, 0.0) == messages
    held = held_bytes(server)
    total = sum(held.values())
    print(f"\n{count} messages to a 7,000-character topic, limit {limit}: Redis holds {total}")
    # The messages' share within the limit (their charge covers Redis's overhead), the
    # name a few times (its hash's, its stream's and its sorted set's keys, P:names).
    assert total < limit + 6 * len(name), held


async def test_expired_topics_are_forgotten_in_the_retention_order(server: RedisServer) -> None:
    """Topics that expire leave entries in the order list: dropped without freeing
    twice, then compacted; the bytes retained stay those of the live messages."""
    limit = 20 * (10 + topics.MESSAGE_OVERHEAD)  # 20 messages of 10 bytes
    limits = topics.Limits(max_retained_bytes=limit, max_message_bytes=100, topic_ttl=0.2)
    async with started(server.url, limits) as (store, _purgatory):
        for n in range(15):
            await store.publish("old", f"old-{n:05}", 10)
        await asyncio.sleep(0.3)  # "old" idle past its ttl (Redis's clock)
        for n in range(50):
            await store.publish("new", f"new-{n:05}", 10)
        names = server.command("HGETALL", f"{PREFIX}:names")
        assert isinstance(names, list)
        assert names[1::2] == [b"new"]  # "old" forgotten
        assert server.command("GET", f"{PREFIX}:retained") == str(limit).encode()
        assert server.command("HGET", f"{PREFIX}:h:new", "charged") == str(limit).encode()
        assert server.command("LLEN", f"{PREFIX}:order") == 20
        assert server.command("XLEN", f"{PREFIX}:s:new") == 20
        assert server.command("GET", f"{PREFIX}:forgotten") == b"0"
        assert server.command("EXISTS", f"{PREFIX}:s:old") == 0


# Beyond any offset, up to and past the largest Stream ID (2**64 - 1).
HUGE_AFTERS = [2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, 2**64, 10**30]


@asynccontextmanager
async def aiohttp_app(redis_url: str | None) -> AsyncIterator[AiohttpClient[Any, Any]]:
    """The aiohttp example's app in this process, in Redis mode or in memory."""
    limits = topics.Limits()
    store = None if redis_url is None else redis_topics.RedisTopics(redis_url, limits)
    service = aiohttp_server.LongPollService(limits, store)
    async with AiohttpClient(TestServer(service.app())) as client:
        if store is not None:
            assert await store.fanout.wait_connected(5.0)
        yield client


@pytest.mark.parametrize("mode", ["redis", "memory"])
async def test_a_huge_after_is_a_400_on_the_aiohttp_server(server: RedisServer, mode: str) -> None:
    async with aiohttp_app(server.url if mode == "redis" else None) as client:
        response = await client.post("/topics/t", data=b"m0")
        assert response.status == 200
        for after in HUGE_AFTERS:
            response = await client.get("/topics/t", params={"after": str(after), "timeout": "0"})
            text = await response.text()
            assert (response.status, text) == (
                400,
                f"after must be between -1 and 0 (the last offset), got {after}\n",
            )
            assert "Retry-After" not in response.headers
        # A topic nobody posted to yet: the same answer, with its end (none).
        response = await client.get("/topics/none", params={"after": str(2**64 - 1)})
        assert response.status == 400
        assert "between -1 and -1" in await response.text()


@pytest.mark.parametrize("mode", ["redis", "memory"])
def test_a_huge_after_is_a_400_on_the_asgi_app(redis_server: RedisServer, mode: str) -> None:
    redis_server.command("FLUSHALL")
    redis_url = redis_server.url if mode == "redis" else None
    app = asgi_server.create_app(topics.Limits(), redis=redis_url)
    with watchdog(20.0), TestClient(app) as client:
        assert client.post("/topics/t", content=b"m0").status_code == 200
        for after in HUGE_AFTERS:
            response = client.get("/topics/t", params={"after": str(after), "timeout": "0"})
            assert (response.status_code, response.text) == (
                400,
                f"after must be between -1 and 0 (the last offset), got {after}",
            )
            assert "retry-after" not in response.headers


def test_the_asgi_app_in_redis_mode_starts_again(redis_server: RedisServer) -> None:
    """Two TestClient(app) in a row, as two lifespans of one app: the fanout the first
    shutdown closed is not the one the second startup uses."""
    redis_server.command("FLUSHALL")
    app = asgi_server.create_app(topics.Limits(), redis=redis_server.url)
    for run in range(2):
        with watchdog(20.0), TestClient(app) as client:
            response = client.post("/topics/again", content=f"run {run}".encode())
            assert response.status_code == 200, response.text
            assert response.json() == {"offset": run}
            response = client.get("/topics/again", params={"after": str(run - 1)})
            assert response.json() == {"messages": [{"offset": run, "value": f"run {run}"}]}
            stats = client.get("/stats").json()
            assert stats["fanout"]["attached"] == 1
    assert redis_server.clients() == []  # each run closed what it opened


async def eventually(condition: Any, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout} s"
        await asyncio.sleep(0.002)


async def settled(store: Any) -> None:
    """Until the store's fanout received the wake-up of its first POST and refreshed
    it (with no poll there, a refresh reads nothing: it is over once counted), so that
    this refresh reads nothing a test does next."""
    fanout = store.fanout
    await eventually(lambda: fanout.stats.messages == 1, "the wake-up")
    await eventually(lambda: fanout.stats.refreshes == 1, "its refresh")


async def test_a_post_between_a_gets_read_and_its_watch_wakes_it(server: RedisServer) -> None:
    """A POST on another worker lands after a GET's read, and its wake-up arrives
    before the GET watches: the GET is answered at once, without a second read of
    its own (the fanout refreshed the topic although nobody watched it yet)."""
    limits = topics.Limits()
    async with (
        started(server.url, limits) as (store, purgatory),
        started(server.url, limits) as (other, _),
    ):
        assert await store.publish("race", "m0", 2) == 0
        await settled(store)
        read_after = store._read_after
        rereads: list[list[str]] = []
        refresh = store._refresh

        async def reread(names: list[str]) -> None:
            rereads.append(names)  # only the store's own calls: the fanout has its own
            await refresh(names)

        async def read_then_post(name: str, after: int, *, touch: bool) -> Any:
            result = await read_after(name, after, touch=touch)
            if touch:  # the GET's read, not the one after its wake-up
                received = store.fanout.stats.messages
                assert await other.publish("race", "m1", 2) == 1
                await eventually(lambda: store.fanout.stats.messages > received, "wake-up")
                assert purgatory.watchers_of("race") == 0
            return result

        store._refresh = reread
        store._read_after = read_then_post
        messages = await asyncio.wait_for(store.poll(purgatory, "race", 0, 3.0), 5.0)
        assert messages == [{"offset": 1, "value": "m1"}]
        # And a poll parked the usual way is woken by the refresh alone.
        store._read_after = read_after
        parked = asyncio.ensure_future(store.poll(purgatory, "race", 1, 3.0))
        await eventually(lambda: purgatory.watchers_of("race") == 1, "the poll parked")
        assert await other.publish("race", "m2", 2) == 2
        assert await asyncio.wait_for(parked, 5.0) == [{"offset": 2, "value": "m2"}]
        assert rereads == []


async def test_a_post_lost_while_resubscribing_during_a_gets_read(server: RedisServer) -> None:
    """The subscription drops during a GET's read and a POST lands while it is down
    (its wake-up reaches nobody); the resubscription's re-check runs before the GET
    watches. The GET reads its topic's end once more, and is answered at once."""
    from ..support.long_poll_redis import eval_publish, transaction

    limits = topics.Limits()
    async with started(server.url, limits) as (store, purgatory):
        assert await store.publish("lost", "m0", 2) == 0
        await settled(store)
        read_after = store._read_after

        async def read_then_lose_a_post(name: str, after: int, *, touch: bool) -> Any:
            result = await read_after(name, after, touch=touch)
            if touch:
                connects = store.fanout.stats.connects
                killed, offset = transaction(
                    server, ["CLIENT", "KILL", "TYPE", "pubsub"], eval_publish("lost", "m1")
                )
                assert (killed, offset) == (1, 1)
                await eventually(lambda: store.fanout.stats.connects > connects, "resubscribed")
            return result

        store._read_after = read_then_lose_a_post
        messages = await asyncio.wait_for(store.poll(purgatory, "lost", 0, 3.0), 5.0)
        assert messages == [{"offset": 1, "value": "m1"}]
        assert store.fanout.stats.messages == 1  # m1's wake-up was lost indeed


async def test_aclose_ends_the_housekeeping_even_if_a_command_ate_its_cancellation(
    server: RedisServer,
) -> None:
    """redis-py can turn a cancellation into a ConnectionError, which the housekeeping
    survives by design (Redis failing): aclose must still end it, not wait for ever."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    store = redis_topics.RedisTopics(server.url, topics.Limits(), timeout=1.0)
    async with ap.Purgatory("store") as purgatory:
        store.start(purgatory)
        in_touch = asyncio.Event()

        async def touch(args: list[Any]) -> None:
            in_touch.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise RedisConnectionError("as redis-py's pool does") from None

        store._touch = touch
        assert await store.poll(purgatory, "t", -1, 0.0) is None  # waited: touched after
        await asyncio.wait_for(in_touch.wait(), 5.0)
        # Timed by hand: a wait_for that cancels an aclose which swallows the
        # cancellation and then returns would pass for a success.
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        closing = asyncio.ensure_future(store.aclose())
        done, _ = await asyncio.wait({closing}, timeout=3.0)
        assert done, "aclose hangs"
        closing.result()
        assert loop.time() - started_at < 1.0


@pytest.mark.parametrize("query", ["decode_responses=true", "decode_responses=1"])
def test_the_store_refuses_a_url_that_decodes_replies(query: str) -> None:
    # Its reads and scripts compare Redis's replies as bytes: a decoding URL is refused
    # at construction, with what to remove, rather than misread at the first poll.
    with pytest.raises(ValueError, match="remove decode_responses"):
        redis_topics.RedisTopics(f"redis://127.0.0.1:1/0?{query}", topics.Limits())


@pytest.mark.parametrize("query", ["", "?decode_responses=false", "?decode_responses=no"])
def test_the_store_takes_a_url_that_keeps_bytes(query: str) -> None:
    redis_topics.RedisTopics(f"redis://127.0.0.1:1/0{query}", topics.Limits())
