"""Both long-poll examples on a real Redis Cluster (3 primaries, 3 replicas), given the
URL of any one node: a topic's keys and its wake-up channel in one hash slot, polls
parked over every primary woken across workers and servers, the connections each node
holds, a primary killed (SIGKILL) and a slot migrated while polls are parked.

The cluster is this module's own (tests/support/redis_cluster.py); the tests that change its
topology put it back (the killed node restarted, the slot moved home).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import aiohttp
import pytest
from redis.crc import key_slot

import aiopurgatory as ap
from aiopurgatory.redis import RedisFanout

from ..support import servers
from ..support.long_poll_redis import (
    REDIS_TIMEOUT,
    Workers,
    fresh_connections,
    poll,
    redis_topics,
    start_workers,
    stop_workers,
    topics,
    worker_stats,
)
from ..support.redis_cluster import RedisCluster, redis_cluster, whole

__all__ = ["redis_cluster"]  # the fixture, imported to be found by pytest

pytestmark = pytest.mark.anyio

PREFIX: Final = redis_topics.PREFIX
SHARDS: Final = 16
WORKERS: Final = 2
POOL_SIZE: Final = 4  # the servers' --redis-pool default
POST_DEADLINE: Final = max(2, REDIS_TIMEOUT) + 2 * REDIS_TIMEOUT + 0.5
"""A POST Redis does not answer gets 503 within this (the store's backstop)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # see test_example_long_poll_redis


@pytest.fixture
def cluster(redis_cluster: RedisCluster) -> RedisCluster:
    """The module's cluster, every node running and the map agreed."""
    return whole(redis_cluster)


def wake_fanout() -> RedisFanout:
    """A fanout named as the servers' (never started: for its channel names)."""
    return RedisFanout("redis://127.0.0.1:1/0", prefix=f"{PREFIX}:wake")


def topics_per_shard(per_shard: int = 1, tag: str = "") -> dict[int, list[str]]:
    """Topic names, ``per_shard`` for each of the 16 shards (hence every primary)."""
    fanout = wake_fanout()
    found: dict[int, list[str]] = {n: [] for n in range(SHARDS)}
    run = uuid.uuid4().hex[:6]
    i = 0
    while any(len(names) < per_shard for names in found.values()):
        name = f"{tag}{run}-{i}"
        i += 1
        shard = fanout.channels.index(fanout.channel_of(name))
        if len(found[shard]) < per_shard:
            found[shard].append(name)
    return found


def group_keys(name: str) -> list[str]:
    """The keys a POST to ``name`` touches on a cluster (its slot group's and its own)."""
    group = f"{PREFIX}:{wake_fanout().hash_tag(name)}"
    fixed = ["topics", "names", "order", "retained", "forgotten", "gens"]
    return [*(f"{group}:{k}" for k in fixed), f"{group}:h:{name}", f"{group}:s:{name}"]


def connections(cluster: RedisCluster) -> dict[int, dict[str, int]]:
    """Per running node (by port): its role, the servers' connections and sharded
    subscribers among them, from CLIENT LIST (the replication links between a primary
    and its replica, flags S and M, are left out, as is this helper's own)."""
    counts = {}
    for node in cluster.nodes:
        if node.proc is None:
            continue
        clients = [c for c in node.clients() if not set(c.get("flags", "")) & {"S", "M"}]
        counts[node.port] = {
            "primary": int(node.role() == "master"),
            "clients": len(clients),
            "ssub": sum(1 for c in clients if int(c.get("ssub", 0))),
        }
    return counts


async def stats_of(
    session: aiohttp.ClientSession,
    servers: list[Workers],
    condition: Callable[[dict[int, dict[str, Any]]], bool],
    timeout: float = 20.0,
) -> dict[int, dict[str, Any]]:
    """/stats of every worker of ``servers`` until all have answered and ``condition``
    holds on the latest answers (by worker pid, all servers together)."""
    return await worker_stats(
        session,
        servers,
        lambda latest: len(latest) == WORKERS * len(servers) and condition(latest),
        timeout,
    )


def subscribed(latest: dict[int, dict[str, Any]]) -> bool:
    return all(s["redis"] and s["fanout"]["subscribers"] == 3 for s in latest.values())


def pending(count: int) -> Callable[[dict[int, dict[str, Any]]], bool]:
    return lambda latest: sum(s["pending"] for s in latest.values()) == count


async def post(
    session: aiohttp.ClientSession, server: Workers, topic: str, text: str
) -> tuple[int, int | None]:
    """(status, offset or None)."""
    async with session.post(f"{server.url}/topics/{topic}", data=text.encode()) as response:
        if response.status == 200:
            return 200, (await response.json())["offset"]
        return response.status, None


async def read_all(session: aiohttp.ClientSession, server: Workers, topic: str) -> list[Any]:
    status, body = await poll(session, server, topic, after=-1, timeout=0)
    assert status in (200, 204), (status, body)
    return [] if body is None else [(m["offset"], m["value"]) for m in body["messages"]]


@contextlib.asynccontextmanager
async def running(*servers: Workers) -> AsyncIterator[list[Workers]]:
    try:
        yield list(servers)
    finally:
        for server in servers:
            stop_workers(server)


# -- the layout -------------------------------------------------------------------------


def test_the_store_names_a_topic_keys_with_its_channel_hash_tag() -> None:
    """Without a cluster (redis-py's CRC16, as Redis computes slots): every key of a
    topic's group and its wake-up channel share one slot, for the 16 shards."""
    fanout = wake_fanout()
    for names in topics_per_shard().values():
        channel_slot = key_slot(fanout.channel_of(names[0]).encode())
        assert {key_slot(key.encode()) for key in group_keys(names[0])} == {channel_slot}
    assert len({key_slot(c.encode()) for c in fanout.channels}) == SHARDS
    with pytest.raises(ValueError, match="braces"):
        redis_topics.RedisTopics("redis://127.0.0.1:1/0", topics.Limits(), prefix="a{b}")


def test_a_hash_tag_puts_keys_in_the_slot_of_their_wake_up_channel(
    cluster: RedisCluster,
) -> None:
    fanout = wake_fanout()
    owners = set()
    for shard, names in topics_per_shard().items():
        name = names[0]
        channel = fanout.channel_of(name)
        assert channel == f"{PREFIX}:wake:{{{shard}}}"
        assert fanout.hash_tag(name) == f"{{{shard}}}"
        slot = cluster.keyslot(channel)
        assert {cluster.keyslot(key) for key in group_keys(name)} == {slot}
        owners.add(cluster.owner(slot).port)
    assert len(owners) == 3  # the 16 groups spread over every primary
    # Any prefix: the tag is the channel's first {...}, as Redis reads it.
    odd = RedisFanout("redis://127.0.0.1:1/0", prefix="a{b")
    tag = odd.hash_tag("k")
    assert cluster.keyslot(f"x{tag}y") == cluster.keyslot(odd.channel_of("k"))
    with pytest.raises(ValueError, match="no hash tag"):
        RedisFanout("redis://127.0.0.1:1/0", prefix="a{}").hash_tag("k")
    with pytest.raises(TypeError):
        fanout.hash_tag(1.5)


async def test_the_store_keeps_the_limits_per_slot_group(cluster: RedisCluster) -> None:
    """Through a replica's URL: bytes and topics bounded per group (1/16 of each
    limit), the oldest message of the group dropped first, other groups untouched."""
    limits = topics.Limits(
        max_message_bytes=100, max_retained_bytes=SHARDS * 1000, max_topics=SHARDS
    )
    prefix = f"lim-{uuid.uuid4().hex[:6]}"  # groups of its own: no other test's topics
    store = redis_topics.RedisTopics(cluster.replicas()[0].url, limits, prefix=prefix, timeout=1.0)
    by_shard = topics_per_shard(per_shard=2, tag="lim-")
    first, second = by_shard[3]
    other = by_shard[7][0]
    async with ap.Purgatory("store") as purgatory:
        store.start(purgatory)
        try:
            for n in range(10):
                assert await store.publish(first, "x" * 100, 100) == n
            assert await store.publish(other, "y", 1) == 0
            with pytest.raises(topics.TooManyTopics, match="at most 1 in this topic's group"):
                await store.publish(second, "z", 1)  # its group holds one topic already
            # 1,000 bytes for the group: 4 messages of 228 (100 + 128 overhead).
            kept = await store.poll(purgatory, first, -1, 0.0)
            assert [m["offset"] for m in kept] == [6, 7, 8, 9]
            assert await store.poll(purgatory, other, -1, 0.0) == [{"offset": 0, "value": "y"}]
            group = f"{prefix}:{{3}}"
            owner = cluster.owner(cluster.keyslot(group))
            assert owner.command("GET", f"{group}:retained") == b"912"
            assert owner.command("XLEN", f"{group}:s:{first}") == 4
            # No key of the store outside the groups' slots: nothing global.
            for node in cluster.primaries():
                keys = node.command("KEYS", f"{prefix}:*")
                assert isinstance(keys, list)
                tagged = f"{prefix}:{{".encode()
                assert all(isinstance(k, bytes) and k.startswith(tagged) for k in keys), keys
        finally:
            await store.aclose()


# -- the servers ------------------------------------------------------------------------


async def park_polls(
    session: aiohttp.ClientSession,
    servers: list[Workers],
    names: list[str],
    per_server: int,
    after: int = -1,
    already: int = 0,
) -> list[asyncio.Task[tuple[int, Any]]]:
    """``per_server`` polls of each topic on each server (a connection each, so the
    kernel spreads them over the workers); returns once all are parked."""
    polls = [
        asyncio.create_task(poll(session, server, name, after=after))
        for name in names
        for server in servers
        for _ in range(per_server)
    ]
    try:
        await stats_of(session, servers, pending(already + len(polls)), 30.0)
    except BaseException:
        for task in polls:
            task.cancel()
        raise
    early = [t.result() for t in polls if t.done()]
    assert not early, f"polls answered before any POST: {early[:3]}"
    return polls


async def test_polls_over_every_primary_are_woken_across_workers_and_servers(
    cluster: RedisCluster,
) -> None:
    """The aiohttp server (2 workers) given a replica's URL and uvicorn --workers 2
    given a primary's: 32 topics over the 16 groups, 3 polls of each on each server,
    each topic woken by one POST on either server."""
    async with (
        running(
            start_workers("aiohttp", cluster.replicas()[0].url, WORKERS),
            start_workers("uvicorn", cluster.primaries()[1].url, WORKERS),
        ) as servers,
        fresh_connections() as session,
    ):
        latest = await stats_of(session, servers, subscribed)
        assert all(s["fanout"]["cluster"] for s in latest.values())
        names = [name for group in topics_per_shard(per_shard=2).values() for name in group]
        polls = await park_polls(session, servers, names, per_server=3)
        latest = await stats_of(session, servers, pending(len(polls)))
        holding = sorted(s["pending"] for s in latest.values())
        assert all(holding), holding  # every worker of both servers holds polls

        counts = connections(cluster)
        print(f"\nconnections per node, {len(polls)} polls parked on 4 workers: {counts}")
        for port, count in counts.items():
            if count["primary"]:
                # Per worker process on each primary: one subscriber, the data
                # client's pool (at most POOL_SIZE per node), and on some primary the
                # fanout's one connection that read the slot map (its publishes go
                # from the POST's script, so its own pools stay at that).
                assert count["ssub"] == 2 * WORKERS, (port, count)
                assert count["clients"] <= 2 * WORKERS * (2 + POOL_SIZE), (port, count)
            else:
                # No subscriber on a replica; the data client (redis-py's
                # RedisCluster) keeps the connection it read the slot map through
                # when the URL names a replica: one per process of that server.
                assert count["ssub"] == 0, (port, count)
                assert count["clients"] <= WORKERS, (port, count)

        started = time.monotonic()
        for i, name in enumerate(names):
            assert await post(session, servers[i % 2], name, f"to {name}") == (200, 0)
        await asyncio.wait_for(asyncio.gather(*polls), 20)
        woken = time.monotonic() - started
        expected = {
            name: (200, {"messages": [{"offset": 0, "value": f"to {name}"}]}) for name in names
        }
        for task, name in zip(polls, (n for n in names for _ in range(2 * 3)), strict=True):
            assert task.result() == expected[name]
        print(f"{len(names)} POSTs woke {len(polls)} polls in {woken * 1000:.0f} ms")

        # Read-your-writes and gap-free offsets across servers and workers: a POST's
        # offset is readable at once by a GET on the other server.
        for i, name in enumerate(names[:: len(names) // 8]):
            for n in range(1, 6):
                assert await post(session, servers[(i + n) % 2], name, f"m{n}") == (200, n)
                status, body = await poll(session, servers[(i + n + 1) % 2], name, n - 1, timeout=0)
                assert (status, body) == (200, {"messages": [{"offset": n, "value": f"m{n}"}]})
        latest = await stats_of(session, servers, pending(0))
        assert all(s["watched"] == 0 for s in latest.values())
    counts = connections(cluster)
    assert all(c["clients"] == 0 for c in counts.values()), counts  # all closed


async def test_a_primary_killed_while_polls_are_parked(cluster: RedisCluster) -> None:
    """SIGKILL to a primary: POSTs to its groups get 503 in bounded time until its
    replica took over, then 200; the polls parked there are answered by the first
    POST that lands; the other primaries' topics are served meanwhile (200); nothing a
    POST answered 200 for is missing, and the offsets have no gap."""
    fanout = wake_fanout()
    names = [group[0] for group in topics_per_shard().values()]
    slots = {name: cluster.keyslot(fanout.channel_of(name)) for name in names}
    victim = cluster.owner(slots[names[0]])
    theirs = [n for n in names if cluster.owner(slots[n]) is victim]
    others = [n for n in names if cluster.owner(slots[n]) is not victim]
    url = next(n for n in cluster.primaries() if n is not victim).url
    async with (
        running(start_workers("aiohttp", url, WORKERS)) as servers,
        fresh_connections() as session,
    ):
        server = servers[0]
        await stats_of(session, servers, subscribed)
        polls = await park_polls(session, servers, names, per_server=4)
        victims_polls = [
            p
            for p, n in zip(polls, (n for n in names for _ in range(4)), strict=True)
            if n in theirs
        ]

        killed = time.monotonic()
        cluster.kill(victim)
        posts: list[tuple[float, float, int, int | None]] = []  # sent, took, status, offset

        async def keep_posting() -> None:
            # Until 3 POSTs in a row were taken (the new primary serves the group).
            taken = 0
            while taken < 3:
                assert time.monotonic() - killed < 20, posts
                sent = time.monotonic()
                status, offset = await post(session, server, theirs[0], f"p{len(posts)}")
                posts.append((sent - killed, time.monotonic() - sent, status, offset))
                taken = taken + 1 if status == 200 else 0
                await asyncio.sleep(0.05)

        async def first_answer() -> float:
            await asyncio.wait(victims_polls, return_when=asyncio.FIRST_COMPLETED)
            return time.monotonic() - killed

        # Meanwhile the other primaries' topics work as before.
        posting = asyncio.create_task(keep_posting())
        answered_at = asyncio.create_task(first_answer())
        for name in others:
            assert await post(session, server, name, "other") == (200, 0)
        others_polls = [
            p
            for p, n in zip(polls, (n for n in names for _ in range(4)), strict=True)
            if n in others
        ]
        await asyncio.wait_for(asyncio.gather(*others_polls), 5)
        others_done = time.monotonic() - killed
        await asyncio.wait_for(posting, 25)
        first = await asyncio.wait_for(answered_at, 10)
        promoted = cluster.wait_failover(victim)
        for name in theirs[1:]:
            assert await post(session, server, name, "after") == (200, 0)
        results = await asyncio.wait_for(asyncio.gather(*victims_polls), 10)
        assert {status for status, _ in results} == {200}

        refused = [p for p in posts if p[2] != 200]
        taken = [p for p in posts if p[2] == 200]
        print(
            f"\nprimary :{victim.port} killed; its replica :{promoted.port} took over."
            f" Other primaries' topics: {len(others)} POSTs and their polls done"
            f" {others_done:.2f} s after the kill. POSTs to its groups: {len(refused)}"
            f" refused ({sorted({p[2] for p in refused})}, each within"
            f" {max((p[1] for p in refused), default=0):.2f} s), the first taken"
            f" {taken[0][0] + taken[0][1]:.2f} s after the kill; first parked poll"
            f" answered {first:.2f} s after the kill"
        )
        assert all(p[2] == 503 and p[1] <= POST_DEADLINE + 0.5 for p in refused), refused
        # Nothing answered 200 is missing; offsets have no gap (a 503 may have been
        # stored: Redis may have run the script before the answer was lost).
        stored = await read_all(session, server, theirs[0])
        assert [offset for offset, _ in stored] == list(range(len(stored)))
        assert {(p[3], f"p{i}") for i, p in enumerate(posts) if p[2] == 200} <= set(stored)
    cluster.restart(victim)  # back, as the new primary's replica


async def test_a_slot_migrated_while_polls_are_parked(cluster: RedisCluster) -> None:
    """A group's slot moved to another primary (keys and all) while polls wait on its
    topics and POSTs keep coming to another of its topics: the polls are answered by
    a POST after the move; every POST was taken or refused (503), none lost."""
    fanout = wake_fanout()
    parked_topic, busy_topic = topics_per_shard(per_shard=2, tag="mig-")[3]
    slot = cluster.keyslot(fanout.channel_of(parked_topic))
    home = cluster.owner(slot)
    target = next(n for n in cluster.primaries() if n is not home)
    async with (
        running(start_workers("aiohttp", home.url, WORKERS)) as servers,
        fresh_connections() as session,
    ):
        server = servers[0]
        await stats_of(session, servers, subscribed)
        assert await post(session, server, parked_topic, "before") == (200, 0)
        polls = await park_polls(session, servers, [parked_topic], per_server=10, after=0)
        posts: list[tuple[int, int | None]] = []
        moving = True

        async def keep_posting() -> None:
            while moving or len(posts) < 5:
                posts.append(await post(session, server, busy_topic, f"b{len(posts)}"))
                await asyncio.sleep(0.01)

        posting = asyncio.create_task(keep_posting())
        try:
            started = time.monotonic()
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
            moved = time.monotonic()
            assert cluster.owner(slot) is target
        finally:
            moving = False
            await asyncio.wait_for(posting, 10)
        try:
            assert not any(p.done() for p in polls)
            await asyncio.sleep(0.3)  # the workers' subscribers follow the slot
            sent = time.monotonic()
            assert await post(session, server, parked_topic, "after") == (200, 1)
            results = await asyncio.wait_for(asyncio.gather(*polls), 10)
            woken = time.monotonic() - sent
            assert results == [(200, {"messages": [{"offset": 1, "value": "after"}]})] * len(polls)
            latest = await stats_of(session, servers, lambda s: True)
            assert all(s["fanout"]["slot_moves"] >= 1 for s in latest.values()), latest
            stored = await read_all(session, server, busy_topic)
            assert [offset for offset, _ in stored] == list(range(len(stored)))
            taken = {(offset, f"b{i}") for i, (status, offset) in enumerate(posts) if status == 200}
            assert taken <= set(stored)
            assert {status for status, _ in posts} <= {200, 503}
            print(
                f"\nslot {slot} moved :{home.port} -> :{target.port} in"
                f" {moved - started:.2f} s with {len(polls)} polls parked; POSTs meanwhile:"
                f" {sum(s == 200 for s, _ in posts)} taken, {sum(s != 200 for s, _ in posts)}"
                f" refused; a POST after the move woke the polls in {woken * 1000:.0f} ms"
            )
        finally:
            cluster.migrate_slot(slot, home)


def test_load_script_against_workers_on_a_cluster_loses_nothing(cluster: RedisCluster) -> None:
    """Clients following their topics' offsets (over every group), each poll on
    whichever worker: every message seen, no gap (examples/long_poll/load.py)."""
    server = start_workers("aiohttp", cluster.primaries()[0].url, WORKERS)
    try:
        command = [sys.executable, "examples/long_poll/load.py", "--url", server.url]
        command += ["--clients", "60", "--duration", "1", "--poll-timeout", "0.3"]
        command += ["--rate", "20", "--ramp-limit", "5", "--topics", "30"]
        done = subprocess.run(command, cwd=servers.ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        figures = dict(re.findall(r"^(\w[\w ]*?):\s+(\d+)", done.stdout, re.MULTILINE))
        assert int(figures["answered"]) > 0
        assert int(figures["errors"]) == int(figures["lost"]) == 0
        assert int(figures["caught up"]) == 48  # the clients that did not hang up
    finally:
        stop_workers(server)
