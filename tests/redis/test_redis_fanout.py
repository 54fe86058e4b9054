"""aiopurgatory.redis against a real redis-server (started per module on a free port).

Two fanouts on one loop stand for two processes (each has its own subscriber and
pool, exactly as two processes would); one test uses a second event loop in a thread,
one a real second OS process. Failures are made for real: CLIENT KILL, SIGSTOP,
a restart, a server that is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Hashable
from functools import partial
from typing import Any

import pytest
import redis

import aiopurgatory as ap
from aiopurgatory.redis import (
    FanoutClosed,
    FanoutUnavailable,
    RedisFanout,
    decode_key,
    encode_key,
)

from ..support.redis_fanout import FAST, joined
from ..support.redis_server import RedisServer, fresh, redis_server

__all__ = ["redis_server"]  # the fixture, imported to be found by pytest

# Tests that need a server take the `server` fixture, which skips (only) when the
# redis-server binary is missing; redis-py itself is a dev dependency: no skip.
pytestmark = pytest.mark.anyio

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def until(condition: Any, timeout: float = 5.0, what: str = "condition") -> float:
    """Poll ``condition()`` until true; returns the seconds it took."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


def subscribers(server: RedisServer) -> list[dict[str, str]]:
    return [c for c in server.clients() if int(c.get("sub", 0)) or int(c.get("ssub", 0))]


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    """The module's server, running and empty at the start of each test."""
    return fresh(redis_server)


# -- keys and options (no server needed) -------------------------------------------------


def test_keys_encode_canonically_and_refuse_other_types() -> None:
    for key in ("orders", "ünï", "", b"\x00\xff", 0, -7, 2**70):
        assert decode_key(encode_key(key)) == key
        assert type(decode_key(encode_key(key))) is type(key)
    assert encode_key("1") != encode_key(1) != encode_key(b"1")
    assert decode_key(encode_key(True)) == 1  # the same purgatory key as 1
    # Stable across processes and Python versions (CRC-32 of the encoding, not hash()).
    fanout = RedisFanout("redis://127.0.0.1:1/0", shards=16, prefix="app")
    # Fixed values: every process, machine and release must agree on them.
    assert fanout.channel_of("orders") == "app:{5}"
    assert fanout.channel_of(42) == "app:{10}"
    channels = {fanout.channel_of(f"topic-{i}") for i in range(1000)}
    assert len(channels) == 16  # spread over every shard
    for bad in [("t", 1), 1.5, None, frozenset()]:
        with pytest.raises(TypeError, match="must be a str, bytes or int"):
            encode_key(bad)
    with pytest.raises(ValueError, match="not an encoded key"):
        decode_key(b"x123")


def test_options_are_checked() -> None:
    url = "redis://127.0.0.1:1/0"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"shards": 0}, "shards"),
        ({"shards": 20000}, "shards"),
        ({"pool_size": 0}, "pool_size"),
        ({"socket_timeout": 0}, "socket_timeout"),
        ({"ping_interval": float("inf")}, "ping_interval"),
        ({"reconnect_min": 2.0, "reconnect_max": 1.0}, "reconnect_max"),
        ({"reconnect_jitter": 1.5}, "reconnect_jitter"),
        ({"prefix": ""}, "prefix"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            RedisFanout(url, **options)
    with pytest.raises(TypeError, match="expected a Purgatory"):
        RedisFanout(url).attach("not a purgatory")  # type: ignore[arg-type]


def test_second_process_agrees_on_channels() -> None:
    """Another interpreter (another hash seed) maps keys to the same channels."""
    keys = ["orders", "a", "ünï"]
    code = (
        "from aiopurgatory.redis import RedisFanout;"
        "f = RedisFanout('redis://127.0.0.1:1/0');"
        f"print([f.channel_of(k) for k in {keys!r}])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    fanout = RedisFanout("redis://127.0.0.1:1/0")
    assert out.stdout.strip() == repr([fanout.channel_of(k) for k in keys])


# -- waking across "processes" -----------------------------------------------------------


async def test_two_processes_wake_each_other(server: RedisServer) -> None:
    state = {"a": 0, "b": 0}
    async with joined(server.url, "A") as (pa, fa), joined(server.url, "B") as (pb, fb):
        wait_b = asyncio.ensure_future(pb.wait_for(["to-b"], lambda: state["b"] > 0, 5.0))
        wait_a = asyncio.ensure_future(pa.wait_for(["to-a"], lambda: state["a"] > 0, 5.0))
        # The publisher's own watchers: woken locally, at once, not through Redis.
        local = asyncio.ensure_future(pa.wait_for(["to-b"], lambda: state["b"] > 0, 5.0))
        await asyncio.sleep(0)
        state["b"] = 1
        start = time.perf_counter()
        assert await fa.publish("to-b") == 2  # both subscribers got it
        assert await asyncio.wait_for(wait_b, 5.0) is True
        assert await asyncio.wait_for(local, 5.0) is True
        one_way = time.perf_counter() - start
        state["a"] = 1
        assert await fb.publish("to-a") == 2
        assert await asyncio.wait_for(wait_a, 5.0) is True
        await until(lambda: fa.stats.own_messages == 1 and fb.stats.messages == 2)
        assert fa.stats.published == 1
        assert fb.stats.wakeups >= 1
        assert pa.num_delayed() == pb.num_delayed() == 0
        assert one_way < 1.0


async def test_two_event_loops_in_threads(server: RedisServer) -> None:
    """A second, independent client on its own loop in a thread is woken, and wakes."""
    flag = threading.Event()
    ready = threading.Event()
    result: list[object] = []

    async def other() -> None:
        async with joined(server.url, "thread") as (purgatory, fanout):
            waiting = purgatory.wait_for(["ping"], flag.is_set, 5.0)
            ready.set()
            result.append(await waiting)
            await fanout.publish("pong")

    thread = threading.Thread(target=lambda: asyncio.run(other()))
    thread.start()
    try:
        async with joined(server.url, "main") as (purgatory, fanout):
            pong = asyncio.ensure_future(purgatory.wait_for(["pong"], lambda: bool(result), 5.0))
            await until(ready.is_set, what="the thread's fanout")
            flag.set()
            await fanout.publish("ping")
            assert await asyncio.wait_for(pong, 5.0) is True
    finally:
        await asyncio.to_thread(thread.join, 10.0)
    assert result == [True]


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import redis
    import aiopurgatory as ap
    from aiopurgatory.redis import RedisFanout

    URL = sys.argv[1]

    async def main() -> None:
        sync = redis.Redis.from_url(URL)  # the predicate reads the shared state in Redis
        async with ap.Purgatory("child") as p, RedisFanout(URL, name="child") as fanout:
            fanout.attach(p)
            assert await fanout.wait_connected(5)
            waiting = p.wait_for(["to-child"], lambda: sync.get("flag") == b"1", 10)
            print("READY", flush=True)
            ok = await waiting
            await fanout.client.set("reply", "1")
            await fanout.publish("to-parent")
            print("WOKEN", ok, flush=True)
        sync.close()

    asyncio.run(main())
    """
)


async def test_a_second_os_process(server: RedisServer) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        server.url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 20.0)
        assert line.strip() == b"READY", line
        sync = redis.Redis.from_url(server.url)
        try:
            async with joined(server.url, "parent") as (purgatory, fanout):
                reply = asyncio.ensure_future(
                    purgatory.wait_for(["to-parent"], lambda: sync.get("reply") == b"1", 10.0)
                )
                await asyncio.sleep(0)
                await fanout.client.set("flag", "1")
                await fanout.publish("to-child")
                assert await asyncio.wait_for(reply, 10.0) is True
        finally:
            sync.close()
        out, err = await asyncio.wait_for(child.communicate(), 10.0)
        assert child.returncode == 0, err.decode()
        assert out.strip() == b"WOKEN True"
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_a_burst_costs_one_recheck_per_process(server: RedisServer) -> None:
    checks = {"hot": 0}

    def hot() -> bool:
        checks["hot"] += 1
        return False

    async with joined(server.url, "A") as (_pa, fa), joined(server.url, "B") as (pb, fb):
        pb.try_complete_else_watch(ap.PredicateOperation(hot, 10.0), ["hot"])
        fence = asyncio.ensure_future(pb.wait_for(["fence"], lambda: True, 10.0))
        before = checks["hot"]
        # 500 wake-ups of one key in one round trip, then a fence to know they arrived.
        await fa.publish_many(["hot"] * 500)
        await fa.publish("fence")
        await until(lambda: fb.stats.messages >= 501, what="the burst")
        await asyncio.wait_for(fence, 5.0)
        await asyncio.sleep(0.01)
        rechecks = checks["hot"] - before
        assert 1 <= rechecks <= 5, rechecks  # coalesced as notify coalesces
        print(f"\nburst: 500 wake-ups of one key -> {rechecks} re-check(s) in the other process")
        assert pb.watchers_of("hot") == 1


async def test_unwatched_keys_cost_no_check(server: RedisServer) -> None:
    async with joined(server.url, "A") as (_pa, fa), joined(server.url, "B") as (_pb, fb):
        await fa.publish_many([f"nobody-{i}" for i in range(50)])
        await until(lambda: fb.stats.messages >= 50)
        assert fb.stats.wakeups == 0


# -- no lost wake-up -----------------------------------------------------------------------


async def test_killed_subscription_rechecks_what_was_missed(server: RedisServer) -> None:
    """CLIENT KILL TYPE pubsub, then a publish while nobody is subscribed: the parked
    waits still complete, by the re-check after the subscription is back; the state
    they check lives in Redis (read by the refresh hook)."""
    cache: dict[Hashable, bytes | str | None] = {}

    async def refresh_from(fanout: RedisFanout, keys: list[Hashable]) -> None:
        values = await fanout.client.mget([f"value:{k}" for k in keys])
        cache.update(zip(keys, values, strict=True))

    async with (
        joined(server.url, "A") as (_pa, fa),
        ap.Purgatory("B") as pb,
        RedisFanout(
            server.url,
            name="B",
            **{**FAST, "reconnect_min": 0.3, "reconnect_max": 0.3, "reconnect_jitter": 0.0},
            refresh=lambda keys: refresh_from(fb, keys),
        ) as fb,
    ):
        fb.attach(pb)
        assert await fb.wait_connected(5.0)
        waits = [
            asyncio.ensure_future(pb.wait_for([f"k{i}"], partial(cache.get, f"k{i}"), 10.0))
            for i in range(100)
        ]
        await asyncio.sleep(0.05)
        assert pb.num_delayed() == 100
        killed = server.command("CLIENT", "KILL", "TYPE", "pubsub")
        assert killed == 2
        await fa.client.mset({f"value:k{i}": b"1" for i in range(100)})
        # Nobody is subscribed now: pub/sub drops these wake-ups.
        assert await fa.publish("k0") == 0
        await fa.publish_many([f"k{i}" for i in range(1, 100)])
        assert not fb.connected
        start = time.perf_counter()
        done, _ = await asyncio.wait(waits, timeout=5.0)
        took = time.perf_counter() - start
        assert len(done) == 100
        assert all(w.result() is True for w in waits)
        assert took < 2.0
        print(f"\nCLIENT KILL: 100 parked waits done {took * 1000:.0f} ms after the missed publish")
        await until(lambda: fa.connected, 3.0, "A resubscribed")
        assert len(subscribers(server)) == 2  # the old subscribers are gone, not leaked
        stats = fb.stats
        assert stats.reconnects == 1
        assert stats.disconnects == 1
        assert stats.errors >= 1
        assert "Connection" in (stats.last_error or "")
        assert stats.refreshes >= 1


async def test_frozen_redis(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """SIGSTOP for 2 s: publishes fail with FanoutUnavailable within their timeout,
    the process stays responsive, and after SIGCONT the parked wait completes."""
    caplog.set_level(logging.INFO, logger="aiopurgatory.redis")
    state = {"v": 0}
    async with joined(server.url, "A") as (_pa, fa), joined(server.url, "B") as (pb, fb):
        parked = asyncio.ensure_future(pb.wait_for(["k"], lambda: state["v"] > 0, 20.0))
        short = asyncio.ensure_future(pb.wait_for(["other"], lambda: False, 0.3))
        await asyncio.sleep(0.01)
        server.freeze()
        try:
            state["v"] = 1
            start = time.perf_counter()
            with pytest.raises(FanoutUnavailable, match="could not publish") as caught:
                await fa.publish("k")
            assert isinstance(caught.value, ap.PurgatoryError)
            failed_after = time.perf_counter() - start
            assert failed_after < 2.0  # socket_timeout 0.5 s, one retry
            assert await asyncio.wait_for(short, 2.0) is False  # timeouts still run
            await until(lambda: not fb.connected, 3.0, "the stale subscription detected")
            await asyncio.sleep(max(0.0, 2.0 - (time.perf_counter() - start)))
        finally:
            server.thaw()
        thawed = time.perf_counter()
        assert await asyncio.wait_for(parked, 10.0) is True
        recovered = time.perf_counter() - thawed
        assert recovered < 3.0, recovered
        print(
            f"\nSIGSTOP 2 s: publish failed after {failed_after * 1000:.0f} ms;"
            f" parked wait done {recovered * 1000:.0f} ms after SIGCONT"
        )
        assert fa.stats.publish_errors == 1
        assert fb.stats.reconnects >= 1
        assert any("lost the subscription" in r.getMessage() for r in caplog.records)


async def guide_handler(fanout: RedisFanout, topic: str, body: str) -> int:
    """The guide's writer (docs/guides/redis.md): the data write answered 503 when Redis
    is unavailable; a wake-up failing after it is still 200 (the data is stored)."""
    try:
        await fanout.client.xadd(f"t:{topic}", {"v": body})
    except FanoutUnavailable:
        return 503
    with contextlib.suppress(FanoutUnavailable):
        await fanout.publish(topic)
    return 200


async def test_every_call_of_a_request_says_unavailable_the_same_way(server: RedisServer) -> None:
    """Redis down, frozen or its pool busy: every call a request makes (a command, a
    pipeline, a script, a publish) raises ``FanoutUnavailable``, so the guide's handler
    answers 503 (issue 49, item 8: the data write raised redis-py's ConnectionError and
    the handler answered 500); other errors stay redis-py's own."""
    # Roomy timeouts where Redis is up (a loaded machine must not fail a command), the
    # suite's short ones where it is down (each call then ends within a few of them).
    busy = {"pool_size": 1, "pool_timeout": 0.2, "socket_timeout": 3.0}
    async with joined(server.url, "A", **busy) as (_, fanout):
        assert await guide_handler(fanout, "up", "x") == 200
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            await fanout.client.execute_command("NO-SUCH-COMMAND")  # type: ignore[no-untyped-call]
        assert not isinstance(refused.value, FanoutUnavailable)
        # The pool busy past pool_timeout: the same error (and the same as on a cluster).
        blocked = asyncio.ensure_future(fanout.client.blpop(["nothing"], timeout=1))
        await asyncio.sleep(0.05)
        with pytest.raises(FanoutUnavailable, match="Redis unavailable"):
            await fanout.client.get("k")
        await blocked
    async with joined(server.url, "A", pool_size=1) as (_, fanout):
        script = fanout.client.register_script("return redis.call('GET', KEYS[1])")
        for broken in (server.freeze, server.stop):
            broken()
            try:
                began = time.perf_counter()
                assert await guide_handler(fanout, "down", "x") == 503
                pipe = fanout.client.pipeline(transaction=False)
                pipe.get("k")
                with pytest.raises(FanoutUnavailable) as caught:
                    await pipe.execute()
                # Still redis-py's ConnectionError for code written against redis-py.
                assert isinstance(caught.value, redis.exceptions.ConnectionError)
                with pytest.raises(FanoutUnavailable):
                    await script(keys=["k"])
                assert time.perf_counter() - began < 10.0
            finally:
                if broken == server.freeze:
                    server.thaw()
                else:
                    await asyncio.to_thread(server.start)
    async with joined(server.url, "B", **busy) as (_, fanout):
        assert await guide_handler(fanout, "back", "x") == 200


async def test_redis_restart_and_down(server: RedisServer) -> None:
    """Redis stopped: waits still time out, publish raises at once, stats tell; Redis
    back (empty, on the same port): every parked wait is re-checked and completes."""
    state = {"v": 0}
    async with joined(server.url, "A") as (_pa, fa), joined(server.url, "B") as (pb, fb):
        parked = [
            asyncio.ensure_future(pb.wait_for([f"k{i % 50}"], lambda: state["v"] > 0, 20.0))
            for i in range(1000)
        ]
        server.stop()
        await until(lambda: not fb.connected and not fa.connected, 3.0, "the loss seen")
        assert await pb.wait_for(["x"], lambda: False, 0.2) is False  # still times out
        state["v"] = 1
        with pytest.raises(FanoutUnavailable):
            await fa.publish("k0")
        assert pb.num_delayed() == 1000
        await asyncio.sleep(0.3)  # several failed reconnects, with backoff
        assert fb.stats.errors >= 2
        assert fb.stats.connected is False
        await asyncio.to_thread(server.start)
        back = time.perf_counter()
        resubscribed = await until(lambda: fb.connected, 3.0, "B resubscribed")
        done, _ = await asyncio.wait(parked, timeout=10.0)
        recovered = time.perf_counter() - back
        assert len(done) == 1000
        assert recovered < 2.0, recovered
        print(
            f"\nredis back -> resubscribed in {resubscribed * 1000:.0f} ms (backoff),"
            f" 1000 parked waits re-checked and done in {recovered * 1000:.0f} ms"
        )
        # The data pool works again at once (its dead connections are retried).
        await until(lambda: fa.connected, 3.0, "A resubscribed")
        assert await fa.publish("k0") == 2
        assert fb.stats.reconnects == 1


# -- connections, lifecycle ------------------------------------------------------------


async def test_thousands_of_waiters_use_one_subscriber_and_a_small_pool(
    server: RedisServer,
) -> None:
    flags: set[str] = set()
    # 250 publishes per side queue for 2 connections: on a loaded machine the last wait
    # longer than the default pool_timeout; what is tested is the bound on connections.
    async with (
        joined(server.url, "A", pool_size=2, pool_timeout=10.0) as (pa, fa),
        joined(server.url, "B", pool_size=2, pool_timeout=10.0) as (pb, fb),
    ):
        waits = [
            asyncio.ensure_future(
                p.wait_for([f"t{i % 500}"], partial(flags.__contains__, f"t{i % 500}"), 20.0)
            )
            for p in (pa, pb)
            for i in range(2500)
        ]
        await asyncio.sleep(0.01)
        assert pa.num_delayed() + pb.num_delayed() == 5000
        flags.update(f"t{i}" for i in range(500))
        # 500 concurrent publishes from each side: the pools stay at 2 connections.
        await asyncio.gather(
            *(fa.publish(f"t{i}") for i in range(0, 500, 2)),
            *(fb.publish(f"t{i}") for i in range(1, 500, 2)),
        )
        done, _ = await asyncio.wait(waits, timeout=10.0)
        assert len(done) == 5000
        clients = server.clients()
        subs = subscribers(server)
        assert len(subs) == 2  # one per "process"
        assert all(int(c["sub"]) == 16 for c in subs)
        assert len(clients) <= 2 * (1 + 2), clients


async def test_sharded_pubsub(server: RedisServer) -> None:
    state = {"v": 0}
    async with (
        joined(server.url, "A", sharded_pubsub=True) as (_pa, fa),
        joined(server.url, "B", sharded_pubsub=True) as (pb, fb),
    ):
        assert fa.publish_command == "SPUBLISH"
        subs = subscribers(server)
        assert [int(c["ssub"]) for c in subs] == [16, 16]
        wait = asyncio.ensure_future(pb.wait_for(["k"], lambda: state["v"] > 0, 5.0))
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.publish("k")
        assert await asyncio.wait_for(wait, 5.0) is True
        # And back after a kill.
        server.command("CLIENT", "KILL", "TYPE", "pubsub")
        await until(lambda: fb.stats.reconnects == 1, what="resubscribed")
        assert fb.connected


async def test_message_for_goes_with_the_data_in_one_script(server: RedisServer) -> None:
    """The application writes the data and the wake-up atomically (Lua)."""
    async with joined(server.url, "A") as (pa, fa), joined(server.url, "B") as (pb, _fb):
        sync = redis.Redis.from_url(server.url)
        try:
            waits = [
                asyncio.ensure_future(p.wait_for(["s"], lambda: sync.xlen("s") > 0, 5.0))
                for p in (pa, pb)
            ]
            await asyncio.sleep(0)
            channel, payload = fa.message_for("s")
            script = "redis.call('XADD', KEYS[1], '*', 'v', '1');"
            script += f"return redis.call('{fa.publish_command}', ARGV[1], ARGV[2])"
            await fa.client.eval(script, 1, "s", channel, payload)
            # No origin: both processes, the publisher's too, wake through Redis.
            assert await asyncio.wait_for(asyncio.gather(*waits), 5.0) == [True, True]
        finally:
            sync.close()


async def test_lifecycle(server: RedisServer) -> None:
    async with ap.Purgatory("p") as purgatory:
        fanout = RedisFanout(server.url, **FAST)
        with pytest.raises(FanoutClosed, match="not running"):
            await fanout.wait_connected(0.1)
        async with fanout:
            fanout.attach(purgatory)
            fanout.attach(purgatory)  # idempotent
            assert fanout.purgatories == (purgatory,)
            assert await fanout.wait_connected(5.0)
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert "aiopurgatory-redis-fanout" in names
            fanout.detach(purgatory)
            assert fanout.stats.attached == 0
            assert "connected" in repr(fanout)
        assert fanout.closed
        assert not fanout.connected
        await fanout.aclose()  # idempotent
        names = {t.get_name() for t in asyncio.all_tasks()}
        assert not any(n.startswith("aiopurgatory-redis") for n in names)
        with pytest.raises(FanoutClosed):
            await fanout.publish("k")
        with pytest.raises(FanoutClosed):
            fanout.attach(purgatory)
        with pytest.raises(FanoutClosed):
            fanout.start()
        with pytest.raises(TypeError, match="str, bytes or int"):
            await RedisFanout(server.url).publish(("a", 1))
        assert server.clients() == []  # every connection closed


async def test_closed_purgatory_is_dropped(server: RedisServer) -> None:
    async with joined(server.url, "A") as (_pa, fa):
        extra = ap.Purgatory("extra")
        async with extra:
            extra.try_complete_else_watch(ap.PredicateOperation(lambda: False, 5.0), ["k"])
            fa.attach(extra)
        assert fa.stats.attached == 2
        await fa.publish("k")
        assert fa.stats.attached == 1
        with pytest.raises(ValueError, match="closed"):
            fa.attach(extra)


async def test_attach_from_another_loop_is_refused(server: RedisServer) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:

        async def bound() -> ap.Purgatory:
            p = ap.Purgatory("elsewhere")
            p.try_complete_else_watch(ap.PredicateOperation(lambda: False, 5.0), ["k"])
            return p

        elsewhere = asyncio.run_coroutine_threadsafe(bound(), loop).result(5.0)
        async with joined(server.url, "A") as (_pa, fa):
            with pytest.raises(RuntimeError, match="another event loop"):
                fa.attach(elsewhere)
            assert fa.stats.attached == 1
        loop.call_soon_threadsafe(elsewhere.close)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 5.0)
        loop.close()


async def test_purgatory_keys_is_a_snapshot_of_watched_keys() -> None:
    """Purgatory.keys(), which the re-check after a reconnect walks."""
    async with ap.Purgatory("keys") as purgatory:
        assert purgatory.keys() == []
        a = purgatory.try_complete_else_watch(ap.PredicateOperation(lambda: False, 5.0), ["x", 1])
        purgatory.try_complete_else_watch(ap.PredicateOperation(lambda: False, 5.0), ["x", b"y"])
        keys = purgatory.keys()
        assert sorted(map(repr, keys)) == sorted(map(repr, ["x", 1, b"y"]))
        keys.append("not watched")  # a copy: changing it changes nothing
        assert len(purgatory.keys()) == 3
        a.cancel()
        assert sorted(map(repr, purgatory.keys())) == sorted(map(repr, ["x", b"y"]))


async def test_resp2_local_wakeups_off_and_garbage(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """RESP2 connections; without local_wakeups the publisher's own watchers are woken
    by its message coming back; a message that is no wake-up is counted, not fatal,
    and said once as a warning (a misconfigured peer loses all its wake-ups)."""
    caplog.set_level(logging.WARNING, logger="aiopurgatory.redis")
    state = {"v": 0}
    async with joined(server.url, "A", local_wakeups=False, redis_options={"protocol": 2}) as (
        pa,
        fa,
    ):
        assert [c["resp"] for c in server.clients()] == ["2"]
        wait = asyncio.ensure_future(pa.wait_for([b"k"], lambda: state["v"] > 0, 5.0))
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.client.publish(fa.channel_of("x"), b"not a wake-up")
        await fa.client.publish(fa.channel_of("x"), b"|zbad tag")
        assert await fa.publish(b"k") == 1
        assert await asyncio.wait_for(wait, 5.0) is True
        await until(lambda: fa.stats.messages == 3)
        stats = fa.stats
        assert stats.malformed == 2
        assert stats.own_messages == 0
        assert fa.connected
        warnings = [r.getMessage() for r in caplog.records if "not a wake-up" in r.getMessage()]
        assert len(warnings) == 1, warnings
        # And the kill/re-check path on RESP2 too.
        again = asyncio.ensure_future(pa.wait_for([b"k2"], lambda: state["v"] > 1, 5.0))
        await asyncio.sleep(0)
        server.command("CLIENT", "KILL", "TYPE", "pubsub")
        state["v"] = 2
        assert await asyncio.wait_for(again, 5.0) is True
        assert fa.stats.reconnects == 1


async def test_refresh_failure_is_counted_and_keys_still_checked(server: RedisServer) -> None:
    calls: list[list[Hashable]] = []

    async def refresh(keys: list[Hashable]) -> None:
        calls.append(keys)
        raise RuntimeError("refresh broke")

    state = {"v": 0}
    async with (
        joined(server.url, "A") as (_pa, fa),
        joined(server.url, "B", refresh=refresh) as (pb, fb),
    ):
        wait = asyncio.ensure_future(pb.wait_for(["k"], lambda: state["v"] > 0, 5.0))
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.publish("k")
        assert await asyncio.wait_for(wait, 5.0) is True
        assert fb.stats.refresh_errors >= 1
        assert "refresh broke" in (fb.stats.last_error or "")
        assert ["k"] in calls


async def test_publish_many_when_redis_is_down(server: RedisServer) -> None:
    flag = asyncio.Event()
    async with joined(server.url, "A") as (pa, fa):
        woken = asyncio.ensure_future(pa.wait_for(["k"], flag.is_set, 5.0))
        await asyncio.sleep(0)
        assert pa.num_delayed() == 1
        server.stop()
        flag.set()
        try:
            with pytest.raises(FanoutUnavailable, match="could not publish 2 wake-ups"):
                await fa.publish_many(["k", "j"])
            # Local watchers were woken all the same.
            assert await asyncio.wait_for(woken, 1.0) is True
            assert fa.stats.publish_errors == 1
            await fa.publish_many([])  # nothing to send, nothing raised
        finally:
            server.start()


@pytest.mark.parametrize("given_in", ["redis_options", "url"])
async def test_decode_responses_keeps_the_wakeups_and_decodes_the_data(
    server: RedisServer, given_in: str
) -> None:
    """decode_responses, in redis_options or in the URL: remote wake-ups still arrive
    (the subscriber reads bytes whatever it says), and fanout.client decodes as asked."""
    if given_in == "url":
        url, options = f"{server.url}?decode_responses=true", dict[str, Any]()
    else:
        url, options = server.url, {"redis_options": {"decode_responses": True}}
    state = {"v": 0}
    async with joined(server.url, "A") as (_pa, fa), joined(url, "B", **options) as (pb, fb):
        waits = [
            asyncio.ensure_future(pb.wait_for([key], lambda: state["v"] > 0, 5.0))
            for key in ("s", b"b", 7)
        ]
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.publish_many(["s", b"b", 7])
        assert await asyncio.wait_for(asyncio.gather(*waits), 3.0) == [True] * 3
        stats = fb.stats
        assert stats.malformed == 0
        assert stats.wakeups >= 3
        # Its own publishes still come back recognised as its own.
        await fb.publish("s")
        await until(lambda: fb.stats.own_messages == 1, what="B's own message skipped")
        # The data pool honours the option.
        await fb.client.set("decoded", b"yes")
        assert await fb.client.get("decoded") == "yes"


async def test_attach_binds_an_unused_purgatory_to_the_fanouts_loop(server: RedisServer) -> None:
    """An unused purgatory attached, then used on another thread's loop: that use is
    refused there (the fanout, which notifies it from its own loop, could not serve
    it), and the fanout goes on waking its other purgatories without reconnecting."""
    state = {"v": 0}
    stray = ap.Purgatory("stray")  # not used yet: on no loop
    async with (
        joined(server.url, "A") as (_pa, fa),
        ap.Purgatory("B") as pb,
        RedisFanout(server.url, name="B", **FAST) as fb,
    ):
        fb.attach(stray)  # first: before the fix its failures stopped the others
        fb.attach(pb)
        assert await fb.wait_connected(5.0)

        async def elsewhere() -> None:
            op = ap.PredicateOperation(lambda: False, 5.0)
            try:
                stray.try_complete_else_watch(op, ["k"])
            finally:
                op.cancel()

        with pytest.raises(RuntimeError, match="bound to the event loop"):
            await asyncio.to_thread(asyncio.run, elsewhere())
        wait = asyncio.ensure_future(pb.wait_for(["k"], lambda: state["v"] > 0, 5.0))
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.publish("k")
        assert await asyncio.wait_for(wait, 3.0) is True
        stats = fb.stats
        assert (stats.disconnects, stats.errors, stats.delivery_errors) == (0, 0, 0)
    stray.close()


def loop_of(purgatory: ap.Purgatory) -> asyncio.AbstractEventLoop | None:
    return purgatory.loop  # read anew: mypy would keep what an assert narrowed it to


async def test_attach_outside_the_fanouts_loop_is_refused(server: RedisServer) -> None:
    async with joined(server.url, "A") as (_pa, fa):
        unused = ap.Purgatory("unused")

        def from_a_thread() -> None:
            fa.attach(unused)

        with pytest.raises(RuntimeError, match="from the loop"):
            await asyncio.to_thread(from_a_thread)
        assert unused.loop is None
        assert fa.stats.attached == 1
    # Attached before the start (no loop yet): bound by start, on the running loop.
    fanout = RedisFanout(server.url, purgatories=[unused], **FAST)
    assert unused.loop is None
    async with fanout:
        assert loop_of(unused) is asyncio.get_running_loop()
    unused.close()


class _Broken(ap.Purgatory):
    """A purgatory whose notify fails, as one used from the wrong loop did."""

    def notify(self, key: Hashable) -> None:
        raise RuntimeError(f"cannot notify {key!r}")


async def test_one_failing_purgatory_does_not_stop_the_others(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiopurgatory.redis")
    state = {"v": 0}
    async with (
        joined(server.url, "A") as (_pa, fa),
        _Broken("broken") as broken,
        ap.Purgatory("B") as pb,
        RedisFanout(server.url, name="B", **FAST) as fb,
    ):
        broken.try_complete_else_watch(ap.PredicateOperation(lambda: False, 5.0), ["k"])
        fb.attach(broken)  # its re-check fails at once, and at every (re)subscription
        fb.attach(pb)
        assert await fb.wait_connected(5.0)
        waits = [
            asyncio.ensure_future(pb.wait_for([key], lambda: state["v"] > 0, 5.0))
            for key in ("k", "j")
        ]
        await asyncio.sleep(0)
        state["v"] = 1
        await fa.publish_many(["k", "j"] * 20)
        assert await asyncio.wait_for(asyncio.gather(*waits), 3.0) == [True, True]
        await until(lambda: fb.stats.messages == 40, what="every wake-up")
        stats = fb.stats
        assert (stats.disconnects, stats.errors) == (0, 0)
        assert stats.delivery_errors >= 20  # one per wake-up of "k" (or its coalesced pass)
        assert "cannot notify 'k'" in (stats.last_error or "")
        assert stats.connected
        # Logged once (rate-limited), with its traceback; not once per wake-up.
        warnings = [r for r in caplog.records if "waking" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].exc_info is not None


async def test_refresh_runs_for_a_wakeup_nobody_watches_yet(server: RedisServer) -> None:
    """A waiter reads the shared state, and the wake-up of a change made just after
    arrives before it watches: the refresh hook gets that key all the same, so the
    copy the waiter's condition reads is fresh once it watches."""
    cache: dict[Hashable, int] = {}
    interested: set[Hashable] = set()  # keys whose waiters are on their way
    batches: list[list[Hashable]] = []

    async def refresh(keys: list[Hashable]) -> None:
        batches.append(keys)
        wanted = [k for k in keys if k in interested]
        if wanted:
            values = await fb.client.mget([f"value:{k}" for k in wanted])
            for key, value in zip(wanted, values, strict=True):
                cache[key] = max(cache.get(key, 0), int(value or 0))

    async with (
        joined(server.url, "A") as (_pa, fa),
        ap.Purgatory("B") as pb,
        RedisFanout(server.url, name="B", refresh=refresh, **FAST) as fb,
    ):
        fb.attach(pb)
        assert await fb.wait_connected(5.0)
        interested.add("k")  # first the interest, then the read
        seen = int(await fb.client.get("value:k") or 0)
        # A change, and its wake-up received before the waiter watches "k".
        await fa.client.set("value:k", 1)
        await fa.publish("k")
        await until(lambda: fb.stats.messages == 1, what="the wake-up")
        assert pb.watchers_of("k") == 0
        cache["k"] = max(cache.get("k", 0), seen)
        ok = await pb.wait_for(["k"], lambda: cache["k"] > seen, 2.0)
        assert ok is True
        assert ["k"] in batches
        # Unwatched keys cost the hook a lookup each, coalesced into few calls.
        calls = len(batches)
        await fa.publish_many([f"nobody-{i % 50}" for i in range(500)])
        await fa.publish("fence")
        await until(lambda: fb.stats.messages == 502, what="the burst")
        await until(lambda: any("fence" in b for b in batches[calls:]), what="its refresh")
        burst = batches[calls:]
        assert len(burst) < 100  # coalesced: far fewer calls than the 501 wake-ups
        assert all(len(set(b)) == len(b) <= 51 for b in burst)  # each key once per batch
        print(f"\n500 wake-ups of 50 unwatched keys: {len(burst)} refresh call(s)")


async def test_notify_local_of_an_unhashable_key_is_the_callers_error(server: RedisServer) -> None:
    async with joined(server.url, "A") as (_pa, fa):
        with pytest.raises(TypeError, match="unhashable"):
            fa.notify_local(["not", "hashable"])  # type: ignore[arg-type]
        assert fa.stats.delivery_errors == 0
