"""The documentation site: it builds in strict mode, works offline, and holds in a browser.

The site is built once per session (``mkdocs build --strict`` into a temporary
directory, as ``make docs`` does into site/). Then:

* every page is read for links: each internal one resolves to a built file, and to an
  element with that id when it has a fragment; no script, style sheet, image or frame
  comes from another host (the site must work offline, behind a firewall);
* the diagrams and the bench plots are drawn at build time, from the committed records;
* ``make docs``'s own command line fails on a broken link or anchor (planted in a
  two-page copy of the docs under the real mkdocs.yml);
* headless Chromium (Debian's ``chromium``, driven over its DevTools protocol) loads
  the home page, a guide and the API page from a local static server: no console error,
  no request leaves the loopback server, every link on the page answers 200 and a
  screenshot of each is written (copied to ``$AIOPURGATORY_SCREENSHOTS`` when set). The
  browser test is skipped, saying why, only when no Chromium is installed.

The Python blocks of the pages run in tests/docs/test_readme.py with the READMEs'.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "docs" / "scripts"
BROWSER_PAGES = ["", "guides/long-poll-aiohttp/", "api/"]
"""The pages the browser loads: the home page, a guide and the API reference."""
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,900",
]
RESOURCE_TAGS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src"}


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``make docs`` builds it (strict) into a fresh directory."""
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Strict mode stops at the first warning; none at all is what it must print.
    assert "WARNING" not in done.stderr, done.stderr
    assert time.monotonic() - started < 120
    return out


class _Page(HTMLParser):
    """Ids, links and external resources of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.ids.add(values["id"])
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        resource = RESOURCE_TAGS.get(tag)
        if resource and resource in values:
            if values[resource].startswith(("http:", "https:", "//")):
                self.external.append(f"<{tag} {resource}={values[resource]}>")
            else:  # a local script, style sheet or image: it must be there too
                self.links.append(values[resource])
        for candidate in values.get("srcset", "").split(","):
            if candidate.strip().startswith(("http:", "https:", "//")):
                self.external.append(f"<{tag} srcset={candidate.strip()}>")


@functools.cache
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _target(site: Path, page: Path, href: str) -> tuple[Path, str] | None:
    """The built file an internal link points to and its fragment (None if external)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    if not parts.path:
        return page, unquote(parts.fragment)
    path = unquote(parts.path)
    # Absolute paths (the 404 page's, as no site_url is set) are from the site's root.
    target = (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_the_site_has_every_page(site: Path) -> None:
    for page in [
        "index.html",
        "getting-started/index.html",
        "guides/index.html",
        "guides/long-poll-aiohttp/index.html",
        "guides/asgi/index.html",
        "guides/blocking-queue/index.html",
        "guides/kafka-broker/index.html",
        "guides/testing-failures/index.html",
        "guides/redis/index.html",
        "guides/testing/index.html",
        "guides/metrics/index.html",
        "guides/traces/index.html",
        "guides/tuning/index.html",
        "concepts/design/index.html",
        "concepts/guarantees/index.html",
        "concepts/asyncio/index.html",
        "concepts/compiled/index.html",
        "api/index.html",
        "performance/index.html",
        "changelog/index.html",
        "examples/asgi_long_poll/index.html",
    ]:
        assert (site / page).is_file(), page


def test_every_internal_link_resolves(site: Path) -> None:
    broken = []
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        for href in _parse(page).links:
            found = _target(site, page, href)
            if found is None:
                continue
            target, fragment = found
            where = f"{page.relative_to(site)} -> {href}"
            if not target.is_relative_to(site) or not target.exists():
                broken.append(f"{where}: no such file")
            elif fragment and target.suffix == ".html" and fragment not in _parse(target).ids:
                broken.append(f"{where}: no element with id {fragment!r}")
    assert broken == []


def test_nothing_is_loaded_from_another_host(site: Path) -> None:
    external = [
        f"{page.relative_to(site)}: {tag}"
        for page in sorted(site.rglob("*.html"))
        for tag in _parse(page).external
    ]
    assert external == []
    # No web fonts: Material's default would fetch them from a CDN (font: false).
    for css in site.rglob("*.css"):
        assert "fonts.googleapis" not in css.read_text(encoding="utf-8"), css


def test_the_api_reference_covers_the_public_api(site: Path) -> None:
    text = (site / "api" / "index.html").read_text(encoding="utf-8")
    import aiopurgatory

    for name in aiopurgatory.__all__:
        if name != "ManualClock":  # documented where it lives, aiopurgatory.testing
            assert f'id="aiopurgatory.{name}"' in text, name
    for anchor in [
        "aiopurgatory.testing.ManualClock",
        "aiopurgatory.asgi.PurgatoryLifespan",
        "aiopurgatory.metrics.PurgatoryCollector",
        "aiopurgatory.redis.RedisFanout",
        "aiopurgatory.trace.TraceRecorder",
        "aiopurgatory.timeouts.Timeout",
        "aiopurgatory.Purgatory.try_complete_else_watch",
        "aiopurgatory.Purgatory.check_and_complete",
    ]:
        assert f'id="{anchor}"' in text, anchor
    # Types are shown, and the Sphinx roles of the docstrings are not printed raw.
    words = re.sub(r"<[^>]+>", "", text)
    assert "timeout: float | None" in words
    assert "-&gt; bool" in words
    assert ":class:" not in text
    assert ":meth:" not in text


def test_the_diagrams_and_plots_are_drawn_at_build_time(site: Path) -> None:
    for name in [
        "wheel.svg",
        "lifecycle.svg",
        "bench-rate.svg",
        "bench-lateness.svg",
        "bench-ceiling.svg",
    ]:
        ET.parse(site / "img" / name)  # well-formed SVG
    performance = (site / "performance" / "index.html").read_text(encoding="utf-8")
    for records in sorted((ROOT / "bench").glob("*.json")):
        assert f"bench/{records.name}" in performance, records.name  # one table section each
    assert "<!-- bench-tables -->" not in performance


def test_the_bench_figures_follow_the_records(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_figures
    finally:
        sys.path.remove(str(SCRIPTS))

    def record(impl: str, pending: int, rate: float, **extra: Any) -> dict[str, Any]:
        return {
            "suite": "churn",
            "impl": impl,
            "build": "compiled",
            "loop": "asyncio",
            "gc": "on",
            "repeat": 0,
            "pending": pending,
            "cpu_ops_per_s": rate,
            "ops_per_s": rate,
            **extra,
        }

    old = [record("wheel", n, 1.0) for n in (1000, 100000)]
    new = [record(impl, n, 2.0) for impl in ("wheel", "heap") for n in (1000, 100000)]
    (tmp_path / "churn-2026-01-01.json").write_text(json.dumps(old))
    (tmp_path / "churn-2026-02-01.json").write_text(json.dumps(new))
    files = bench_figures.record_files(tmp_path)
    suites = bench_figures.newest_by_suite(files)
    assert suites["churn"][0].name == "churn-2026-02-01.json"  # a new run replaces the old
    figures = bench_figures.figures(tmp_path)
    assert set(figures) == {"bench-rate.svg"}  # no purgatory records: no lateness plot
    svg = figures["bench-rate.svg"].decode()
    ET.fromstring(svg)
    assert "churn-2026-02-01.json" in svg
    assert "loop.call_later per operation" in svg
    tables = bench_figures.tables_markdown(files)
    assert tables.index("churn-2026-02-01") < tables.index("churn-2026-01-01")
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match=r"broken\.json: expected a JSON list"):
        bench_figures.load(tmp_path / "broken.json")


def test_the_diagram_script_writes_its_files(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "diagrams.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for name in ["wheel.svg", "lifecycle.svg"]:
        root = ET.parse(tmp_path / name).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.find("{http://www.w3.org/2000/svg}title") is not None  # accessible name


def test_sphinx_roles_read_as_code() -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from griffe_roles import plain_roles
    finally:
        sys.path.remove(str(SCRIPTS))
    assert plain_roles(":class:`~aiopurgatory.Purgatory` and :meth:`advance`") == (
        "``Purgatory`` and ``advance``"
    )
    assert plain_roles(":meth:`ManualClock.advance <aiopurgatory.x>`") == "``ManualClock.advance``"
    assert plain_roles("no role ``here``") == "no role ``here``"
    assert plain_roles("For example::\n\n    code\n\n::\n\n    more") == (
        "For example:\n\n    code\n\n\n\n    more"
    )


def _records(name: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads((ROOT / "bench" / name).read_text())
    return records


def test_the_redis_guide_has_one_benchmark_table_quoting_its_records() -> None:
    guide = (ROOT / "docs" / "guides" / "redis.md").read_text(encoding="utf-8")
    assert guide.count("| parked | design |") == 1
    assert "/tmp/" not in guide
    cited = "[bench/redis-fanout-2026-11-25.json](../bench/redis-fanout-2026-11-25.json)"
    assert cited in guide
    designs = {"fanout": "one subscription per process", "xread": "one `XREAD BLOCK` per waiter"}
    for r in _records("redis-fanout-2026-11-25.json"):
        lead = f"| {r['parked']:,} | {designs[r['design']]} |"
        if r["skipped"] is not None:
            assert f"{lead} skipped:" in guide
            continue
        p99 = f"{r['p99_ms']:.0f}" if r["p99_ms"] >= 100 else f"{r['p99_ms']:.1f}"
        row = (
            f"{lead} {r['connections']:,} | {r['p50_ms']:.2f} | {p99} |"
            f" {r['worker_cpu_us']:.0f} | {r['redis_cpu_us']:.0f} | {r['park_seconds']:.1f} s |"
        )
        assert row in guide


def test_the_redis_guide_quotes_its_cluster_benchmark() -> None:
    guide = (ROOT / "docs" / "guides" / "redis.md").read_text(encoding="utf-8")
    cluster_section = guide.split("## Redis Cluster", 1)[1].split("\n## ", 1)[0]
    cited = "[bench/redis-fanout-2026-11-26.json](../bench/redis-fanout-2026-11-26.json)"
    assert cited in cluster_section
    assert cluster_section.count("| parked | Redis |") == 1
    records = _records("redis-fanout-2026-11-26.json")
    labels = {"fanout": "one Redis", "cluster": "3 primaries + 3 replicas"}
    for parked in sorted({r["parked"] for r in records}):
        for design, label in labels.items():
            runs = [r for r in records if r["parked"] == parked and r["design"] == design]
            assert len(runs) == 3

            def median(field: str, runs: list[dict[str, Any]] = runs) -> Any:
                return statistics.median(r[field] for r in runs)

            nodes = "-"
            if design == "cluster":
                per = {}
                for role in ("primary", "replica"):
                    ranks = [
                        sorted((n["cpu_us"] for n in r["nodes"] if n["role"] == role), reverse=True)
                        for r in runs
                    ]
                    per[role] = ", ".join(
                        f"{statistics.median(x[j] for x in ranks):.1f}" for j in range(3)
                    )
                nodes = f"primaries {per['primary']}; replicas {per['replica']}"
            row = (
                f"| {parked:,} | {label} | {median('connections'):,} ({median('subscribers')}) |"
                f" {median('p50_ms'):.2f} | {median('p99_ms'):.1f} |"
                f" {median('worker_cpu_us'):.0f} | {median('redis_cpu_us'):.0f} | {nodes} |"
            )
            assert row in cluster_section


def test_the_kafka_guide_quotes_its_records() -> None:
    guide = " ".join((ROOT / "docs" / "guides" / "kafka-broker.md").read_text("utf-8").split())
    runs = _records("kafka-2026-11-25.json")
    median = {
        field: statistics.median(r[field] for r in runs)
        for field in [
            "acks_1_produced_per_s",
            "acks_1_consumed_per_s",
            "latency_p50_ms",
            "latency_p99_ms",
        ]
    }
    assert len(runs) == 3
    assert (
        f"with acks=1, it took {median['acks_1_produced_per_s']:,.0f} records/s produced and"
        f" {median['acks_1_consumed_per_s']:,.0f} consumed end to end, p50"
        f" {median['latency_p50_ms']:.2f} ms from produce to a parked consumer (p99"
        f" {median['latency_p99_ms']:.2f} ms): medians of the 3 runs in"
        " [bench/kafka-2026-11-25.json](../bench/kafka-2026-11-25.json)"
    ) in guide


def test_the_kafka_guide_quotes_its_cleaner_record() -> None:
    guide = " ".join((ROOT / "docs" / "guides" / "kafka-broker.md").read_text("utf-8").split())
    runs = {r["build"]: r for r in _records("kafka-compaction-2026-11-29.json")}
    compiled, pure = runs["compiled"], runs["pure"]
    assert len(compiled["runs"]) == len(pure["runs"]) == 3
    assert all(r["removed"] == 990_000 for b in (compiled, pure) for r in b["runs"])
    assert (
        f"{compiled['median_records_per_s']:,.0f} records/s (compiled build) and"
        f" {pure['median_records_per_s']:,.0f} (pure build;"
    ) in guide
    assert (
        f"longest stall {compiled['median_longest_stall_ms']:.1f} and"
        f" {pure['median_longest_stall_ms']:.1f} ms (medians)"
    ) in guide


def test_the_kafka_guide_says_what_the_extra_installs_and_what_offset_fetch_answers() -> None:
    # Issue 49: the guide said OffsetFetch never answers UNSTABLE_OFFSET_COMMIT (it does,
    # to require_stable, as tests/kafka/test_kafka_transactions.py shows), and a new user
    # looked for the Kafka client the `kafka` extra was thought to install.
    guide = " ".join((ROOT / "docs" / "guides" / "kafka-broker.md").read_text("utf-8").split())
    assert "does not answer UNSTABLE_OFFSET_COMMIT" not in guide
    assert (
        "OffsetFetch v7 asking `require_stable` (KIP-447) is answered UNSTABLE_OFFSET_COMMIT"
        in guide
    )
    transactions = (ROOT / "tests" / "kafka" / "test_kafka_transactions.py").read_text("utf-8")
    assert "UNSTABLE_OFFSET_COMMIT" in transactions
    # The extra brings the wire format, not a client: the guide says so, and it is so.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    extra = " ".join(pyproject["project"]["optional-dependencies"]["kafka"])
    for client in ("aiokafka", "confluent-kafka", "kafka-python"):
        assert client not in extra
    assert "The extra installs no Kafka client" in guide


def test_the_kafka_guide_quotes_its_start_and_transaction_records() -> None:
    guide = (ROOT / "docs" / "guides" / "kafka-broker.md").read_text("utf-8")
    runs = _records("kafka-2026-11-26.json")
    assert len(runs) == 5
    assert {(r["build"], r["loop"], r["transactions"], r["starts"]) for r in runs} == {
        ("compiled", "uvloop", 500, 10)
    }

    def quoted(field: str, form: str) -> str:
        values = [r[field] for r in runs]
        low, median, high = min(values), statistics.median(values), max(values)
        return f"{median:{form}} [{low:{form}}\N{EN DASH}{high:{form}}]"

    assert "[bench/kafka-2026-11-26.json](../bench/kafka-2026-11-26.json)" in guide
    for client in ("aiokafka", "confluent"):
        assert (
            f"{quoted(f'txn_{client}_commits_per_s', ',.0f')} commits/s, broker CPU"
            f" {quoted(f'txn_{client}_broker_cpu_us_per_commit', ',.0f')} µs per commit"
        ) in guide
    rows = {
        "`KafkaBroker()` on the running loop, to Metadata answered": ("in_process_ms", ".1f"),
        "`BrokerThread` (the fixture's path), to Metadata answered": ("fixture_thread_ms", ".1f"),
        "`python -m aiopurgatory.kafka --port 0`, to `listening on`": (
            "subprocess_listening_ms",
            ",.0f",
        ),
        "the same, to Metadata answered": ("subprocess_answered_ms", ",.0f"),
    }
    for row, (field, form) in rows.items():
        assert f"| {row} | {quoted(f'start_{field}', form)} ms |" in guide, row
    # The container's start is cited with its source, as the bench records it.
    assert runs[0]["start_cited_source"] in guide


def _make_docs_command() -> tuple[dict[str, str], list[str]]:
    """The environment and the command line of ``make docs``'s recipe, from the Makefile,
    with ``$(BIN)`` the directory of this interpreter (whose venv has mkdocs)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    [recipe] = re.findall(r"^docs:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    recipe = recipe.replace("$(BIN)", str(Path(sys.executable).parent))
    assert "$" not in recipe, f"a make variable this test does not expand: {recipe}"
    words = shlex.split(recipe)
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


@pytest.mark.parametrize(
    "link",
    [
        pytest.param("no-such-page.md", id="missing-page"),
        pytest.param("page.md#no-such-heading", id="missing-anchor"),
        pytest.param("#no-such-heading", id="missing-anchor-on-the-page"),
    ],
)
def test_make_docs_fails_on_a_broken_link(link: str, tmp_path: Path) -> None:
    # A copy of the docs inheriting the real mkdocs.yml (strict, validation levels,
    # plugins), cut to two pages and without the build hooks so that it takes a second,
    # with one broken link planted; built by make's own command line. `--quiet` in it
    # once set mkdocs' logger to ERROR, dropping the warnings before strict mode counted
    # them: a broken link built with exit status 0.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\nSee [the page](page.md) and [this]({link}).\n")
    (docs / "page.md").write_text("# Page\n\n## A heading\n\nBack [home](index.md).\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {json.dumps(str(ROOT / 'mkdocs.yml'))}\n"
        "docs_dir: docs\n"
        "site_dir: site\n"
        "hooks: []\n"
        "nav:\n  - Home: index.md\n  - Page: page.md\n"
    )
    env, command = _make_docs_command()
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"contains a link '{link}'" in output  # the planted one,
    assert "Aborted with 1 warnings in strict mode" in output  # and nothing else


# ---------------------------------------------------------------------------------------
# The browser


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve(directory: Path) -> Iterator[str]:
    """A static server of ``directory`` on a free loopback port: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class DevTools:
    """A minimal client of Chromium's DevTools protocol over one WebSocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self.replies.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self.events.append(data)
                self.changed.set()

    async def send(self, method: str, session: str | None = None, **params: Any) -> Any:
        self.next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.replies[self.next_id] = future
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_str(json.dumps(message))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def wait_event(self, method: str, session: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {method} within {timeout} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def of(self, session: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("sessionId") == session]


def _problems(events: list[dict[str, Any]], base: str) -> tuple[list[str], list[str]]:
    """Console errors and requests to anywhere but the local server, from the events."""
    errors: list[str] = []
    foreign: list[str] = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in {"error", "assert"}:
            errors.append(json.dumps(params.get("args", []))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not url.startswith((base, "data:", "blob:", "about:")):
                foreign.append(url)
    return errors, foreign


async def _visit(browser: str, base: str, profile: Path, shots: Path) -> dict[str, Any]:
    import aiohttp

    process = await asyncio.create_subprocess_exec(
        browser,
        *BROWSER_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{browser} did not start (exit {process.returncode})")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        results: dict[str, Any] = {}
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0) as ws,
        ):
            tools = DevTools(ws)
            for page in BROWSER_PAGES:
                url = urljoin(base, page)
                target = await tools.send("Target.createTarget", url="about:blank")
                attached = await tools.send(
                    "Target.attachToTarget", targetId=target["targetId"], flatten=True
                )
                session = attached["sessionId"]
                for domain in ("Page", "Runtime", "Log", "Network"):
                    await tools.send(f"{domain}.enable", session)
                await tools.send("Page.navigate", session, url=url)
                await tools.wait_event("Page.loadEventFired", session, 20)
                await asyncio.sleep(0.5)  # late scripts (search worker) report errors too
                links = await tools.send(
                    "Runtime.evaluate",
                    session,
                    expression="[...document.querySelectorAll('a[href]')].map(a => a.href)",
                    returnByValue=True,
                )
                title = await tools.send(
                    "Runtime.evaluate", session, expression="document.title", returnByValue=True
                )
                shot = await tools.send("Page.captureScreenshot", session, format="png")
                name = (page.strip("/").replace("/", "-") or "home") + ".png"
                (shots / name).write_bytes(base64.b64decode(shot["data"]))
                errors, foreign = _problems(tools.of(session), base)
                results[page] = {
                    "links": links["result"]["value"],
                    "title": title["result"]["value"],
                    "errors": errors,
                    "foreign": foreign,
                    "screenshot": shots / name,
                }
                await tools.send("Target.closeTarget", targetId=target["targetId"])
            tools.reader.cancel()
        return results
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_site_in_chromium(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium installed (Debian's chromium: .ci/run installs it)")
    shots = tmp_path / "screens"
    shots.mkdir()
    started = time.monotonic()
    with _serve(site) as base:
        results = asyncio.run(_visit(browser, base, tmp_path / "profile", shots))
        checked: set[str] = set()
        for page, result in results.items():
            assert result["errors"] == [], f"{page}: console errors"
            assert result["foreign"] == [], f"{page}: requests off the local server"
            assert "aiopurgatory" in result["title"], page
            internal = {link.split("#")[0] for link in result["links"] if link.startswith(base)}
            assert len(internal) > 10, page  # the navigation at least
            for link in sorted(internal - checked):
                assert _status(link) == 200, f"{page} -> {link}"
            checked |= internal
            assert result["screenshot"].stat().st_size > 10_000, "a blank screenshot"
    assert time.monotonic() - started < 60
    copy_to = os.environ.get("AIOPURGATORY_SCREENSHOTS")
    paths = [str(result["screenshot"]) for result in results.values()]
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        paths = [shutil.copy(path, copy_to) for path in paths]
    with capsys.disabled():
        print("\nscreenshots of the docs site:", *paths, sep="\n  ")


def test_the_performance_page_quotes_the_allocation_records() -> None:
    """The "before" of issue 36: every row of the table is the records' (1,000 held)."""
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "[bench/allocs-2026-11-26.json](bench/allocs-2026-11-26.json)" in page
    labels = {
        ("operation", 1): "the user's operation object | \N{EN DASH}",
        ("register", 1): "register | 1",
        ("register", 3): "register | 3 shared",
        ("complete", 1): "complete (`force_complete`) | 1",
        ("complete", 3): "complete (`force_complete`) | 3 shared",
        ("complete_key", 1): "complete through the key | 1",
        ("cancel", 1): "cancel | 1",
        ("cancel", 3): "cancel | 3 shared",
        ("expire", 1): "expire (burst of 20,000) | 1",
        ("expire", 3): "expire (burst of 20,000) | 3 shared",
    }

    def count(v: float) -> str:
        return f"{int(v):,}" if v == int(v) else f"{v:.2f}"

    def signed(v: float, plus: bool) -> str:
        text = f"{v:+g}" if plus and v else f"{v:g}"
        return text.replace("-", "\N{MINUS SIGN}")

    cells: dict[tuple[str, int], list[str]] = {}
    for r in _records("allocs-2026-11-26.json"):
        if r["pending"] != 1000:
            continue
        cells.setdefault((r["path"], r["keys"]), []).extend(
            [
                count(r["allocs_per_op"]),
                f"{round(r['bytes_per_op']):,}",
                signed(r["young_per_op"], True),
                signed(r["net_blocks_per_op"], False),
            ]
        )
    assert set(cells) == set(labels)
    for key, label in labels.items():
        row = f"| {label} | " + " | ".join(cells[key]) + " |"
        assert row in page, row
