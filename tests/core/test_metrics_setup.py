"""Issues 25 and 30: the collector set up by one argument and outliving event loops, the
ASGI lifespan off the main thread and on a manual clock, HELP texts, the asgi extra."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.metadata
import logging
import re
import signal
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvloop
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

import aiopurgatory as ap
from aiopurgatory.asgi import ASGIApp, Message, PurgatoryLifespan
from aiopurgatory.metrics import PurgatoryCollector
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag, watchdog

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
GAUGES = (
    "aiopurgatory_operations_pending",
    "aiopurgatory_watcher_entries",
    "aiopurgatory_watched_keys",
    "aiopurgatory_timer_operations",
    "aiopurgatory_timer_heap_items",
    "aiopurgatory_timer_lag_last_seconds",
    "aiopurgatory_timer_lag_max_seconds",
)
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def series(registry: CollectorRegistry, name: str, **labels: str) -> list[float]:
    """Every sample of ``name`` whose labels include ``labels`` (duplicates kept)."""
    text = generate_latest(registry).decode()
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]


def registered(metrics: PurgatoryCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(metrics)
    return registry


# -- issue 30.1 / 25.12: observer=collector is the one call --------------------------


async def test_the_observer_argument_exports_every_gauge_before_any_event() -> None:
    metrics = PurgatoryCollector()
    registry = registered(metrics)
    clock = ManualClock()
    with anyio.fail_after(10):
        async with ap.Purgatory("jobs", observer=metrics, clock=clock) as p:
            # Made, nothing registered or finished yet: every gauge has its sample.
            for name in GAUGES:
                assert series(registry, name, purgatory="jobs") == [0], name
            p.try_complete_else_watch(Flag(5.0), ["a", "b"])
            assert series(registry, "aiopurgatory_operations_pending", purgatory="jobs") == [1]
            assert series(registry, "aiopurgatory_watcher_entries", purgatory="jobs") == [2]
            assert series(registry, "aiopurgatory_timer_operations", purgatory="jobs") == [1]
            await clock.advance(5.0)
            expired = {"purgatory": "jobs", "kind": "Flag", "outcome": "expired"}
            assert series(registry, "aiopurgatory_operations_total", **expired) == [1]
            assert series(registry, "aiopurgatory_operations_pending", purgatory="jobs") == [0]


def test_a_lifespan_given_the_collector_exports_its_gauges_through_http() -> None:
    """PurgatoryLifespan("jobs", observer=metrics): /metrics has the gauges at once."""
    metrics = PurgatoryCollector()
    registry = registered(metrics)
    lifespan = PurgatoryLifespan("jobs", observer=metrics)

    async def scrape(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain")

    app = Starlette(routes=[Route("/metrics", scrape)], lifespan=lifespan)
    with watchdog(20.0), TestClient(app) as client:
        text = client.get("/metrics").text
    pending = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "aiopurgatory_operations_pending"
    ]
    assert pending == [0]


def test_tracking_a_purgatory_the_collector_does_not_observe_is_refused() -> None:
    metrics = PurgatoryCollector()
    other = ap.Purgatory("elsewhere")  # its observer is not the collector
    with pytest.raises(ValueError, match=r"'elsewhere' does not report to this collector"):
        metrics.track(other)
    with pytest.raises(TypeError, match=r"takes no purgatories \(got 'elsewhere'\)"):
        PurgatoryCollector(other)  # type: ignore[arg-type]
    assert series(registered(metrics), "aiopurgatory_operations_pending") == []
    # The one-call forms are tracked already; track() of them is a harmless no-op.
    mine = ap.Purgatory("mine", observer=metrics)
    metrics.track(mine)
    made = metrics.purgatory("made")
    metrics.track(made)
    registry = registered(metrics)
    assert series(registry, "aiopurgatory_operations_pending", purgatory="mine") == [0]
    assert series(registry, "aiopurgatory_operations_pending", purgatory="made") == [0]


# -- issue 25.11: a collector outlives the loop ----------------------------------------


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("end", ["aclose", "runner", "dropped"])
def test_a_collector_outlives_its_event_loops(loop: str, end: str) -> None:
    """Module-level collector, one loop per test (or per app reload): one series per
    name, and the counters go on across purgatories of the same name.

    The purgatory ends closed (``aclose``), closed by its loop's end (``asyncio.Runner``
    cancels the timer task, which closes it), or open on a loop that is closed."""
    metrics = PurgatoryCollector()
    registry = registered(metrics)
    clock = ManualClock()

    async def run(n: int) -> None:
        p = metrics.purgatory("jobs", clock=clock)  # the old code raised here, or doubled
        for _ in range(n):
            p.try_complete_else_watch(Flag(0.5), ["k"])
        await clock.advance(0.5)
        p.try_complete_else_watch(Flag(None), ["left"])  # pending at the end
        assert series(registry, "aiopurgatory_operations_pending", purgatory="jobs") == [1]
        if end == "aclose":
            await p.aclose()

    wakeups = []
    with watchdog(20.0):
        for n in (2, 3):
            if end == "dropped":
                event_loop = LOOPS[loop]()
                event_loop.run_until_complete(run(n))
                event_loop.close()  # the timer task is left as it was: nothing closed p
            else:
                with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
                    runner.run(run(n))
            wakeups.append(series(registry, "aiopurgatory_timer_wakeups_total", purgatory="jobs"))
    # Closed, or its loop is: forgotten. No gauge of a dead purgatory, no duplicates.
    assert series(registry, "aiopurgatory_operations_pending", purgatory="jobs") == []
    expired = {"purgatory": "jobs", "kind": "Flag", "outcome": "expired"}
    assert series(registry, "aiopurgatory_operations_total", **expired) == [5]
    closed = {"purgatory": "jobs", "kind": "Flag", "outcome": "closed"}
    assert series(registry, "aiopurgatory_operations_total", **closed) == [
        0 if end == "dropped" else 2
    ]
    [[first], [second]] = wakeups
    assert 0 < first < second  # one series, counting on

    async def next_run() -> None:
        async with metrics.purgatory("jobs") as p:
            p.try_complete_else_watch(Flag(None), ["k"])
            assert series(registry, "aiopurgatory_operations_pending", purgatory="jobs") == [1]

    asyncio.run(next_run())


async def test_two_purgatories_in_use_under_one_name_are_refused() -> None:
    metrics = PurgatoryCollector()
    async with metrics.purgatory("jobs") as p:
        p.try_complete_else_watch(Flag(None), ["k"])
        with pytest.raises(ValueError, match=r"named 'jobs' .* still in use"):
            ap.Purgatory("jobs", observer=metrics)
    # One made and never used (an app built twice, say) is simply replaced.
    ap.Purgatory("idle", observer=metrics)
    async with metrics.purgatory("idle") as p:
        p.try_complete_else_watch(Flag(None), ["k"])
        pending = series(registered(metrics), "aiopurgatory_operations_pending", purgatory="idle")
        assert pending == [1]


# -- issue 30.2: the lifespan off the main thread --------------------------------------


@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
def test_close_on_signals_under_testclient_goes_on_without_signals(
    framework: str, anyio_backend: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    lifespan = PurgatoryLifespan("jobs", close_on_signals=True)

    async def stats(request: Request) -> Response:
        purgatory: ap.Purgatory = request.state.purgatory
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return JSONResponse({"pending": purgatory.stats.pending, "loop": loop})

    app: Starlette
    if framework == "fastapi":
        app = FastAPI(lifespan=lifespan)
        app.add_api_route("/stats", stats)
    else:
        app = Starlette(routes=[Route("/stats", stats)], lifespan=lifespan)
    handlers = {signum: signal.getsignal(signum) for signum in lifespan.signals}
    options = anyio_backend[1]  # asyncio, or asyncio with uvloop's loop
    caplog.set_level(logging.DEBUG, logger="aiopurgatory.asgi")
    with watchdog(20.0), TestClient(app, backend="asyncio", backend_options=options) as client:
        loop = "uvloop" if "loop_factory" in options else "asyncio"
        assert client.get("/stats").json() == {"pending": 0, "loop": loop}
        assert lifespan.running
    assert lifespan.purgatory is not None
    assert lifespan.purgatory.closed
    assert {signum: signal.getsignal(signum) for signum in lifespan.signals} == handlers
    [record] = [r for r in caplog.records if r.name == "aiopurgatory.asgi"]
    assert record.levelno == logging.DEBUG
    assert "without signal handlers" in record.getMessage()


# -- issue 30.3: the app's lifespan on a test's manual clock ---------------------------


@contextlib.asynccontextmanager
async def started(app: ASGIApp) -> AsyncIterator[None]:
    """Run ``app``'s ASGI lifespan on this loop (startup, then shutdown on exit)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()

    async def send(message: Message) -> None:
        await outbox.put(message)

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task


# As an app module would: the lifespan and the app built at import.
module_lifespan = PurgatoryLifespan("long-poll")


async def poll(request: Request) -> Response:
    purgatory = module_lifespan.purgatory
    assert purgatory is not None
    arrived = await purgatory.wait_for(["topic"], lambda: False, 30.0)
    return Response(status_code=200 if arrived else 204)


module_app = Starlette(routes=[Route("/poll", poll)], lifespan=module_lifespan)


async def test_a_test_runs_the_app_modules_lifespan_on_its_manual_clock() -> None:
    clock = ManualClock()
    with anyio.fail_after(10), module_lifespan.override(clock=clock):
        async with started(module_app):
            p = module_lifespan.purgatory
            assert p is not None
            running = pytest.raises(RuntimeError, match="running: override its options before")
            with running, module_lifespan.override(clock=None):
                pass
            transport = httpx.ASGITransport(app=module_app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                response = asyncio.ensure_future(client.get("/poll"))
                while p.num_delayed() < 1:  # noqa: ASYNC110 - the request's task registers it
                    await asyncio.sleep(0)
                await clock.advance(29.999)
                assert not response.done()
                await clock.advance(0.001)  # thirty virtual seconds, no real ones
                assert (await response).status_code == 204
    assert module_lifespan.options == {}  # the override ends with its block
    assert p.closed


# -- issue 30.4: HELP texts ------------------------------------------------------------


async def test_every_gauge_says_what_it_counts() -> None:
    metrics = PurgatoryCollector()
    async with metrics.purgatory("jobs"):
        text = generate_latest(registered(metrics)).decode()
    helps = dict(re.findall(r"^# HELP (\S+) (.+)$", text, re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    for name, kind in types.items():
        assert len(helps[name]) > 20, name
        counts_operations = "_operations" in name or name.startswith("aiopurgatory_operation_")
        if kind in ("gauge", "counter") and not counts_operations:
            assert "not a count of operations" in helps[name], (name, helps[name])
    heap = helps["aiopurgatory_timer_heap_items"]
    assert "bucket" in heap
    assert "nothing pending" in heap


# -- issue 30.5: the asgi extra installs what the ASGI helpers and example need --------


def test_the_asgi_extra_is_what_the_asgi_example_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = {
        re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
        for requirement in project["optional-dependencies"]["asgi"]
    }
    optional = {"prometheus_client"}  # /metrics answers 404 without the metrics extra
    modules: set[str] = set()
    for path in ("aiopurgatory/asgi.py", "examples/asgi_long_poll/server.py"):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    local = {"aiopurgatory", "long_poll", "examples", "__future__"}
    third_party = modules - set(sys.stdlib_module_names) - local - optional
    distributions = importlib.metadata.packages_distributions()
    needed = {distributions[module][0].lower() for module in third_party}
    assert needed == extra
