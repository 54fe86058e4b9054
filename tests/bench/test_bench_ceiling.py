"""The ceiling search of the purgatory benchmark: its logic on a fake run (the coarse
grid, the bisection that refines it, every run kept as a step), its records old and new
in the tables and the plot, and its output on a smoke-size real run. Never a speed
assertion."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench import ceiling, report
from bench.__main__ import main
from bench.ceiling import STEP_FIELDS, anchor_path, jvm_anchor, jvm_lateness, search, verdict
from bench.common import Record

from ..support.ceiling_runs import PASS, scripted

ROOT = Path(__file__).resolve().parents[2]
OLD_RECORD: dict[str, Any] = {  # as bench/ceiling-2026-11-25.json has them: no steps
    "suite": "ceiling",
    "impl": "wheel",
    "loop": "asyncio",
    "gc": "on",
    "scenario": "low",
    "keys": "shared",
    "ceiling_per_s": 244141,
    "tried": 9,
    "failed_at_per_s": 305176,
    "failed_because": "achieved 86.5% of the offered rate",
    "late_p50_ms": 1.073,
    "late_p99_ms": 1.971,
    "late_p999_ms": 2.507,
    "cpu_s_per_1m": 3.62,
    "failed_achieved_per_s": 264053,
    "failed_achieved_pct": 86.5,
    "failed_late_p99_ms": 3.01,
    "failed_cpu_s_per_1m": 3.76,
}


def fake(limit: float, tried: list[int]) -> object:
    """A run step whose implementation keeps p99 under the bar below ``limit``/s."""

    def run(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
        rate = params["rate"]
        assert isinstance(rate, int)
        tried.append(rate)
        return {**PASS, "rate": rate, "late_p99_ms": 2.0 if rate < limit else 9.0}

    return run


def test_the_ceiling_is_the_highest_rate_that_passed() -> None:
    tried: list[int] = []
    record = search(
        fake(300_000, tried),  # type: ignore[arg-type]
        "wheel", "uvloop", "on", "low", "shared",
        start=100_000, step=1.25, max_rate=800_000, seconds=1.0,
    )  # fmt: skip
    assert tried == [100_000, 125_000, 156_250, 195_312, 244_141, 305_176]
    assert record["ceiling_per_s"] == 244_141
    assert record["failed_at_per_s"] == 305_176
    assert record["failed_because"] == "p99 lateness 9.0 ms"
    assert record["late_p99_ms"] == 2.0
    assert record["refined"] == 0  # refine defaults to 0: the coarse grid alone


def test_every_run_is_kept_as_a_step() -> None:
    tried: list[int] = []
    script = {100_000: iter([True]), 200_000: iter([False, True, True]), 400_000: iter([False] * 2)}
    record = search(
        scripted(script, tried),  # type: ignore[arg-type]
        "wheel", "uvloop", "on", "low", "shared",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0, confirm=3,
    )  # fmt: skip
    steps = record["steps"]
    assert isinstance(steps, list)
    assert record["tried"] == len(steps) == 6  # confirmations included
    assert [s["rate"] for s in steps] == tried
    assert [s["passed"] for s in steps] == [True, False, True, True, False, False]
    for step in steps:
        assert set(step) == {"rate", *STEP_FIELDS, "passed"}
        assert step["achieved_per_s"] == step["rate"]
        assert step["late_p99_ms"] == (2.0 if step["passed"] else 9.0)
        assert step["late_p50_ms"] == 1.0
        assert step["cpu_s_per_1m"] == 2.5
    json.dumps(record, allow_nan=False)  # what --json writes


def test_refinement_bisects_between_the_coarse_pass_and_failure() -> None:
    """The 1.25 grid jumps 244k -> 305k: two bisections show a ceiling of 258k."""
    tried: list[int] = []
    record = search(
        fake(265_000, tried),  # type: ignore[arg-type]
        "wheel", "uvloop", "on", "high", "shared",
        start=100_000, step=1.25, max_rate=800_000, seconds=1.0, refine=2,
    )  # fmt: skip
    coarse = [100_000, 125_000, 156_250, 195_312, 244_141, 305_176]
    assert tried == [*coarse, 272_958, 258_147]  # sqrt(244k*305k), then sqrt(244k*273k)
    assert 244_141 < record["ceiling_per_s"] < 305_176  # type: ignore[operator]
    assert record["ceiling_per_s"] == 258_147
    assert record["failed_at_per_s"] == 272_958  # the lowest failure above the ceiling
    assert record["failed_because"] == "p99 lateness 9.0 ms"
    assert record["refined"] == 2
    assert record["tried"] == 8
    steps = record["steps"]
    assert isinstance(steps, list)
    assert [s["passed"] for s in steps[-2:]] == [False, True]


def test_refinement_judges_by_the_majority_and_follows_a_step_down() -> None:
    tried: list[int] = []
    script = {
        100_000: iter([False, False]),
        50_000: iter([False, True, False]),  # fails by majority: the lowest failure
        25_000: iter([True]),
        35_355: iter([False, True, True]),  # one bad run: the rate passes
        42_045: iter([False, False]),
    }
    record = search(
        scripted(script, tried),  # type: ignore[arg-type]
        "heap", "asyncio", "on", "high", "shared",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0, confirm=3, refine=2,
    )  # fmt: skip
    assert tried == [100_000] * 2 + [50_000] * 3 + [25_000] + [35_355] * 3 + [42_045] * 2
    assert record["ceiling_per_s"] == 35_355
    assert record["failed_at_per_s"] == 42_045
    assert record["refined"] == 2
    assert record["tried"] == 11


def test_refinement_needs_a_bracket_wider_than_one_request() -> None:
    tried: list[int] = []
    record = search(
        fake(1e9, tried),  # type: ignore[arg-type]
        "wheel", "asyncio", "on", "low", "shared",
        start=100_000, step=2.0, max_rate=400_000, seconds=1.0, refine=2,
    )  # fmt: skip
    assert tried == [100_000, 200_000, 400_000]  # no failure: nothing to bisect
    assert record["refined"] == 0
    tried.clear()
    record = search(
        fake(1_001, tried),  # type: ignore[arg-type]
        "wheel", "asyncio", "on", "low", "shared",
        start=1_000, step=1.001, max_rate=2_000, seconds=1.0, refine=3,
    )  # fmt: skip
    assert tried == [1_000, 1_001]  # 1,000.5 rounds onto the bracket: stop
    assert (record["ceiling_per_s"], record["failed_at_per_s"], record["refined"]) == (
        1_000,
        1_001,
        0,
    )
    with pytest.raises(ValueError, match="refine must be a whole number"):
        search(
            fake(1e9, []),  # type: ignore[arg-type]
            "wheel", "asyncio", "on", "low", "shared",
            start=100_000, step=2.0, max_rate=400_000, seconds=1.0, refine=-1,
        )  # fmt: skip


def test_the_refine_knob_of_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Smoke size refines once; --refine 0 turns it off (0 is not "unset")."""
    out = tmp_path / "ceiling.json"
    argv = ["--smoke", "--impl", "wheel", "--loop", "asyncio", "--scenario", "low"]
    argv += ["--keys", "shared", "--json", str(out)]
    for extra, expected in (([], [2_000, 3_000, 2_449]), (["--refine", "0"], [2_000, 3_000])):
        tried: list[int] = []
        assert ceiling.main([*argv, *extra], fake(2_500, tried)) == 0  # type: ignore[arg-type]
        assert tried == expected
        (record,) = json.loads(out.read_text())
        assert [s["rate"] for s in record["steps"]] == expected
    assert "## ceiling" in capsys.readouterr().out
    assert ceiling.SIZES["full"]["refine"] == 2
    assert ceiling.SIZES["quick"]["refine"] == ceiling.SIZES["smoke"]["refine"] == 1


def test_a_failing_start_steps_down_and_a_passing_top_stops() -> None:
    tried: list[int] = []
    record = search(
        fake(50_000, tried),  # type: ignore[arg-type]
        "heap", "asyncio", "off", "high", "unique",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0,
    )  # fmt: skip
    assert tried == [100_000, 50_000, 25_000]
    assert record["ceiling_per_s"] == 25_000
    tried.clear()
    record = search(
        fake(1e9, tried),  # type: ignore[arg-type]
        "wheel", "asyncio", "on", "low", "shared",
        start=100_000, step=2.0, max_rate=400_000, seconds=1.0,
    )  # fmt: skip
    assert tried == [100_000, 200_000, 400_000]
    assert record["ceiling_per_s"] == 400_000
    assert record["failed_at_per_s"] is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"achieved_pct": 99.4}, "achieved 99.4% of the offered rate"),
        ({"early": 2}, "2 expired early"),
        ({"unfinished": 1}, "unfinished or doubly finished requests"),
        ({"error": "boom"}, "error: boom"),
        ({"late_p99_ms": None}, None),  # nothing expired: no lateness to judge
    ],
)
def test_the_bar(change: Record, reason: str | None) -> None:
    assert verdict({**PASS, **change}) == reason


def test_the_jvm_anchor_is_judged_by_the_same_bar() -> None:
    def row(rate: int, actual: float, p99: float) -> str:
        return json.dumps(
            {
                "label": "low",
                "rate": rate,
                "target_rate": rate,
                "actual_rate": actual,
                "late_ms_p99": p99,
                "cpu_s_per_1M": 5.0,
            }
        )

    lines = [row(50_000, 50_000, 4.0)] * 2 + [row(50_000, 50_000, 9.0)]
    lines += [row(100_000, 100_000, 40.0)] * 3 + [row(200_000, 150_000, 300.0)] * 3
    anchor = jvm_anchor([*lines, "DONE"])
    assert anchor["low"]["ceiling_per_s"] == 50_000
    assert anchor["low"]["max_sustained_per_s"] == 150_000
    if anchor_path().exists():  # the shared anchors beside the checkout
        real = jvm_anchor(anchor_path().read_text().splitlines())
        assert set(real) == {"low", "high"}
        assert all(a["max_sustained_per_s"] > 100_000 for a in real.values())


def test_ceiling_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both holds in one run, at small durations given explicitly: the steady hold's
    warm-up and cap reach the runs, and every run carries its collections and stall."""
    out = tmp_path / "ceiling.json"
    argv = ["ceiling", "--smoke", "--impl", "wheel,heap", "--loop", "uvloop", "--gc", "on"]
    argv += ["--seconds", "0.1", "--warmup", "0.05", "--requests", "300"]
    argv += ["--hold", "steady,short"]
    status = main([*argv, "--scenario", "low", "--keys", "shared", "--json", str(out)])

    assert status == 0
    text = capsys.readouterr().out
    assert "## ceiling" in text
    assert "JVM ceiling/s" in text
    assert "gc 0/1/2, stall ms" in text
    assert "steady 0.1 s" in text
    assert "short 0.1 s" in text
    records = json.loads(out.read_text())
    assert {(r["impl"], r["hold"]) for r in records} == {
        (impl, hold) for impl in ("wheel", "heap") for hold in ("steady", "short")
    }
    for record in records:
        assert record["suite"] == "ceiling"
        assert isinstance(record["ceiling_per_s"], int)
        assert record["tried"] == len(record["steps"]) >= 1
        assert isinstance(record["refined"], int)
        steady = record["hold"] == "steady"
        assert record["hold_s"] == 0.1
        assert record["warmup_s"] == (0.05 if steady else 0.0)
        assert record["hold_requests"] == (300 if steady else None)
        if record["ceiling_per_s"]:
            for field in ("gc0", "gc1", "gc2", "stall_max_ms"):
                assert isinstance(record[field], int | float), (field, record)
        for step in record["steps"]:
            assert set(step) == {"rate", *STEP_FIELDS, "passed"}
            assert isinstance(step["passed"], bool)
            assert isinstance(step["achieved_per_s"], int)
            for field in ("gc0", "gc1", "gc2"):
                assert isinstance(step[field], int)
                assert step[field] >= 0
            assert isinstance(step["stall_max_ms"], float)
            assert step["stall_max_ms"] >= 0
            assert step["window_s"] > 0
            # at most --requests counted (300), or 0.1 s of them; the short step uncapped
            expected = min(300, step["rate"] * 0.1) if steady else step["rate"] * 0.1
            assert abs(step["requests"] - expected) <= 1


def test_the_hold_reaches_every_run_and_the_record() -> None:
    """The steady hold: warm-up and the cap on requests in every run's params; the
    record keeps the ceiling's and the failing rate's collections and stall."""
    seen: list[dict[str, int | float | str]] = []

    def run(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
        seen.append(params)
        rate = params["rate"]
        assert isinstance(rate, int)
        ok = rate < 300_000
        return {
            **PASS,
            "rate": rate,
            "late_p99_ms": 2.0 if ok else 9.0,
            "gc0": 400 if ok else 900,
            "gc1": 30,
            "gc2": 0 if ok else 1,
            "gc_pause_max_ms": 1.5,
            "stall_max_ms": 3.0 if ok else 12.0,
            "window_s": 4.0,
        }

    record = search(
        run, "wheel", "asyncio", "on", "high", "shared",
        start=200_000, step=1.25, max_rate=800_000, seconds=4.0, warmup=1.0,
        requests=1_000_000, hold="steady",
    )  # fmt: skip
    assert [(p["rate"], p["requests"], p["warmup"], p["max_seconds"]) for p in seen] == [
        (200_000, 800_000, 1.0, 4.0),
        (250_000, 1_000_000, 1.0, 4.0),  # a million before 4 s
        (312_500, 1_000_000, 1.0, 4.0),
    ]
    assert (record["hold"], record["hold_s"], record["warmup_s"]) == ("steady", 4.0, 1.0)
    assert record["hold_requests"] == 1_000_000
    assert (record["gc0"], record["gc2"], record["stall_max_ms"]) == (400, 0, 3.0)
    assert (record["failed_gc0"], record["failed_gc2"], record["failed_stall_max_ms"]) == (
        900,
        1,
        12.0,
    )
    text = ceiling.render([record], None, markdown=True)
    assert "| steady 4 s | 250k |" in text
    assert "| 400/30/0, 3.00 | 312k: p99 lateness 9.0 ms | 900/30/1, 12.00 |" in text
    with pytest.raises(ValueError, match="warmup"):
        search(
            run, "wheel", "asyncio", "on", "high", "shared",
            start=200_000, step=1.25, max_rate=800_000, seconds=4.0, warmup=-1.0,
        )  # fmt: skip


def test_short_reproduces_the_published_step(tmp_path: Path) -> None:
    """--short: 1.5 s at full size, no warm-up, no cap, whatever the steady knobs say."""
    seen: list[dict[str, int | float | str]] = []

    def run(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
        seen.append(params)
        return {**PASS, "rate": params["rate"], "late_p99_ms": 9.0}  # every rate fails

    out = tmp_path / "ceiling.json"
    argv = ["--impl", "wheel", "--loop", "asyncio", "--scenario", "high", "--keys", "shared"]
    argv += ["--start", "800000", "--confirm", "1", "--requests", "5", "--json", str(out)]
    assert ceiling.main([*argv, "--short"], run) == 0
    assert {(p["max_seconds"], p["warmup"]) for p in seen} == {(1.5, 0.0)}
    assert seen[0]["requests"] == 1_200_000  # 1.5 s at 800k/s: no million cap
    (record,) = json.loads(out.read_text())
    assert (record["hold"], record["hold_s"], record["hold_requests"]) == ("short", 1.5, None)
    with pytest.raises(SystemExit):
        ceiling.main([*argv, "--hold", "sprint"], run)
    assert ceiling.SIZES["full"]["seconds"] == 4.0
    assert ceiling.SIZES["full"]["requests"] == 1_000_000
    assert ceiling.SIZES["full"]["warmup"] == 1.0


def test_old_records_without_steps_still_render(tmp_path: Path) -> None:
    """bench/ceiling-2026-11-25.json predates the steps and the refinement."""
    new = {**OLD_RECORD, "impl": "heap", "refined": 2, "steps": [], "ceiling_per_s": 51_200}
    for markdown in (False, True):
        text = ceiling.render([OLD_RECORD, new], None, markdown=markdown)
        assert "244k" in text
        assert "305k: achieved 86.5% of the offered rate" in text
        assert "no JVM anchor" in text
    table = ceiling.render([OLD_RECORD], {"low": {"ceiling_per_s": 25_000.0}}, markdown=True)
    # Records made before the steady hold were short steps, and measured no collections.
    assert "| low | shared | wheel | asyncio | on | short | 244k |" in table
    assert "| 3.62 | - | 305k: achieved 86.5% of the offered rate | - |" in table
    assert "9.8x" in table
    # The bench's tables (python -m bench summarize, the docs' tables) show it too.
    assert "## ceiling" in report.render([OLD_RECORD], markdown=True)
    # Two points: the ceiling (passed) and the first failure (its p50 unknown).
    assert report.ceiling_points([OLD_RECORD]) == [
        (244_141.0, 1.073, 1.971, True),
        (305_176.0, None, 3.01, False),
    ]
    saved = tmp_path / "ceiling-2026-11-25.json"
    saved.write_text(json.dumps([OLD_RECORD, {**OLD_RECORD, "error": "boom"}]))
    assert ceiling.read_records([saved]) == [OLD_RECORD]


def _with_steps(impl: str, loop: str, scenario: str, keys: str, limit: float) -> dict[str, Any]:
    tried: list[int] = []
    return search(
        fake(limit, tried),  # type: ignore[arg-type]
        impl, loop, "on", scenario, keys,
        start=100_000, step=1.25, max_rate=800_000, seconds=1.0, refine=2,
    )  # fmt: skip


def test_the_points_of_records_with_steps() -> None:
    record = _with_steps("wheel", "asyncio", "low", "shared", 265_000)
    points = report.ceiling_points([record])
    assert [p[0] for p in points] == sorted({100_000, 125_000, 156_250, 195_312, 244_141,
                                              258_147, 272_958, 305_176})  # fmt: skip
    assert [p[3] for p in points] == [True] * 6 + [False] * 2
    assert all(p[1] == 1.0 for p in points)
    # Confirmations: the median of a rate's runs, passed when most of them passed.
    steps = [
        {"rate": 200_000, "late_p50_ms": 1.0, "late_p99_ms": 9.0, "passed": False},
        {"rate": 200_000, "late_p50_ms": 2.0, "late_p99_ms": 3.0, "passed": True},
        {"rate": 200_000, "late_p50_ms": 3.0, "late_p99_ms": 4.0, "passed": True},
        {"rate": 300_000, "late_p50_ms": None, "late_p99_ms": None, "passed": False},
    ]
    assert report.ceiling_points([{**OLD_RECORD, "steps": steps}]) == [
        (200_000.0, 2.0, 4.0, True),
        (300_000.0, None, None, False),
    ]


def test_the_plot_of_lateness_against_offered_rate(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [
        _with_steps(impl, loop, scenario, keys, limit)
        for impl, limit in (("wheel", 265_000), ("heap", 60_000))
        for loop in ("asyncio", "uvloop")
        for scenario in ("low", "high")
        for keys in ("shared", "unique")
    ]
    records.append({**records[0], "gc": "off"})  # another GC mode: not drawn
    lines = [
        json.dumps(
            {
                "label": scenario,
                "rate": rate,
                "target_rate": rate,
                "actual_rate": rate,
                "late_ms_p50": 0.1,
                "late_ms_p99": rate / 10_000,
                "cpu_s_per_1M": 5.0,
            }
        )
        for scenario in ("low", "high")
        for rate in (10_000, 50_000, 200_000)
    ]
    jvm = jvm_lateness(lines)
    assert jvm["low"] == [
        (10_000.0, 0.1, 1.0, True),
        (50_000.0, 0.1, 5.0, True),
        (200_000.0, 0.1, 20.0, False),
    ]
    data = report.ceiling_plot(records, jvm, source="ceiling-2026-12-01.json")
    assert data is not None
    svg = data.decode()
    ET.fromstring(svg)
    for text in (
        "aiopurgatory, compiled: p99",
        "aiopurgatory, compiled: p50",
        "loop.call_later per operation: p99",
        "Kafka's JVM purgatory",
        "the bar: p99 5 ms",
        "high, unique keys, uvloop, GC on",
        "ceiling-2026-12-01.json",
    ):
        assert text in svg, text
    assert "GC off" not in svg
    assert report.ceiling_plot(records, None, source="x") == report.ceiling_plot(
        records, None, source="x"
    )  # the same records draw the same bytes: a committed figure changes only with them
    assert report.ceiling_plot(records, None, gc="freeze") is None
    assert report.ceiling_plot([], jvm) is None

    # Old records (no steps) and the command line that redraws the committed figure.
    old = tmp_path / "ceiling-2026-11-25.json"
    old.write_text(json.dumps([OLD_RECORD, {**OLD_RECORD, "loop": "uvloop"}]))
    out = tmp_path / "ceiling-lateness.svg"

    def no_run(*_: object) -> Record:
        raise AssertionError("--records runs nothing")

    argv = ["--records", str(old), "--plot", str(out)]
    assert ceiling.main(argv, no_run, report.ceiling_plot) == 0
    svg = out.read_text()
    ET.fromstring(svg)
    assert "low, shared keys, asyncio, GC on" in svg
    assert "ceiling-2026-11-25.json" in svg


def test_the_docs_draw_the_newest_ceiling_records(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "docs" / "scripts"))
    try:
        import bench_figures
    finally:
        sys.path.remove(str(ROOT / "docs" / "scripts"))
    (tmp_path / "ceiling-2026-11-25.json").write_text(json.dumps([OLD_RECORD]))
    record = _with_steps("wheel", "uvloop", "high", "shared", 265_000)
    (tmp_path / "ceiling-2026-12-01.json").write_text(json.dumps([record]))
    figures = bench_figures.figures(tmp_path)
    assert set(figures) == {"bench-ceiling.svg"}
    svg = figures["bench-ceiling.svg"].decode()
    assert "ceiling-2026-12-01.json" in svg
    assert "high, shared keys, uvloop, GC on" in svg
    assert bench_figures.IMPL_STYLE is report.IMPL_STYLE
    tables = bench_figures.tables_markdown(bench_figures.record_files(tmp_path))
    assert tables.count("#### ceiling") == 2  # old and new records alike
