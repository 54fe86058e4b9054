"""Both long-poll servers (aiohttp and Starlette under uvicorn) as a hostile client
would meet them on loopback: every limit is an option and holds."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import anyio
import httpx
import pytest

from ..support import servers
from ..support.servers import rss_kib, stop_server

SERVERS = ["examples/long_poll/server.py", "examples/asgi_long_poll/server.py"]
ADDRESS = r"(http://127\.0\.0\.1:\d+)"


@pytest.fixture(params=SERVERS, ids=["aiohttp", "uvicorn"])
def script(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def start(script: str, *options: str) -> tuple[subprocess.Popen[str], str]:
    return servers.start_server(script, ADDRESS, *options)


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _capped(script: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process, url = start(
        script,
        *("--max-message-bytes", "65536", "--max-retained-bytes", "2000000"),
        *("--max-response-bytes", "200000", "--max-topics", "50", "--topic-ttl", "0.5"),
        *("--max-timeout", "1"),
    )
    try:
        yield process, url
    finally:
        assert stop_server(process) == 0


@pytest.fixture
def capped(script: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    yield from _capped(script)


@pytest.fixture(scope="module", params=SERVERS, ids=["aiohttp", "uvicorn"])
def capped_shared(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """One capped server per script for tests whose requests change nothing in it (a
    server start is 0.6 CPU-s; issue 46)."""
    yield from _capped(request.param)


def test_bad_http_server_options_are_refused_at_start(script: str) -> None:
    options = [
        ("--max-timeout", "inf"),
        ("--max-timeout", "nan"),
        ("--max-timeout", "-1"),
        ("--max-timeout", "1e30"),
        ("--idle-timeout", "0"),
        ("--body-timeout", "0"),
        ("--body-timeout", "nan"),
        ("--max-message-bytes", "0"),
        ("--max-retained-bytes", "10", "--max-message-bytes", "100"),
        ("--max-connections", "-1"),
        ("--port", "70000"),
    ]
    # One interpreter for the eleven (issue 46): each start imports the server's framework.
    for said in servers.refused_at_start_each(script, *options):
        assert "error:" in said


def test_help_lists_every_limit_with_its_default(script: str) -> None:
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=servers.ROOT, capture_output=True, text=True
    )
    text = " ".join(done.stdout.split())
    for option in (
        "--max-message-bytes",
        "--max-retained-bytes",
        "--max-topics",
        "--topic-ttl",
        "--max-response-bytes",
        "--max-timeout",
        "--max-connections",
        "--idle-timeout",
        "--body-timeout",
    ):
        assert option in text
    assert "(default 67108864)" in text


def test_help_says_which_timeout_bounds_the_headers_and_which_the_body(script: str) -> None:
    # --idle-timeout's help used to claim "a connection without a complete request",
    # a body that never arrives included, which --body-timeout bounds.
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=servers.ROOT, capture_output=True, text=True
    )
    text = " ".join(done.stdout.split())
    # The last mention of each option is its entry (the first is in the usage line).
    idle = text.rsplit("--idle-timeout IDLE_TIMEOUT", 1)[1].split("--body-timeout BODY", 1)[0]
    body = text.rsplit("--body-timeout BODY_TIMEOUT", 1)[1]
    assert "headers are all in" in idle
    assert "the body is --body-timeout's" in idle
    assert "once its headers are in, a body that never arrives included" in body


def test_a_message_over_the_limit_gets_413(
    capped: tuple[subprocess.Popen[str], str], topic: str
) -> None:
    _, url = capped
    with httpx.Client(base_url=url) as client:
        assert client.post(f"/topics/{topic}", content=b"x" * 65_537).status_code == 413
        assert client.post(f"/topics/{topic}", content=b"x" * 65_536).json() == {"offset": 0}


def test_a_publish_flood_is_bounded_and_oldest_dropped_first(
    capped: tuple[subprocess.Popen[str], str], topic: str
) -> None:
    """300 x 60 KiB (18 MB) into a 2 MB retention: the oldest go, offsets keep growing,
    a GET from a dropped offset gets what is retained, and the server stays small."""
    process, url = capped
    with httpx.Client(base_url=url) as client:
        client.post(f"/topics/{topic}", content=b"warm-up")
        baseline = rss_kib(process.pid)
        for i in range(300):
            response = client.post(f"/topics/{topic}", content=b"%06d" % i + b"y" * 60_000)
            assert response.json() == {"offset": i + 1}
        growth = rss_kib(process.pid) - baseline
        got = client.get(f"/topics/{topic}", params={"after": -1, "timeout": 0})
        messages = got.json()["messages"]
        assert messages[0]["offset"] > 250  # about 32 fit in 2 MB: the oldest went
        assert messages[0]["value"].startswith(f"{messages[0]['offset'] - 1:06d}")
        # One response holds at most max_response_bytes of messages (and one at least).
        assert len(got.content) <= 200_000 + 1_000
        assert messages[-1]["offset"] < 300
        rest = client.get(
            f"/topics/{topic}", params={"after": messages[-1]["offset"], "timeout": 0}
        )
        assert rest.json()["messages"][0]["offset"] == messages[-1]["offset"] + 1
    print(f"RSS growth after an 18 MB flood into a 2 MB retention: {growth / 1024:.1f} MiB")
    assert growth < 24 * 1024


def test_topics_are_capped_and_idle_ones_expire(
    capped: tuple[subprocess.Popen[str], str], topic: str
) -> None:
    _, url = capped
    with httpx.Client(base_url=url) as client:
        for i in range(50):
            assert client.post(f"/topics/{topic}-{i}", content=b"m").status_code == 200
        refused = client.post(f"/topics/{topic}-new", content=b"m")
        assert refused.status_code == 503
        assert "too many topics" in refused.text
        time.sleep(0.7)  # past --topic-ttl: the 50 expire
        assert client.post(f"/topics/{topic}-new", content=b"m").json() == {"offset": 0}
        # An expired topic starts again; an offset it had gets 400.
        gone = client.get(f"/topics/{topic}-0", params={"after": 0, "timeout": 0})
        assert gone.status_code == 400


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "-inf", "soon"])
def test_absurd_poll_timeouts_get_400(
    capped_shared: tuple[subprocess.Popen[str], str], topic: str, timeout: str
) -> None:
    _, url = capped_shared
    with httpx.Client(base_url=url) as client:
        got = client.get(f"/topics/{topic}", params={"timeout": timeout})
        assert got.status_code == 400


def test_a_huge_poll_timeout_gets_the_cap(
    capped: tuple[subprocess.Popen[str], str], topic: str
) -> None:
    _, url = capped
    with httpx.Client(base_url=url, timeout=30) as client:
        started = time.monotonic()
        got = client.get(f"/topics/{topic}", params={"timeout": "1e30"})
        assert got.status_code == 204
        assert 0.9 < time.monotonic() - started < 4  # --max-timeout 1


@pytest.mark.anyio
async def test_slowloris_connections_are_closed_at_the_idle_timeout(script: str) -> None:
    process, url = start(script, "--idle-timeout", "0.5")
    port = int(url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            slow.settimeout(5)
            for _ in range(3):  # a header line now and then: never complete
                await anyio.sleep(0.2)
                try:
                    slow.sendall(b"X-a: b\r\n")
                except OSError:
                    break
            data = b""
            try:
                while chunk := slow.recv(4096):
                    data += chunk
            except ConnectionResetError:
                pass
            assert time.monotonic() - started < 3
            assert b"200" not in data
    finally:
        assert stop_server(process) == 0


def test_connections_over_the_cap_get_503(script: str, topic: str) -> None:
    process, url = start(script, "--max-connections", "3")
    try:
        held = [
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) for _ in range(3)
        ]
        time.sleep(0.2)
        with httpx.Client(base_url=url) as client:
            assert client.get("/stats").status_code == 503
        for sock in held:
            sock.close()
        time.sleep(0.3)
        with httpx.Client(base_url=url) as client:
            assert client.get("/stats").status_code == 200
    finally:
        assert stop_server(process) == 0


# -- a body that never arrives -------------------------------------------------------

HOSTILE_POST = b"POST /topics/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"


async def hostile_post(port: int, topic: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Complete headers, Content-Length: 100 and 3 bytes of body; then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HOSTILE_POST % topic.encode())
    await writer.drain()
    return reader, writer


async def trickle(writer: asyncio.StreamWriter) -> None:
    """One more byte of the body now and then: never silent, never done."""
    try:
        for _ in range(40):
            await anyio.sleep(0.2)
            if writer.is_closing():
                return
            writer.write(b"x")
            await writer.drain()
    except OSError:
        pass  # closed by the server


async def closed_after(reader: asyncio.StreamReader, started: float) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and when it closed it."""
    data = b""
    with anyio.fail_after(8):  # it used to stay open for ever
        try:
            while chunk := await reader.read(4096):
                data += chunk
        except OSError:  # reset, or a broken pipe the trickler met
            pass
    return data, time.monotonic() - started


@pytest.mark.anyio
async def test_a_body_that_never_arrives_is_cut_off_and_its_slot_freed(
    script: str, topic: str
) -> None:
    """Two clients send headers and part of a body, one stalling, one trickling a byte
    at a time, and so hold both slots of --max-connections 2: each gets 408 and is
    closed at --body-timeout, and the next client is served. They used to be held for
    ever and lock everyone out."""
    process, url = start(script, "--body-timeout", "1", "--max-connections", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        started = time.monotonic()
        stalled = await hostile_post(port, topic)
        trickling = await hostile_post(port, topic)
        trickler = asyncio.ensure_future(trickle(trickling[1]))
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/stats")).status_code == 503  # both slots held
            for reader, _ in (stalled, trickling):
                data, elapsed = await closed_after(reader, started)
                assert data.startswith(b"HTTP/1.1 408"), data
                assert b"did not arrive within 1 s" in data
                assert 0.9 < elapsed < 4
            trickler.cancel()
            await asyncio.wait([trickler])
            for _, writer in (stalled, trickling):
                writer.close()
            await anyio.sleep(0.2)  # the server sees the slots free
            # Served again; the partial bodies were never published.
            posted = await client.post(f"/topics/{topic}", content=b"whole")
            assert posted.json() == {"offset": 0}
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_a_body_a_handler_leaves_unread_is_not_waited_for(script: str) -> None:
    """GET /stats with a body that never arrives: answered, then closed within the
    timeouts (aiohttp used to drain such a body for 10 s, whatever the options)."""
    process, url = start(script, "--body-timeout", "1", "--idle-timeout", "1")
    port = int(url.rsplit(":", 1)[1])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(b"GET /stats HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        data, elapsed = await closed_after(reader, started)
        assert data.startswith(b"HTTP/1.1 200"), data
        assert elapsed < 4
        writer.close()
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_a_slow_body_within_the_body_timeout_is_taken(script: str, topic: str) -> None:
    process, url = start(script, "--body-timeout", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /topics/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsl" % topic.encode()
        )
        for part in (b"ow", b"ly"):
            await anyio.sleep(0.3)
            writer.write(part)
        with anyio.fail_after(5):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
        async with httpx.AsyncClient(base_url=url) as client:
            got = await client.get(f"/topics/{topic}", params={"after": -1, "timeout": 0})
            assert got.json()["messages"] == [{"offset": 0, "value": "slowly"}]
    finally:
        assert stop_server(process) == 0


def start_hypercorn(app: str) -> tuple[subprocess.Popen[str], int]:
    """``hypercorn examples.asgi_long_poll.server:<app>`` on a free port (hypercorn
    evaluates what follows the colon, so the app may be made with other limits)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    app = f"examples.asgi_long_poll.server:{app}"
    command = [sys.executable, "-m", "hypercorn", app, "--bind", f"127.0.0.1:{port}"]
    return subprocess.Popen(command, cwd=servers.ROOT, text=True), port


@pytest.mark.anyio
async def test_a_body_that_never_arrives_is_cut_off_under_hypercorn(topic: str) -> None:
    """Hypercorn bounds no body either (its --read-timeout bounds each silence, which
    a trickle never reaches): the app's own deadline holds under it too."""
    process, port = start_hypercorn("create_app(Limits(body_timeout=1.0))")
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url) as client:
            with anyio.fail_after(15):
                while True:
                    try:
                        (await client.get("/stats")).raise_for_status()
                        break
                    except httpx.HTTPError:
                        await anyio.sleep(0.1)
            started = time.monotonic()
            stalled = await hostile_post(port, topic)
            trickling = await hostile_post(port, topic)
            trickler = asyncio.ensure_future(trickle(trickling[1]))
            for reader, _ in (stalled, trickling):
                data, elapsed = await closed_after(reader, started)
                assert data.startswith(b"HTTP/1.1 408"), data
                assert 0.9 < elapsed < 4
            trickler.cancel()
            await asyncio.wait([trickler])
            for _, writer in (stalled, trickling):
                writer.close()
            posted = await client.post(f"/topics/{topic}", content=b"whole")
            assert posted.json() == {"offset": 0}
    finally:
        assert stop_server(process) == 0
