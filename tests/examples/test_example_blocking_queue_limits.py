"""What the blocking-queue example (examples/blocking_queue) stores is bounded: values
per queue, bytes in total and queues, each an option; a PUSH past one gets ERR and
nothing is stored. Run for real on loopback, as a hostile client would."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from ..support import servers
from ..support.blocking_queue import SERVER, Client
from ..support.servers import rss_kib, stop_server

pytestmark = pytest.mark.anyio

Connect = Callable[[], Awaitable[Client]]


@asynccontextmanager
async def queue_server(*options: str) -> AsyncIterator[tuple[subprocess.Popen[str], Connect]]:
    """The server started with ``options``, and a way to connect clients to it."""
    process, port = servers.start_server(SERVER, r"127\.0\.0\.1:(\d+)", *options)
    clients: list[Client] = []

    async def connect() -> Client:
        client = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        clients.append(client)
        return client

    try:
        with anyio.fail_after(60):  # a regression fails instead of hanging
            yield process, connect
    finally:
        for client in clients:
            client.writer.close()
        assert stop_server(process) == 0


def name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


async def test_a_push_past_max_queue_values_gets_err_and_a_pop_makes_room() -> None:
    async with queue_server("--max-queue-values", "3") as (_, connect):
        client = await connect()
        queue = name()
        for value in ("a", "b", "c"):
            assert await client.call(f"PUSH {queue} {value}") == "OK"
        assert await client.call(f"PUSH {queue} d") == (
            f"ERR queue '{queue}' is full (at most 3 values)"
        )
        assert (await client.stats())["values"] == 3  # d was not stored
        assert await client.call(f"PUSH {name()} other") == "OK"  # other queues are not full
        assert await client.call(f"BPOP {queue} 1") == "VALUE a"
        assert await client.call(f"PUSH {queue} e") == "OK"
        popped = [await client.call(f"BPOP {queue} 1") for _ in range(3)]
        assert popped == ["VALUE b", "VALUE c", "VALUE e"]  # in order, d never there


async def test_a_queue_emptied_by_pops_stops_counting_against_max_queues() -> None:
    async with queue_server("--max-queues", "2") as (_, connect):
        client = await connect()
        first, second, third = name(), name(), name()
        assert await client.call(f"PUSH {first} 1") == "OK"
        assert await client.call(f"PUSH {first} 2") == "OK"
        assert await client.call(f"PUSH {second} 1") == "OK"
        assert await client.call(f"PUSH {second} 2") == "OK"  # an existing queue: fine
        assert await client.call(f"PUSH {third} 1") == "ERR too many queues (at most 2)"
        counts = await client.stats()
        assert (counts["queues"], counts["values"]) == (2, 4)
        # Popping some of a queue's values keeps it; popping the last one frees its name.
        assert await client.call(f"BPOP {first} 1") == "VALUE 1"
        assert await client.call(f"PUSH {third} 1") == "ERR too many queues (at most 2)"
        assert await client.call(f"BPOP {first} 1") == "VALUE 2"
        assert await client.call(f"PUSH {third} 1") == "OK"
        # A BPOP waiting on a name holds no queue; a push to it is taken, never stored,
        # so it passes at the limit.
        waiter, waited = await connect(), name()
        await waiter.send(f"BPOP {waited} 10")
        await client.stats_when(lambda stats: stats["pending"] == 1)
        assert await client.call(f"PUSH {waited} straight") == "OK"
        assert await waiter.reply() == "VALUE straight"
        # Empty again: nothing is left charged.
        for queue, value in ((second, "1"), (second, "2"), (third, "1")):
            assert await client.call(f"BPOP {queue} 1") == f"VALUE {value}"
        counts = await client.stats()
        assert (counts["queues"], counts["values"], counts["stored_bytes"]) == (0, 0, 0)


async def test_a_push_flood_past_max_stored_bytes_is_refused_and_memory_stays_bounded() -> None:
    """2000 x 64 KB (128 MB) into a 2 MB store: about 31 are stored, every other push
    gets ERR and is not kept (every one used to be answered OK and kept)."""
    limit = 2_000_000
    async with queue_server("--max-stored-bytes", str(limit)) as (process, connect):
        client = await connect()
        queue, waited = name(), name()
        assert await client.call(f"PUSH {queue} warm-up") == "OK"
        assert await client.call(f"BPOP {queue} 1") == "VALUE warm-up"
        baseline = rss_kib(process.pid)
        replies: dict[str, int] = {}
        for i in range(2000):
            reply = await client.call(f"PUSH {queue} {i:06d}" + "y" * 64_000)
            replies[reply] = replies.get(reply, 0) + 1
        growth = rss_kib(process.pid) - baseline
        full = f"ERR the server is full (at most {limit} bytes stored)"
        assert set(replies) == {"OK", full}
        assert 25 <= replies["OK"] <= 32  # (64 KB + 128) each, and the queue's charge
        counts = await client.stats()
        assert counts["values"] == replies["OK"]
        assert counts["stored_bytes"] <= limit
        print(f"RSS growth after a 128 MB flood into a 2 MB store: {growth / 1024:.1f} MiB")
        assert growth < 32 * 1024
        # Normal use goes on: a value a waiter takes at once is not stored, so it passes
        # the full store; a pop makes room for the next push.
        waiter = await connect()
        await waiter.send(f"BPOP {waited} 10")
        await client.stats_when(lambda stats: stats["pending"] == 1)
        assert await client.call(f"PUSH {waited} straight") == "OK"
        assert await waiter.reply() == "VALUE straight"
        big = f"PUSH {queue} " + "z" * 64_000
        assert await client.call(big) == full
        assert (await client.call(f"BPOP {queue} 1")).startswith("VALUE 000000y")
        assert await client.call(big) == "OK"


async def test_stored_bytes_count_utf8_bytes_and_return_to_zero() -> None:
    async with queue_server("--max-line", "1024", "--max-stored-bytes", "3000") as (_, connect):
        client = await connect()
        queue = name()  # 10 bytes: charged 1034 with the queue
        # 500 x "é" is 1000 bytes of UTF-8: charged 1128; a second one passes 3000.
        assert await client.call(f"PUSH {queue} " + "é" * 500) == "OK"
        assert await client.call(f"PUSH {queue} " + "é" * 500) == (
            "ERR the server is full (at most 3000 bytes stored)"
        )
        assert (await client.stats())["stored_bytes"] == 1034 + 1128
        assert await client.call(f"PUSH {queue} " + "e" * 500) == "OK"  # 628 more
        assert await client.call(f"BPOP {queue} 1") == "VALUE " + "é" * 500
        assert await client.call(f"BPOP {queue} 1") == "VALUE " + "e" * 500
        counts = await client.stats()
        assert (counts["queues"], counts["values"], counts["stored_bytes"]) == (0, 0, 0)


def test_bad_store_limits_are_refused_at_start() -> None:
    options = [
        ("--max-queue-values", "0"),
        ("--max-queues", "-1"),
        ("--max-stored-bytes", "0"),
        ("--max-stored-bytes", "66000"),  # below the longest line and its charges
    ]
    for option, said in zip(options, servers.refused_at_start_each(SERVER, *options), strict=True):
        assert "error: argument" in said or "error: max-" in said, option


def test_help_lists_the_store_limits_and_their_defaults() -> None:
    done = subprocess.run(
        [sys.executable, SERVER, "--help"], cwd=servers.ROOT, capture_output=True, text=True
    )
    text = " ".join(done.stdout.split())
    for option in ("--max-queue-values", "--max-stored-bytes", "--max-queues"):
        assert option in text
    assert "(default 67108864)" in text
    assert "(default 100000)" in text
