"""The ceiling search of the purgatory benchmark: its logic on a fake run, its output
on a smoke-size real one. Never a speed assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.ceiling import anchor_path, jvm_anchor, search, verdict
from bench.common import Record

PASS: Record = {
    "achieved_pct": 100.0,
    "late_p50_ms": 1.0,
    "late_p99_ms": 2.0,
    "late_p999_ms": 3.0,
    "cpu_s_per_1m": 2.5,
    "early": 0,
    "doubles": 0,
    "unfinished": 0,
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
    out = tmp_path / "ceiling.json"
    argv = ["ceiling", "--smoke", "--impl", "wheel,heap", "--loop", "uvloop", "--gc", "on"]
    status = main([*argv, "--scenario", "low", "--keys", "shared", "--json", str(out)])

    assert status == 0
    text = capsys.readouterr().out
    assert "## ceiling" in text
    assert "JVM ceiling/s" in text
    records = json.loads(out.read_text())
    assert {r["impl"] for r in records} == {"wheel", "heap"}
    for record in records:
        assert record["suite"] == "ceiling"
        assert isinstance(record["ceiling_per_s"], int)
        assert record["tried"] >= 1
