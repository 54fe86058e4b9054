"""The blocking-pop TCP example (examples/blocking_queue), run for real on loopback."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

from ..support import servers
from ..support.blocking_queue import SERVER, Client
from ..support.servers import rss_kib, stop_server


def start_server() -> tuple[subprocess.Popen[str], int]:
    """Start the server as documented on a free port; returns it and its port."""
    process, port = servers.start_server(SERVER, r"127\.0\.0\.1:(\d+)")
    return process, int(port)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    process, port = start_server()
    try:
        yield port
    finally:
        assert stop_server(process) == 0


def pending(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda stats: stats["pending"] == count


Connect = Callable[[], Awaitable[Client]]


@pytest.fixture
async def connect(port: int) -> AsyncIterator[Connect]:
    clients: list[Client] = []

    async def connect() -> Client:
        client = Client(*await asyncio.open_connection("127.0.0.1", port))
        clients.append(client)
        return client

    yield connect
    for client in clients:
        if not client.writer.is_closing():
            await client.close()


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.mark.anyio
async def test_bpop_returns_a_value_already_there(connect: Connect, queue: str) -> None:
    client = await connect()
    assert await client.call(f"PUSH {queue} hello world") == "OK"
    assert await client.call(f"BPOP {queue} 5") == "VALUE hello world"


@pytest.mark.anyio
async def test_waiters_are_served_first_come_first_served(connect: Connect, queue: str) -> None:
    control = await connect()
    waiters = [await connect() for _ in range(4)]
    for count, waiter in enumerate(waiters, 1):
        await waiter.send(f"BPOP {queue} 10")
        # Each BPOP is registered before the next is sent: their order is known.
        await control.stats_when(pending(count))
    for value in ("a", "b", "c", "d"):
        assert await control.call(f"PUSH {queue} {value}") == "OK"
    assert [await waiter.reply() for waiter in waiters] == [
        "VALUE a",
        "VALUE b",
        "VALUE c",
        "VALUE d",
    ]


@pytest.mark.anyio
async def test_one_push_wakes_one_waiter(connect: Connect, queue: str) -> None:
    control = await connect()
    first, second = await connect(), await connect()
    await first.send(f"BPOP {queue} 10")
    await control.stats_when(pending(1))
    await second.send(f"BPOP {queue} 10")
    await control.stats_when(pending(2))
    await control.call(f"PUSH {queue} only")
    assert await first.reply() == "VALUE only"
    assert (await control.stats())["pending"] == 1  # the second one still waits
    await control.call(f"PUSH {queue} next")
    assert await second.reply() == "VALUE next"


@pytest.mark.anyio
@pytest.mark.parametrize("timeout", ["1e30", "1.8e305", "1.7976931348623157e308"])
async def test_a_huge_bpop_timeout_waits_and_takes_the_next_push(
    connect: Connect, queue: str, timeout: str
) -> None:
    """It used to freeze the server (1e30) or leave an untimed orphan that ate a PUSH."""
    control = await connect()
    waiter = await connect()
    before = (await control.stats())["pending"]
    await waiter.send(f"BPOP {queue} {timeout}")
    await control.stats_when(pending(before + 1))
    assert await control.call(f"PUSH {queue} kept") == "OK"
    assert await waiter.reply() == "VALUE kept"
    await control.stats_when(pending(before))


@pytest.mark.anyio
async def test_bpop_answers_nil_at_its_timeout(connect: Connect, queue: str) -> None:
    client = await connect()
    before = await client.stats()
    started = time.monotonic()
    assert await client.call(f"BPOP {queue} 0.2") == "NIL"
    assert time.monotonic() - started >= 0.2
    after = await client.stats()
    assert after["expired"] == before["expired"] + 1
    assert after["pending"] == after["watched"] == 0


@pytest.mark.anyio
async def test_hanging_up_mid_wait_leaves_nothing_behind(connect: Connect, queue: str) -> None:
    control = await connect()
    before = await control.stats()
    leavers = [await connect() for _ in range(5)]
    for leaver in leavers:
        await leaver.send(f"BPOP {queue} 30")
    await control.stats_when(lambda s: s["pending"] == 5 and s["watched"] == 5)
    for leaver in leavers:
        await leaver.close()
    after = await control.stats_when(pending(0))
    assert after["watched"] == after["timed"] == after["keys"] == 0
    assert after["cancelled"] == before["cancelled"] + 5
    # No value goes to a client that has left.
    assert await control.call(f"PUSH {queue} kept") == "OK"
    assert await control.call(f"BPOP {queue} 1") == "VALUE kept"


@pytest.mark.anyio
async def test_commands_sent_before_hanging_up_still_run(connect: Connect, queue: str) -> None:
    control = await connect()
    client = await connect()
    client.writer.write(f"PUSH {queue} one\nPUSH {queue} two\n".encode())
    await client.close()
    assert await control.call(f"BPOP {queue} 5") == "VALUE one"
    assert await control.call(f"BPOP {queue} 5") == "VALUE two"


@pytest.mark.anyio
async def test_commands_sent_while_blocked_run_after_the_bpop(connect: Connect, queue: str) -> None:
    control = await connect()
    client = await connect()
    await client.send(f"BPOP {queue} 10\nSTATS\nPUSH {queue} own")
    await control.stats_when(pending(1))
    await control.call(f"PUSH {queue} first")
    assert await client.reply() == "VALUE first"
    assert (await client.reply()).startswith("OK {")
    assert await client.reply() == "OK"
    assert await control.call(f"BPOP {queue} 1") == "VALUE own"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"FROB q", "ERR unknown command 'FROB'"),
        (b"", "ERR empty line"),
        (b"   ", "ERR empty line"),
        (b"PUSH q", "ERR usage: PUSH queue value"),
        (b"BPOP q", "ERR usage: BPOP queue timeout"),
        (b"BPOP q 1 2", "ERR timeout must be a number of seconds >= 0, got '1 2'"),
        (b"STATS now", "ERR usage: STATS"),
        (b"BPOP q soon", "ERR timeout must be a number of seconds >= 0, got 'soon'"),
        (b"BPOP q -1", "ERR timeout must be a number of seconds >= 0, got '-1'"),
        (b"BPOP q nan", "ERR timeout must be a number of seconds >= 0, got 'nan'"),
        (b"PUSH q \xff\xfe", "ERR line is not valid UTF-8"),
        (b"x" * 70_000, "ERR line longer than 65536 bytes"),
    ],
)
@pytest.mark.anyio
async def test_malformed_lines_get_an_error_and_the_connection_stays_usable(
    connect: Connect, queue: str, line: bytes, error: str
) -> None:
    client = await connect()
    assert await client.call(line) == error
    assert await client.call(f"push {queue} still here") == "OK"
    assert await client.call(f"bpop {queue} 1") == "VALUE still here"
    assert (await client.stats())["pending"] == 0


@pytest.mark.anyio
async def test_sigterm_answers_waiters_and_exits_cleanly() -> None:
    process, port = start_server()
    try:
        client = Client(*await asyncio.open_connection("127.0.0.1", port))
        await client.send("BPOP q 30")
        await client.send("PUSH q after")
        control = Client(*await asyncio.open_connection("127.0.0.1", port))
        await control.stats_when(pending(1))
        process.send_signal(signal.SIGTERM)
        assert await client.reply() == "ERR the server is shutting down"
        assert await client.reply() == "ERR the server is shutting down"
        assert await client.reply() == ""  # then it hangs up
        assert process.wait(timeout=10) == 0
        await client.close()
        await control.close()
    finally:
        stop_server(process)


# -- as a hostile client would -----------------------------------------------------------


@pytest.mark.anyio
async def test_an_over_long_line_is_refused_whole_and_its_tail_never_runs(
    connect: Connect, queue: str
) -> None:
    """It used to answer ERR, then run the tail that came later as a command."""
    client = await connect()
    control = await connect()
    client.writer.write(f"PUSH {queue} ".encode() + b"A" * 70_000)
    await client.writer.drain()
    assert await client.reply() == "ERR line longer than 65536 bytes"
    await anyio.sleep(0.2)  # the tail arrives later, in a packet of its own
    await client.send(f"PUSH {queue}-evil x")  # ...up to the long line's newline
    await client.send(f"PUSH {queue} fine")
    assert await client.reply() == "OK"  # one reply: the tail was not a command
    assert await control.call(f"BPOP {queue}-evil 0.05") == "NIL"
    assert await control.call(f"BPOP {queue} 1") == "VALUE fine"


@pytest.mark.anyio
async def test_a_carriage_return_ends_a_line_and_is_not_kept(connect: Connect, queue: str) -> None:
    client = await connect()
    client.writer.write(f"PUSH {queue} value\r\nPUSH {queue} two words \r\n".encode())
    assert [await client.reply(), await client.reply()] == ["OK", "OK"]
    assert await client.call(f"BPOP {queue} 1\r") == "VALUE value"
    assert await client.call(f"BPOP {queue} 1") == "VALUE two words "


@pytest.mark.anyio
async def test_a_half_closed_client_gets_its_replies(connect: Connect, queue: str) -> None:
    """It used to get nothing for a BPOP sent before its EOF."""
    control = await connect()
    before = await control.stats()
    client = await connect()
    client.writer.write(f"PUSH {queue} a\nBPOP {queue} 5\nBPOP {queue} 30\n".encode())
    await client.writer.drain()
    client.writer.write_eof()  # shutdown(SHUT_WR): still reading
    started = time.monotonic()
    assert [await client.reply() for _ in range(3)] == ["OK", "VALUE a", "NIL"]
    assert time.monotonic() - started < 2  # the end of input ends the wait at once
    assert await client.reply() == ""  # and then the server hangs up
    after = await control.stats_when(lambda s: s["pending"] == before["pending"])
    assert after["watched"] == before["watched"]


@pytest.mark.anyio
async def test_a_waiter_then_half_close_is_answered_nil(connect: Connect, queue: str) -> None:
    control = await connect()
    client = await connect()
    await client.send(f"BPOP {queue} 30")
    await control.stats_when(lambda s: s["pending"] >= 1)
    client.writer.write_eof()
    assert await client.reply() == "NIL"
    assert await control.call(f"PUSH {queue} kept") == "OK"  # no value goes to it
    assert await control.call(f"BPOP {queue} 1") == "VALUE kept"


def test_bad_queue_server_options_are_refused_at_start() -> None:
    options = [
        ("--max-line", "0"),
        ("--max-timeout", "inf"),
        ("--max-timeout", "nan"),
        ("--max-timeout", "-1"),
        ("--max-timeout", "1e30"),
        ("--idle-timeout", "0"),
        ("--max-connections", "-5"),
        ("--port", "70000"),
    ]
    for option, said in zip(options, servers.refused_at_start_each(SERVER, *options), strict=True):
        assert "error:" in said, option


def test_help_lists_every_limit_and_its_default() -> None:
    done = subprocess.run(
        [sys.executable, SERVER, "--help"], cwd=servers.ROOT, capture_output=True, text=True
    )
    for option in ("--max-line", "--max-queued", "--max-connections", "--idle-timeout"):
        assert option in done.stdout
    assert "(default 65536)" in done.stdout


@pytest.mark.anyio
async def test_slowloris_and_silent_connections_are_closed_at_the_idle_timeout() -> None:
    process, port = servers.start_server(SERVER, r"127\.0\.0\.1:(\d+)", "--idle-timeout", "0.5")
    try:
        silent = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        slow = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        waiter = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        await waiter.send("BPOP q 2")  # a running command is not idleness
        for _ in range(4):  # half a line, a byte at a time
            slow.writer.write(b"P")
            await anyio.sleep(0.2)
        with anyio.fail_after(3):
            assert await silent.reader.read() == b""  # closed by the server
            assert await slow.reader.read() == b""
        assert await waiter.reply() == "NIL"  # after its full 2 s
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_connections_over_the_cap_are_refused() -> None:
    process, port = servers.start_server(SERVER, r"127\.0\.0\.1:(\d+)", "--max-connections", "3")
    try:
        clients = [Client(*await asyncio.open_connection("127.0.0.1", int(port))) for _ in range(3)]
        for client in clients:
            assert (await client.stats())["pending"] == 0
        extra = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        assert await extra.reply() == "ERR too many connections"
        assert await extra.reply() == ""
        await clients[0].close()
        await anyio.sleep(0.1)
        again = Client(*await asyncio.open_connection("127.0.0.1", int(port)))
        assert (await again.stats())["pending"] == 0
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_memory_per_idle_connection_after_long_lines_is_bounded() -> None:
    """Each of 200 clients sends long lines and a pipeline, then stays idle: the
    server's growth per connection stays under 256 KiB (it used to pin ~68 MiB)."""
    process, port = start_server()
    try:
        count = 200
        baseline = rss_kib(process.pid)
        clients = [Client(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(count)]
        for client in clients:
            client.writer.write(b"PUSH q " + b"A" * 300_000 + b"\nSTATS\n")
        for client in clients:
            await client.writer.drain()
            assert (await client.reply()).startswith("ERR line longer")
            assert (await client.reply()).startswith("OK {")
        await anyio.sleep(0.3)
        per_connection = (rss_kib(process.pid) - baseline) / count
        print(f"server RSS growth per idle connection: {per_connection:.0f} KiB")
        assert per_connection <= 256
        for client in clients:
            await client.close()
    finally:
        assert stop_server(process) == 0


def test_ten_thousand_waiters_and_a_thousand_pushes_well_under_a_second() -> None:
    """The herd: each push wakes one waiter (limit=1), first come, first served."""
    sys.path.insert(0, str(servers.ROOT / "examples" / "blocking_queue"))
    from server import QueueServer  # type: ignore[import-not-found]

    async def herd() -> float:
        queue_server = QueueServer()
        ops = [queue_server.pop("jobs", 60.0) for _ in range(10_000)]
        started = time.perf_counter()
        for i in range(1000):
            queue_server.push("jobs", str(i))
        elapsed = time.perf_counter() - started
        assert [op.result() for op in ops[:1000]] == [str(i) for i in range(1000)]
        assert not any(op.done() for op in ops[1000:])
        assert queue_server.purgatory.num_delayed() == 9000
        await queue_server.purgatory.aclose()
        return elapsed

    elapsed = asyncio.run(herd())
    print(f"10k BPOP waiters x 1k pushes: {elapsed * 1e3:.1f} ms")
    assert elapsed < 0.25
