"""The long-poll HTTP example (examples/long_poll), run for real on loopback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import anyio
import pytest

from ..support import servers
from ..support.servers import ROOT, stop_server

SERVER = "examples/long_poll/server.py"


def start_server(*options: str) -> tuple[subprocess.Popen[str], str]:
    """Start the server as documented on a free port; returns it and its base URL."""
    return servers.start_server(SERVER, r"(http://127\.0\.0\.1:\d+)", *options)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    process, url = start_server("--max-timeout", "10")
    try:
        yield url
    finally:
        assert stop_server(process) == 0


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


async def stats(session: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    async with session.get(f"{base_url}/stats") as response:
        assert response.status == 200
        result: dict[str, Any] = await response.json()
        return result


async def stats_when(
    session: aiohttp.ClientSession, base_url: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The server's counts once ``condition`` holds (fails after 5 s)."""
    with anyio.fail_after(5):
        while not condition(current := await stats(session, base_url)):  # noqa: ASYNC110
            await anyio.sleep(0.01)  # the server is another process: nothing to wait on
    return current


async def poll(
    session: aiohttp.ClientSession, url: str, **params: str | float
) -> tuple[int, Any, float]:
    """GET a long poll; returns the status, the JSON body (or None) and the seconds taken."""
    started = time.monotonic()
    async with session.get(url, params={k: str(v) for k, v in params.items()}) as response:
        body = await response.json() if response.status == 200 else None
        return response.status, body, time.monotonic() - started


async def publish(session: aiohttp.ClientSession, url: str, message: str) -> int:
    async with session.post(url, data=message.encode()) as response:
        assert response.status == 200
        offset: int = (await response.json())["offset"]
        return offset


@pytest.mark.anyio
async def test_a_waiting_poll_wakes_up_on_publish(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    url = f"{base_url}/topics/{topic}"
    async with anyio.create_task_group() as tg:
        results: list[tuple[int, Any, float]] = []

        async def waiter() -> None:
            results.append(await poll(session, url, timeout=8))

        tg.start_soon(waiter)
        await stats_when(session, base_url, lambda s: s["pending"] == 1 and s["watched"] == 1)
        assert await publish(session, url, "hello") == 0
    [(status, body, seconds)] = results
    assert status == 200
    assert body == {"messages": [{"offset": 0, "value": "hello"}]}
    assert seconds < 4


@pytest.mark.anyio
async def test_messages_already_there_are_returned_at_once(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    url = f"{base_url}/topics/{topic}"
    for message in ("a", "b", "c"):
        await publish(session, url, message)
    status, body, seconds = await poll(session, url, after=0, timeout=8)
    assert status == 200
    assert body == {"messages": [{"offset": 1, "value": "b"}, {"offset": 2, "value": "c"}]}
    assert seconds < 4


@pytest.mark.anyio
async def test_a_poll_times_out_with_204(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    before = await stats(session, base_url)
    status, body, seconds = await poll(session, f"{base_url}/topics/{topic}", timeout=0.2)
    assert (status, body) == (204, None)
    assert seconds >= 0.2
    after = await stats(session, base_url)
    assert after["expired"] == before["expired"] + 1
    assert after["pending"] == after["watched"] == 0


@pytest.mark.anyio
async def test_the_timeout_is_capped_by_the_server() -> None:
    process, url = start_server("--max-timeout", "0.2")
    try:
        async with aiohttp.ClientSession() as session:
            status, _, seconds = await poll(session, f"{url}/topics/quiet", timeout=60)
        assert status == 204
        assert 0.2 <= seconds < 5
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_every_waiter_on_a_topic_is_woken(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    url = f"{base_url}/topics/{topic}"
    results: list[tuple[int, Any, float]] = []

    async def waiter() -> None:
        results.append(await poll(session, url, timeout=8))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(waiter)
        await stats_when(session, base_url, lambda s: s["pending"] == 5)
        await publish(session, url, "to all")
    assert [(status, body) for status, body, _ in results] == [
        (200, {"messages": [{"offset": 0, "value": "to all"}]})
    ] * 5


@pytest.mark.anyio
async def test_clients_that_hang_up_leave_nothing_behind(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    url = f"{base_url}/topics/{topic}"
    before = await stats(session, base_url)

    async def waiter() -> None:
        await poll(session, url, timeout=8)
        pytest.fail("the poll should have been abandoned")

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(waiter)
        await stats_when(session, base_url, lambda s: s["pending"] == 10 and s["watched"] == 10)
        tg.cancel_scope.cancel()  # the clients hang up mid-wait
    after = await stats_when(session, base_url, lambda s: s["pending"] == 0)
    assert after["watched"] == after["timed"] == after["keys"] == 0
    assert after["cancelled"] == before["cancelled"] + 10
    # The topic still works for the next client.
    await publish(session, url, "later")
    status, body, _ = await poll(session, url, timeout=8)
    assert (status, body) == (200, {"messages": [{"offset": 0, "value": "later"}]})


@pytest.mark.anyio
async def test_a_poll_after_a_hang_up_still_times_out(
    session: aiohttp.ClientSession, base_url: str, topic: str
) -> None:
    url = f"{base_url}/topics/{topic}"
    # Same timeout, moments apart: both land in one timer bucket, which the hang-up
    # empties; the second poll must still get its wake-up.
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: poll(session, url, timeout=0.5))
        await stats_when(session, base_url, lambda s: s["pending"] == 1)
        tg.cancel_scope.cancel()
    await stats_when(session, base_url, lambda s: s["pending"] == 0)
    with anyio.fail_after(5):
        status, _, seconds = await poll(session, url, timeout=0.5)
    assert status == 204
    assert seconds >= 0.5


@pytest.mark.parametrize(
    ("method", "query", "body", "error"),
    [
        ("GET", "after=x", None, "after must be an integer"),
        ("GET", "after=-2", None, "after must be between -1 and -1"),
        ("GET", "after=0", None, "after must be between -1 and -1"),
        ("GET", "timeout=soon", None, "timeout must be a number"),
        ("GET", "timeout=-1", None, "timeout must be a number"),
        ("GET", "timeout=nan", None, "timeout must be a number"),
        ("GET", "timeout=inf", None, "timeout must be a number"),
        ("POST", "", b"\xff\xfe", "UTF-8"),
        ("POST", "", b"", "must not be empty"),
    ],
)
@pytest.mark.anyio
async def test_bad_input_gets_400(
    session: aiohttp.ClientSession,
    base_url: str,
    topic: str,
    method: str,
    query: str,
    body: bytes | None,
    error: str,
) -> None:
    url = f"{base_url}/topics/{topic}?{query}"
    async with session.request(method, url, data=body) as response:
        assert response.status == 400
        assert error in await response.text()
    assert (await stats(session, base_url))["pending"] == 0


@pytest.mark.anyio
async def test_metrics_in_prometheus_format(session: aiohttp.ClientSession, base_url: str) -> None:
    try:
        import aiopurgatory.metrics  # noqa: F401
    except ImportError:
        expected = 404
    else:
        expected = 200
    async with session.get(f"{base_url}/metrics") as response:
        assert response.status == expected
        if expected == 200:
            assert response.content_type == "text/plain"
            text = await response.text()
            assert 'aiopurgatory_operations_pending{purgatory="long-poll"}' in text
            assert "# TYPE aiopurgatory_operations_total counter" in text


@pytest.mark.anyio
async def test_sigterm_answers_waiting_polls_and_exits_cleanly() -> None:
    process, url = start_server()
    try:
        async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
            results: list[int] = []

            async def waiter() -> None:
                results.append((await poll(session, f"{url}/topics/t", timeout=20))[0])

            tg.start_soon(waiter)
            await stats_when(session, url, lambda s: s["pending"] == 1)
            process.send_signal(signal.SIGTERM)
        assert results == [503]
        assert process.wait(timeout=10) == 0
    finally:
        stop_server(process)


def test_load_script_against_the_aiohttp_server_loses_nothing(base_url: str) -> None:
    command = [sys.executable, "examples/long_poll/load.py", "--url", base_url]
    command += ["--clients", "60", "--duration", "1", "--poll-timeout", "0.3", "--rate", "20"]
    command += ["--ramp-limit", "10"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(re.findall(r"^(\w[\w ]*?):\s+(\d+)", done.stdout, re.MULTILINE))
    assert int(figures["answered"]) > 0
    assert int(figures["disconnected"]) == 12  # 20% of the clients
    assert int(figures["lost"]) == 0
    assert "pending 0, watched 0" in done.stdout
