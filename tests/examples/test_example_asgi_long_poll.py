"""The Starlette long-poll example and aiopurgatory.asgi, under uvicorn and hypercorn
for real on loopback, driven by httpx (and the thousand polls by plain sockets)."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

import aiopurgatory as ap
from aiopurgatory.asgi import CancelOnDisconnect, Message, PurgatoryLifespan, Scope

from ..support import servers
from ..support.servers import ROOT, stop_server

SCRIPT = "examples/asgi_long_poll/server.py"
APP = "examples.asgi_long_poll.server:app"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_module_server(kind: str) -> tuple[subprocess.Popen[str], str]:
    """``uvicorn APP`` or ``hypercorn APP`` as documented; returns it and its URL."""
    port = free_port()
    if kind == "uvicorn":
        command = ["-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port)]
    else:
        # Hypercorn closes a connection idle for --keep-alive seconds (5 by default),
        # the time before its first request included: a loaded machine opening a
        # thousand connections took longer than that between a connect and its
        # request, and every poll got "Server disconnected" (seen in CI runs).
        command = ["-m", "hypercorn", APP, "--bind", f"127.0.0.1:{port}", "--keep-alive", "60"]
    process = subprocess.Popen([sys.executable, *command], cwd=ROOT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/stats").raise_for_status()
            return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    stop_server(process)
    pytest.fail(f"{kind} did not start")


@pytest.fixture(scope="module", params=["script", "uvicorn", "hypercorn"])
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "script":
        process, url = servers.start_server(SCRIPT, r"(http://127\.0\.0\.1:\d+)")
    else:
        process, url = start_module_server(request.param)
    try:
        yield url
    finally:
        stop_server(process)


async def raw_get(url: str, path: str) -> int:
    """GET ``path`` on a connection of its own, closed after the answer or on
    cancellation (the client hanging up); returns the status code.

    For the thousand polls, whose subject is the servers' side: httpx spent 10-13 CPU-s
    of the test process on them per run, these sockets 2-4 (issue 46)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        status = await reader.readline()  # HTTP/1.1 200 OK
        await reader.read()  # the headers and body, to the server's close
        return int(status.split()[1])
    finally:
        writer.close()


async def stats(client: httpx.AsyncClient) -> dict[str, Any]:
    result: dict[str, Any] = (await client.get("/stats")).json()
    return result


@pytest.mark.anyio
async def test_a_thousand_polls_a_fifth_hanging_up_leave_nothing(base_url: str) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    # The bounds below only stop a hung run: on a loaded machine (two test workers on two
    # cores, the pure build) a thousand connections take many seconds to open.
    timeout = httpx.Timeout(90.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        before = await stats(client)
        results: list[int] = []

        async def poll() -> None:
            # 30 s: the servers' cap (max_timeout); 90 s only stops a hung run
            with anyio.fail_after(90):
                results.append(await raw_get(base_url, f"/topics/{topic}?timeout=30"))

        async with anyio.create_task_group() as tg:
            scopes = []
            for _ in range(1000):
                scope = anyio.CancelScope()
                scopes.append(scope)

                async def run(scope: anyio.CancelScope = scope) -> None:
                    with scope:
                        await poll()

                tg.start_soon(run)
            with anyio.fail_after(60):
                while (await stats(client))["pending"] < before["pending"] + 1000:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            for scope in scopes[:200]:  # a fifth hang up mid-wait
                scope.cancel()
            with anyio.fail_after(30):
                while (await stats(client))["pending"] > before["pending"] + 800:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert (await client.post(f"/topics/{topic}", content=b"news")).status_code == 200
        after = await stats(client)
        metrics = (await client.get("/metrics")).text
    assert results == [200] * 800
    assert after["pending"] == after["watched"] == 0
    assert after["cancelled"] - before["cancelled"] == 200
    # The collector observes the lifespan's purgatory: the hang-ups are counted.
    cancelled = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("aiopurgatory_operations_total{") and 'outcome="cancelled"' in line
    ]
    assert sum(cancelled) >= 200
    assert "aiopurgatory_operations_pending" in metrics


def test_load_script_against_the_asgi_servers_loses_nothing(base_url: str) -> None:
    command = [sys.executable, "examples/long_poll/load.py", "--url", base_url]
    command += ["--clients", "60", "--duration", "1", "--poll-timeout", "0.3", "--rate", "20"]
    command += ["--ramp-limit", "10"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(re.findall(r"^(\w[\w ]*?):\s+(\d+)", done.stdout, re.MULTILINE))
    assert int(figures["lost"]) == 0
    assert "pending 0, watched 0" in done.stdout


@pytest.mark.parametrize("how", ["script", "uvicorn"])
@pytest.mark.anyio
async def test_sigterm_answers_waiting_polls_503_and_exits_promptly(how: str) -> None:
    """Servers wait for open requests before the lifespan's shutdown: without closing
    the purgatory on the signal, the polls held it up until their timeouts."""
    if how == "script":
        process, url = servers.start_server(SCRIPT, r"(http://127\.0\.0\.1:\d+)")
    else:
        process, url = start_module_server(how)
    try:
        client = httpx.AsyncClient(base_url=url, timeout=30)
        async with client, anyio.create_task_group() as tg:
            codes: list[int] = []

            async def poll() -> None:
                codes.append((await client.get("/topics/x", params={"timeout": 25})).status_code)

            for _ in range(5):
                tg.start_soon(poll)
            with anyio.fail_after(10):
                while (await stats(client))["pending"] < 5:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
        assert codes == [503] * 5
        assert time.monotonic() - started < 2.5
        process.wait(timeout=5)
        assert time.monotonic() - started < 3.5
        if how == "script":
            assert process.returncode == 0
    finally:
        stop_server(process)


# -- the middleware and the lifespan, in process ------------------------------------------


async def long_poll_app(scope: Scope, receive: Any, send: Any) -> None:
    """A naive handler: waits on the purgatory, never looking at receive()."""
    purgatory: ap.Purgatory = scope["state"]["purgatory"]
    arrived = await purgatory.wait_for(["k"], lambda: False, 30.0)
    await send({"type": "http.response.start", "status": 200 if arrived else 204})
    await send({"type": "http.response.body", "body": b""})


async def run_requests(app: Any, purgatory: ap.Purgatory, count: int) -> int:
    """``count`` requests whose clients hang up while they wait; returns pending after."""

    async def one() -> None:
        messages: asyncio.Queue[Message] = asyncio.Queue()
        messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        scope = {"type": "http", "state": {"purgatory": purgatory}}
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        task = asyncio.create_task(app(scope, messages.get, send))
        await asyncio.sleep(0.05)
        messages.put_nowait({"type": "http.disconnect"})  # as uvicorn does on a hang-up
        await asyncio.wait([task], timeout=0.2)
        assert not sent
        task.cancel()  # leave the naive one's handler to the server

    await asyncio.gather(*(one() for _ in range(count)))
    await asyncio.sleep(0.01)
    return purgatory.num_delayed()


@pytest.mark.anyio
async def test_cancel_on_disconnect_takes_the_waits_out_a_naive_app_leaks() -> None:
    async with ap.Purgatory("naive") as purgatory:
        # The naive app's handlers stay parked, as uvicorn leaves them: 5 of 5 leak.
        naive_tasks_pending = await _leaked(long_poll_app, purgatory)
        assert naive_tasks_pending == 5
    async with ap.Purgatory("cancelled") as purgatory:
        assert await run_requests(CancelOnDisconnect(long_poll_app), purgatory, 5) == 0
        assert purgatory.stats.cancelled == 5


async def _leaked(app: Any, purgatory: ap.Purgatory) -> int:
    tasks = []
    for _ in range(5):
        messages: asyncio.Queue[Message] = asyncio.Queue()
        messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        messages.put_nowait({"type": "http.disconnect"})
        scope = {"type": "http", "state": {"purgatory": purgatory}}

        async def send(message: Message) -> None:
            pass

        tasks.append(asyncio.create_task(app(scope, messages.get, send)))
    await asyncio.sleep(0.1)
    leaked = purgatory.num_delayed()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return leaked


@pytest.mark.anyio
async def test_the_middleware_passes_the_body_and_the_response_through() -> None:
    async def echo(scope: Scope, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": body})

    transport = httpx.ASGITransport(app=CancelOnDisconnect(echo))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/", content=b"hello " * 1000)
    assert response.content == b"hello " * 1000


@pytest.mark.anyio
async def test_the_lifespan_opens_and_closes_the_purgatory() -> None:
    lifespan = PurgatoryLifespan("p", purge_interval=100)
    assert lifespan.purgatory is None, "opened before the app starts"
    async with lifespan(object()) as state:
        purgatory: ap.Purgatory = state["purgatory"]
        assert purgatory.name == "p"
        assert repr(purgatory)  # open: usable
        waiter = asyncio.ensure_future(purgatory.wait_for(["k"], lambda: False, 30))
        await asyncio.sleep(0)
    assert purgatory.closed
    with pytest.raises(ap.PurgatoryClosed):
        await waiter


def test_the_readme_fastapi_variant_runs() -> None:
    readme = (ROOT / "examples" / "asgi_long_poll" / "README.md").read_text()
    # The guide's jobs.py (tests/docs/test_readme.py runs it with its test_jobs.py).
    (block,) = re.findall(r"<!-- file: jobs.py -->\n```python\n(.*?)```", readme, flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    paths = {getattr(route, "path", None) for route in namespace["app"].routes}
    assert {"/jobs/{job}/wait", "/jobs/{job}/done", "/metrics"} <= paths
