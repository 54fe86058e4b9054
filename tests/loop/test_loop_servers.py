"""The wheel loop under real servers and test runners, as docs/guides/loop.md has it.

The guide's files (``<!-- file: NAME -->`` blocks: the app, the serve scripts, the
gunicorn configuration, the worker class, the conftest) are written as printed into a
fresh directory, and each server is started there in a subprocess with the guide's
command line, on a free loopback port. The app refuses to start on any loop but a
wheel loop, and answers each request (which runs an ``asyncio.timeout`` and a sleep)
with ``is_wheel_loop(asyncio.get_running_loop())`` and its process id: a test passes
when every answer says wheel loop, from every worker process. The controls show that
the check bites: the same app without the recipe does not start.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aiopurgatory.loop import wheel_loop_class

from ..support.doc_blocks import python_blocks
from ..support.servers import ROOT

GUIDE = ROOT / "docs" / "guides" / "loop.md"
FACTORY = "aiopurgatory.loop:new_event_loop"
START_TIMEOUT = 20.0  # seconds: a server's first answer, two workers on a loaded machine
BOTH_WORKERS_TIMEOUT = 15.0  # seconds of requests until both workers have answered

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("httpx") is None, reason="httpx drives the servers"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    """A directory holding the guide's files, as a reader saves them."""
    files = [b for b in python_blocks(GUIDE) if b.file is not None]
    assert {"wheel_app.py", "conftest.py"} <= {b.file for b in files}
    for block in files:
        (tmp_path / str(block.file)).write_text(block.code)
    return tmp_path


def environment(directory: Path) -> dict[str, str]:
    """The reader's directory first (its modules), then this checkout's aiopurgatory."""
    path = [str(directory), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@dataclass(frozen=True)
class Case:
    needs: tuple[str, ...]
    command: str  # the arguments of python, as in a shell; {port} is the free port
    workers: int = 1


CASES = {
    "uvicorn-loop-option": Case(
        ("uvicorn",),
        f"-m uvicorn wheel_app:app --host 127.0.0.1 --port {{port}} --loop {FACTORY}",
    ),
    "uvicorn-loop-option-2-workers": Case(
        ("uvicorn",),
        f"-m uvicorn wheel_app:app --host 127.0.0.1 --port {{port}} --loop {FACTORY} --workers 2",
        workers=2,
    ),
    "uvicorn-run": Case(
        ("uvicorn",),
        '-c \'import uvicorn; uvicorn.run("wheel_app:app", host="127.0.0.1", port={port}, '
        f'loop="{FACTORY}")\'',
    ),
    "uvicorn-server-serve": Case(("uvicorn",), "serve_uvicorn.py {port}"),
    "hypercorn-command-line": Case(
        ("hypercorn",),
        "-m hypercorn wheel_hypercorn:app --worker-class asyncio --bind 127.0.0.1:{port}",
    ),
    "hypercorn-command-line-2-workers": Case(
        ("hypercorn",),
        "-m hypercorn wheel_hypercorn:app --worker-class asyncio --bind 127.0.0.1:{port} "
        "--workers 2",
        workers=2,
    ),
    "hypercorn-asyncio-serve": Case(("hypercorn",), "serve_hypercorn.py {port}"),
    "gunicorn-asgi-worker": Case(
        ("gunicorn",),
        "-m gunicorn wheel_app:app -c gunicorn_conf.py -w 2 -k asgi --asgi-loop asyncio",
        workers=2,
    ),
    "gunicorn-aiohttp-worker": Case(
        ("gunicorn", "aiohttp"),
        "-m gunicorn wheel_aiohttp:app -c gunicorn_conf.py -w 2 -k aiohttp.GunicornWebWorker",
        workers=2,
    ),
    "gunicorn-uvicorn-worker": Case(
        ("gunicorn", "uvicorn"),
        "-m gunicorn wheel_app:app -w 2 -k wheel_workers.WheelUvicornWorker",
        workers=2,
    ),
}


def needs(*modules: str) -> None:
    for module in modules:
        pytest.importorskip(module)


def command(case: Case, port: int) -> list[str]:
    args = shlex.split(case.command.replace("{port}", str(port)))
    if "gunicorn" in args:
        # Its default of 30 s to finish requests would only slow down the stop.
        args += ["-b", f"127.0.0.1:{port}", "--graceful-timeout", "2"]
    return [sys.executable, *args]


def start(args: list[str], directory: Path, port: int) -> Server:
    """Starts ``args`` in ``directory``; returns once it answers, or once it has exited."""
    import httpx

    log = directory / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=directory, env=environment(directory), stdout=out, stderr=out
        )
    server = Server(process, f"http://127.0.0.1:{port}/", log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(server.url, timeout=2.0).raise_for_status()
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    return server


def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL if it has not exited in 10 s."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture
def served(recipes: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        stop(server)


def answers(server: Server, workers: int) -> list[dict[str, Any]]:
    """Requests on fresh connections until ``workers`` processes have answered."""
    import httpx

    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + BOTH_WORKERS_TIMEOUT
    while len({a["pid"] for a in seen}) < workers or len(seen) < 3:
        assert time.monotonic() < deadline, f"answers from fewer than {workers}: {seen}"
        response = httpx.get(server.url, headers={"connection": "close"}, timeout=5.0)
        response.raise_for_status()
        seen.append(response.json())
    return seen


@pytest.mark.parametrize("name", list(CASES))
def test_every_answer_comes_from_a_wheel_loop(
    name: str, recipes: Path, served: list[Server]
) -> None:
    case = CASES[name]
    needs(*case.needs)
    port = free_port()
    server = start(command(case, port), recipes, port)
    served.append(server)
    assert server.process.poll() is None, f"{name} did not start:\n{server.output()}"
    seen = answers(server, case.workers)
    assert all(a["wheel"] for a in seen), seen
    assert {a["loop"] for a in seen} == {wheel_loop_class().__qualname__}, seen
    assert len({a["pid"] for a in seen}) == case.workers, seen


CONTROLS = {
    # uvicorn's own choice (uvloop when installed, else asyncio's selector loop).
    "uvicorn-without-loop-option": Case(
        ("uvicorn",), "-m uvicorn wheel_app:app --host 127.0.0.1 --port {port}"
    ),
    # The app module itself, without the module that calls install() first.
    "hypercorn-without-install": Case(
        ("hypercorn",), "-m hypercorn wheel_app:app --bind 127.0.0.1:{port}"
    ),
    # The hook is what makes the worker's loop a wheel loop.
    "gunicorn-asgi-worker-without-hook": Case(
        ("gunicorn",),
        "-m gunicorn wheel_app:app -w 1 -k asgi --asgi-loop asyncio --asgi-lifespan on",
    ),
}


@pytest.mark.parametrize("name", list(CONTROLS))
def test_without_the_recipe_the_app_refuses_to_start(
    name: str, recipes: Path, served: list[Server]
) -> None:
    case = CONTROLS[name]
    needs(*case.needs)
    port = free_port()
    server = start(command(case, port), recipes, port)
    served.append(server)
    try:
        server.process.wait(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} started on a loop that is not a wheel loop:\n{server.output()}")
    # Not the exit status: hypercorn's main process exits with 0 when its worker fails.
    assert "not a wheel loop" in server.output()


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=directory,  # no conftest or ini of the project applies there
        env=environment(directory),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pytest_asyncio_and_anyio_run_the_tests_on_the_wheel_loop(recipes: Path) -> None:
    needs("pytest_asyncio", "anyio")
    test = "test_on_the_wheel.py"
    done = run_pytest(recipes, "-v", test)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{test}::test_pytest_asyncio_runs_it_on_the_wheel PASSED" in done.stdout
    assert f"{test}::test_anyio_runs_it_on_the_wheel PASSED" in done.stdout
    # Without the guide's conftest.py both plugins run the same tests on other loops.
    (recipes / "conftest.py").unlink()
    done = run_pytest(recipes, test)
    assert "2 failed" in done.stdout, done.stdout + done.stderr


def test_pytest_asyncio_runs_each_test_on_both_loops_when_the_hook_gives_both(
    recipes: Path,
) -> None:
    needs("pytest_asyncio")
    (recipes / "conftest.py").write_text(
        "import asyncio\n\n"
        "from aiopurgatory.loop import loop_factory\n\n\n"
        "def pytest_asyncio_loop_factories(config, item):\n"
        '    return {"asyncio": asyncio.new_event_loop, "wheel": loop_factory()}\n'
    )
    (recipes / "test_both.py").write_text(
        "import asyncio\n\n"
        "import pytest\n\n"
        "from aiopurgatory.loop import is_wheel_loop\n\n\n"
        "@pytest.mark.asyncio\n"
        "async def test_loop(request):\n"
        "    wheel = is_wheel_loop(asyncio.get_running_loop())\n"
        '    assert wheel == request.node.callspec.id.endswith("wheel")\n'
    )
    done = run_pytest(recipes, "-v", "test_both.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_loop[asyncio] PASSED" in done.stdout
    assert "test_loop[wheel] PASSED" in done.stdout
