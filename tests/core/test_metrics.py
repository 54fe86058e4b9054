"""Prometheus metrics: names by the book, values, and scrapes from other threads."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import aiopurgatory as ap
from aiopurgatory.metrics import PurgatoryCollector
from aiopurgatory.operation import DelayedOperation, Outcome

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


class Fetch(Flag):
    label = "fetch"


def samples(text: str | list[Sample]) -> Iterator[Sample]:
    if isinstance(text, list):
        yield from text
        return
    for family in text_string_to_metric_families(text):
        yield from family.samples


def value(text: str | list[Sample], name: str, **labels: str) -> float:
    """The one sample of ``name`` with exactly ``labels`` (text, or samples parsed once)."""
    found = [s.value for s in samples(text) if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def test_names_types_and_values_by_the_book() -> None:
    clock = ap.ManualClock()
    metrics = PurgatoryCollector()
    registry = CollectorRegistry()
    registry.register(metrics)
    async with metrics.purgatory("produce", clock=clock) as p:
        ready = False
        done = p.try_complete_else_watch(Flag(1.0, lambda: ready), ["a", "b"])
        expired = p.try_complete_else_watch(Fetch(0.010), ["a"])
        cancelled = p.try_complete_else_watch(Fetch(None), ["c"])
        p.try_complete_else_watch(Flag(None), ["a"])  # left pending
        await clock.advance(0.003)
        ready = True
        assert p.check_and_complete("a") == 1
        cancelled.cancel()
        clock.jump(0.009)  # the loop was blocked: the timer wakes 2 ms after the deadline
        await clock.advance(0)
        assert done.result() == "done"
        assert expired.expired
        assert p.stats.timer_lag == pytest.approx(0.002)

        text = generate_latest(registry).decode()
        families = {f.name: f.type for f in text_string_to_metric_families(text)}
        assert families == {
            "aiopurgatory_operations_pending": "gauge",
            "aiopurgatory_watcher_entries": "gauge",
            "aiopurgatory_watched_keys": "gauge",
            "aiopurgatory_timer_operations": "gauge",
            "aiopurgatory_timer_heap_items": "gauge",
            "aiopurgatory_timer_lag_last_seconds": "gauge",
            "aiopurgatory_timer_lag_max_seconds": "gauge",
            "aiopurgatory_timer_wakeups": "counter",
            "aiopurgatory_operations": "counter",
            "aiopurgatory_operation_wait_seconds": "histogram",
            "aiopurgatory_timer_lag_seconds": "histogram",
        }
        assert value(text, "aiopurgatory_operations_pending", purgatory="produce") == 1
        assert value(text, "aiopurgatory_watcher_entries", purgatory="produce") == 1
        assert value(text, "aiopurgatory_timer_lag_last_seconds", purgatory="produce") == (
            pytest.approx(0.002)
        )

        def total(kind: str, outcome: str) -> float:
            labels = {"purgatory": "produce", "kind": kind, "outcome": outcome}
            return value(text, "aiopurgatory_operations_total", **labels)

        assert total("Flag", "completed") == 1
        assert total("fetch", "expired") == 1
        assert total("fetch", "cancelled") == 1
        assert total("Flag", "expired") == total("fetch", "completed") == 0
        assert total("Flag", "closed") == 0

        # The expired fetch waited 12 ms, so it is in le=0.025 and not in le=0.01.
        def wait(suffix: str, kind: str, outcome: str, **le: str) -> float:
            labels = {"purgatory": "produce", "kind": kind, "outcome": outcome, **le}
            return value(text, f"aiopurgatory_operation_wait_seconds{suffix}", **labels)

        assert wait("_bucket", "fetch", "expired", le="0.01") == 0
        assert wait("_bucket", "fetch", "expired", le="0.025") == 1
        assert wait("_bucket", "fetch", "expired", le="+Inf") == 1
        assert wait("_count", "fetch", "expired") == 1
        assert wait("_sum", "fetch", "expired") == pytest.approx(0.012)
        assert wait("_sum", "Flag", "completed") == pytest.approx(0.003)
        assert wait("_bucket", "Flag", "completed", le="0.0025") == 0
        assert wait("_bucket", "Flag", "completed", le="0.005") == 1

        def lag(suffix: str, **le: str) -> float:
            return value(text, f"aiopurgatory_timer_lag_seconds{suffix}", purgatory="produce", **le)

        assert lag("_bucket", le="0.001") == 0
        assert lag("_bucket", le="0.002") == 1
        assert lag("_count") == 1
        assert lag("_sum") == pytest.approx(0.002)

    # Closed: the operation left pending finishes as closed; scraped with no loop running.
    # The closed purgatory is forgotten (no gauges); its counters stay, by name.
    text = generate_latest(registry).decode()
    assert not [s for s in samples(text) if s.name == "aiopurgatory_operations_pending"]
    closed = {"purgatory": "produce", "kind": "Flag", "outcome": "closed"}
    assert value(text, "aiopurgatory_operations_total", **closed) == 1


def test_scrapes_on_another_thread_read_one_snapshot_taken_on_the_loop() -> None:
    """A real HTTP scrape from prometheus_client's server thread while operations finish."""
    metrics = PurgatoryCollector()
    registry = CollectorRegistry()
    registry.register(metrics)
    server, server_thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    taken_on: set[int] = set()
    take = metrics._take

    def noted_take() -> Any:
        taken_on.add(threading.get_ident())
        return take()

    metrics._take = noted_take  # type: ignore[method-assign]
    bodies: list[str] = []

    def scraper(stop: threading.Event) -> None:
        while not stop.is_set() or len(bodies) < 20:
            with urllib.request.urlopen(url, timeout=10) as response:
                bodies.append(response.read().decode())

    async def main() -> int:
        stop = threading.Event()
        p = metrics.purgatory("busy")
        scraping = asyncio.create_task(asyncio.to_thread(scraper, stop))
        registered = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ops = [
                p.try_complete_else_watch(Flag(30.0 if i % 4 else 0.001), ["all", ("own", i)])
                for i in range(200)
            ]
            registered += len(ops)
            await asyncio.sleep(0)
            for op in ops[::3]:
                op.cancel()
            p.check_and_complete("none")
            for op in ops[1::3]:
                op.force_complete()
            await asyncio.sleep(0.002)
            for op in ops:
                op.cancel()
        stop.set()
        await scraping
        await p.aclose()
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
    finally:
        server.shutdown()
        server_thread.join(5)
    assert len(bodies) >= 20
    assert taken_on == {loop_thread}  # every snapshot was copied on the loop's thread
    previous = 0.0
    parsed = [list(samples(text)) for text in bodies[:: max(1, len(bodies) // 100)]]
    for text in parsed:
        pending = value(text, "aiopurgatory_operations_pending", purgatory="busy")
        # One instant: every pending operation watches two keys and is timed.
        assert value(text, "aiopurgatory_watcher_entries", purgatory="busy") == 2 * pending
        assert value(text, "aiopurgatory_timer_operations", purgatory="busy") == pending
        keys = value(text, "aiopurgatory_watched_keys", purgatory="busy")
        assert keys == (pending + 1 if pending else 0)
        finished = sum(
            s.value
            for s in samples(text)
            if s.name == "aiopurgatory_operations_total" and s.labels["purgatory"] == "busy"
        )
        assert finished >= previous  # counters never go back
        previous = finished
    assert previous > 0
    assert any(value(t, "aiopurgatory_operations_pending", purgatory="busy") > 0 for t in parsed)


def test_a_scrape_while_the_loop_is_blocked_reports_the_previous_snapshot() -> None:
    metrics = PurgatoryCollector(scrape_timeout=0.2)
    registry = CollectorRegistry()
    registry.register(metrics)
    scraped: list[tuple[float, str]] = []

    def scrape_now() -> None:
        started = time.monotonic()
        text = generate_latest(registry).decode()
        scraped.append((time.monotonic() - started, text))

    async def main() -> None:
        p = metrics.purgatory("blocked")
        p.try_complete_else_watch(Flag(None), ["k"])
        generate_latest(registry)  # on the loop's thread: the snapshot is taken directly
        p.try_complete_else_watch(Flag(None), ["k"])
        thread = threading.Thread(target=scrape_now)
        thread.start()
        time.sleep(0.6)  # noqa: ASYNC251 - the loop is blocked: it cannot answer the scrape
        thread.join()
        await asyncio.sleep(0.01)  # the abandoned snapshot request runs now, harmlessly
        p.close()

    asyncio.run(main())
    [(elapsed, text)] = scraped
    assert 0.15 < elapsed < 0.5
    assert value(text, "aiopurgatory_operations_pending", purgatory="blocked") == 1  # stale


async def test_forwards_to_another_observer() -> None:
    seen: list[tuple[str, str, Outcome]] = []
    created: list[str] = []

    class Observer:
        def operation_finished(
            self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
        ) -> None:
            seen.append((purgatory, op.kind, outcome))

        def purgatory_created(self, purgatory: ap.Purgatory) -> None:
            created.append(purgatory.name)

    metrics = PurgatoryCollector(forward_to=Observer())
    registry = CollectorRegistry()
    registry.register(metrics)
    async with metrics.purgatory("counted") as p:
        p.try_complete_else_watch(Fetch(0), ["k"])
        text = generate_latest(registry).decode()
    assert seen == [("counted", "fetch", Outcome.EXPIRED)]
    assert created == ["counted"]
    assert value(text, "aiopurgatory_operations_pending", purgatory="counted") == 0
    labels = {"purgatory": "counted", "kind": "fetch", "outcome": "expired"}
    assert value(text, "aiopurgatory_operations_total", **labels) == 1


def test_one_collector_per_loop_at_a_time_and_checked_settings() -> None:
    metrics = PurgatoryCollector()
    registry = CollectorRegistry()
    registry.register(metrics)
    elsewhere = metrics.purgatory("elsewhere")
    bound = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        elsewhere.try_complete_else_watch(Flag(None), ["k"])
        bound.set()
        await stop.wait()
        await elsewhere.aclose()

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    assert bound.wait(10)
    loop = elsewhere.loop
    assert loop is not None

    async def here() -> None:
        async with metrics.purgatory("here") as p:
            p.try_complete_else_watch(Flag(None), ["k"])
            with pytest.raises(ValueError, match="two event loops at once"):
                generate_latest(registry)

    try:
        asyncio.run(here())
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
    text = generate_latest(registry).decode()  # both closed: forgotten, no conflict
    assert not [s for s in samples(text) if s.name == "aiopurgatory_operations_pending"]
    with pytest.raises(TypeError, match="forward_to"):
        metrics.purgatory("p", observer=metrics)
    with pytest.raises(ValueError, match="increase"):
        PurgatoryCollector(wait_buckets=(1.0, 0.5))
    with pytest.raises(ValueError, match="finite"):
        PurgatoryCollector(lag_buckets=(0.1, float("inf")))
    with pytest.raises(ValueError, match="scrape_timeout"):
        PurgatoryCollector(scrape_timeout=0)


def test_loop_timer_collector_top_owners_and_other() -> None:
    from aiopurgatory import loop as apl
    from aiopurgatory.metrics import LoopTimerCollector

    loop = apl.new_event_loop()
    try:
        registry = CollectorRegistry()
        registry.register(LoopTimerCollector(loop, top=2))
        text = generate_latest(registry).decode()
        assert value(text, "aiopurgatory_loop_timers") == 0
        now = loop.time()

        def tick(self: object) -> None:
            pass

        owners = [type(f"Owner{i}", (), {"tick": tick})() for i in range(5)]
        for i, owner in enumerate(owners):
            for k in range(i + 1):  # Owner4 holds 5 timers, Owner0 one
                loop.call_at(now + 10 + k, owner.tick)
        loop.call_at(now + 3, owners[0].tick).cancel()
        text = generate_latest(registry).decode()
        found = list(samples(text))
        assert value(found, "aiopurgatory_loop_timers") == 15
        by_owner = {
            s.labels["owner"]: s.value
            for s in found
            if s.name == "aiopurgatory_loop_timers_by_owner"
        }
        prefix = f"{__name__}."
        assert by_owner == {f"{prefix}Owner4.tick": 5, f"{prefix}Owner3.tick": 4, "other": 6}
        due = value(found, "aiopurgatory_loop_timer_next_due_seconds", owner="other")
        assert 9 < due <= 10
        loop.close()
        assert value(generate_latest(registry).decode(), "aiopurgatory_loop_timers") == 0
    finally:
        loop.close()


def test_loop_timer_collector_scraped_from_another_thread() -> None:
    from aiopurgatory import loop as apl
    from aiopurgatory.metrics import LoopTimerCollector

    async def main() -> str:
        loop = asyncio.get_running_loop()
        registry = CollectorRegistry()
        registry.register(LoopTimerCollector(loop))
        handle = loop.call_later(30, print)
        # The count is taken on the loop: the scrape thread waits for the loop.
        text = await asyncio.to_thread(generate_latest, registry)
        handle.cancel()
        return text.decode()

    with asyncio.Runner(loop_factory=apl.loop_factory()) as runner:
        text = runner.run(main())
    assert value(text, "aiopurgatory_loop_timers") == 1
    assert value(text, "aiopurgatory_loop_timers_by_owner", owner="builtins.print") == 1


def test_loop_timer_collector_refuses_a_stock_loop_and_bad_arguments() -> None:
    from aiopurgatory import loop as apl
    from aiopurgatory.metrics import LoopTimerCollector

    stock = asyncio.new_event_loop()
    wheel = apl.new_event_loop()
    try:
        with pytest.raises(TypeError, match="not a wheel loop"):
            LoopTimerCollector(stock)
        with pytest.raises(ValueError, match="top"):
            LoopTimerCollector(wheel, top=-1)
        with pytest.raises(ValueError, match="scrape_timeout"):
            LoopTimerCollector(wheel, scrape_timeout=0)
    finally:
        stock.close()
        wheel.close()
