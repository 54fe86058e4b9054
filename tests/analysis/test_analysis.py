"""The Spark job against a pandas computation of the same figures on generated traces."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aiopurgatory.analysis import AnalysisError, ReportInputs, TraceAnalysis, analyze, write_report
from aiopurgatory.analysis.bench_records import bench_rates
from aiopurgatory.analysis.job import (
    CDF_QUANTILES,
    LATENESS_BINS,
    RELATIVE_ERROR,
    SCHEMA_DDL,
    SUMMARY_QUANTILES,
    check_local_traces,
    nice_width,
)
from aiopurgatory.analysis.report import SUMMARY_COLUMNS
from aiopurgatory.analysis.sweep import Scenario, run_sweep, simulate
from aiopurgatory.analysis.synthetic import generate_trace
from aiopurgatory.trace import COLUMNS, FIELDS, FILE_PATTERN, trace_schema, write_trace_table

from ..support.spark_fixtures import PANDAS_WARNINGS, spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, *PANDAS_WARNINGS]

WALL: int = 1_700_000_000_000_000_000
GROUP = ["purgatory", "kind"]


def write_rows(directory: Path, rows: list[tuple[object, ...]], *, wall: int, seq: int = 0) -> None:
    names = trace_schema().names
    table = pa.Table.from_pylist(
        [dict(zip(names, r, strict=True)) for r in rows], schema=trace_schema()
    )
    write_trace_table(directory, table, base_wall_ns=wall, base_clock_ns=0, token="abcd", seq=seq)


def reference(*directories: Path) -> pd.DataFrame:
    """Every row, with wall-clock times, read with pyarrow."""
    frames = []
    for directory in directories:
        for path in sorted(directory.rglob("trace-*.parquet")):
            match = re.match(FILE_PATTERN, path.name)
            assert match is not None
            frame = pq.read_table(path).to_pandas()
            for column in ("created", "deadline", "finished"):
                frame[column] = frame[f"{column}_ns"].astype("Int64") + int(match.group(1))
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first = generate_trace(
        tmp_path_factory.mktemp("broker-1"), 120_000, rows_per_file=40_000, base_wall_ns=WALL
    )
    second = tmp_path_factory.mktemp("broker-2")
    # A second recording, 1.5 s later on the wall clock, in a nested directory.
    generate_trace(second / "run", 30_000, seed=7, base_wall_ns=WALL + 1_500_000_000)
    ms = 1_000_000
    write_rows(
        second,
        [
            ("edge", "Early", 1, 0, 10 * ms, 9 * ms, "expired"),  # 1 ms early
            ("edge", "Early", 2, 0, 10 * ms, 30 * ms, "expired"),  # far beyond the histogram
            ("edge", "Early", 1, 5 * ms, None, 7 * ms, "completed"),
        ],
        wall=WALL,
    )
    return first, second


@pytest.fixture(scope="module")
def result(spark: SparkSession, traces: tuple[Path, Path]) -> TraceAnalysis:
    return analyze(spark, [str(p) for p in traces])


@pytest.fixture(scope="module")
def rows(traces: tuple[Path, Path]) -> pd.DataFrame:
    return reference(*traces)


def within_value_error(values: np.ndarray, q: float, approx: float) -> bool:
    """Whether ``approx`` is within the job's relative error of the value of rank
    ceil(q * n) in ``values`` (the smallest with a fraction q at or below it)."""
    ordered = np.sort(values)
    exact = ordered[max(1, math.ceil(round(q * len(ordered), 6))) - 1]
    return bool(abs(approx - exact) <= RELATIVE_ERROR * abs(exact) + 1e-9)


@pytest.mark.spark
def test_counts_rates_and_extremes_match_pandas(result: TraceAnalysis, rows: pd.DataFrame) -> None:
    expected = rows.groupby(GROUP).agg(
        operations=("outcome", "size"),
        mean_keys=("num_keys", "mean"),
        first_ns=("created", "min"),
        last_ns=("finished", "max"),
    )
    outcomes = rows.groupby(GROUP)["outcome"].value_counts().unstack(fill_value=0)
    expired = rows[rows["outcome"] == "expired"]
    lateness = (expired["finished"] - expired["deadline"]).astype("int64") / 1e6
    by_group = expired.assign(lateness=lateness).groupby(GROUP)["lateness"]
    summary = result.summary.set_index(GROUP).sort_index()
    assert list(summary.index) == list(expected.index)
    for column in ("operations", "first_ns", "last_ns"):
        assert summary[column].tolist() == expected[column].tolist()
    assert np.allclose(summary["mean_keys"], expected["mean_keys"])
    for outcome in ("completed", "expired", "cancelled", "closed"):
        counts = outcomes.get(outcome, pd.Series(0, index=outcomes.index))
        assert summary[outcome].tolist() == counts.reindex(expected.index, fill_value=0).tolist()
    assert np.allclose(summary["timeout_rate"], summary["expired"] / summary["operations"])
    maxima = by_group.max().reindex(expected.index)
    assert np.allclose(summary["lateness_max_ms"], maxima, equal_nan=True)
    early = (lateness < 0).groupby([expired["purgatory"], expired["kind"]]).sum()
    assert (
        summary["early_expiries"].to_dict() == early.reindex(expected.index, fill_value=0).to_dict()
    )
    assert summary.loc[("edge", "Early"), "early_expiries"] == 1
    assert result.operations == len(rows)
    assert result.start_wall_ns == rows["created"].min()


@pytest.mark.spark
def test_percentiles_have_exact_ranks_and_values_within_the_relative_error(
    result: TraceAnalysis, rows: pd.DataFrame
) -> None:
    rows = rows.assign(
        latency=(rows["finished"] - rows["created"]).astype("int64") / 1e6,
        lateness=(rows["finished"] - rows["deadline"]).astype("float64") / 1e6,
    )
    checked = 0
    for (purgatory, kind), group in rows.groupby(GROUP):
        line = result.summary[
            (result.summary["purgatory"] == purgatory) & (result.summary["kind"] == kind)
        ].iloc[0]
        completed = group.loc[group["outcome"] == "completed", "latency"].to_numpy()
        for q in SUMMARY_QUANTILES:
            name = {0.5: "p50", 0.9: "p90", 0.99: "p99", 0.999: "p999"}[q]
            assert within_value_error(completed, q, line[f"latency_{name}_ms"]), (kind, q)
            checked += 1
        late = group.loc[group["outcome"] == "expired", "lateness"].to_numpy()
        if len(late):
            assert within_value_error(late, 0.5, line["lateness_p50_ms"])
            assert within_value_error(late, 0.99, line["lateness_p99_ms"])
        else:
            assert math.isnan(line["lateness_p99_ms"])
    assert checked == 4 * len(result.summary)
    cdf = result.latency_cdf
    assert sorted(set(cdf["quantile"])) == list(CDF_QUANTILES)
    for (purgatory, kind), curve in cdf.groupby(GROUP):
        assert curve["latency_ms"].is_monotonic_increasing
        group = rows[(rows["purgatory"] == purgatory) & (rows["kind"] == kind)]
        completed = group.loc[group["outcome"] == "completed", "latency"].to_numpy()
        for q, value in zip(curve["quantile"], curve["latency_ms"], strict=True):
            assert within_value_error(completed, q, value), (kind, q)


@pytest.mark.spark
def test_time_line_matches_pandas(result: TraceAnalysis, rows: pd.DataFrame) -> None:
    width = round(result.bin_seconds * 1e9)
    start = rows["created"].min()
    bins = int((rows["finished"].max() - start) // width + 1)
    assert result.bin_seconds == nice_width(result.duration_s / 200)
    created = rows.assign(bin=(rows["created"] - start) // width, event="created")
    finished = rows.assign(bin=(rows["finished"] - start) // width, event=rows["outcome"])
    events = pd.concat([created, finished])[[*GROUP, "bin", "event"]]
    counts = events.groupby([*GROUP, "bin", "event"]).size().unstack(fill_value=0)
    timeline = result.timeline.set_index([*GROUP, "bin"])
    assert len(timeline) == bins * len(result.summary)
    for column in counts.columns:
        dense = counts[column].reindex(timeline.index, fill_value=0)
        assert timeline[column].tolist() == dense.tolist(), column
    change = timeline["created"] - timeline["finished"]
    assert timeline["pending"].tolist() == change.groupby(level=[0, 1]).cumsum().tolist()
    assert (timeline["pending"] >= 0).all()
    assert timeline.groupby(level=[0, 1])["pending"].last().eq(0).all()


@pytest.mark.spark
def test_lateness_histogram_matches_pandas(result: TraceAnalysis, rows: pd.DataFrame) -> None:
    expired = rows[rows["outcome"] == "expired"]
    lateness = (expired["finished"] - expired["deadline"]).astype("int64") / 1e6
    index = np.clip(np.floor(lateness / result.lateness_bin_ms), -1, LATENESS_BINS).astype(int)
    expected = expired.assign(bin=index).groupby([*GROUP, "bin"]).size()
    histogram = result.lateness.set_index([*GROUP, "bin"])["count"]
    assert histogram.sort_index().to_dict() == expected.sort_index().to_dict()
    early = result.lateness[result.lateness["bin"] == -1]
    assert early[["kind", "count", "high_ms"]].values.tolist() == [["Early", 1, 0.0]]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not parquet at all", "cannot analyse traces"),
        ("bad outcome", "malformed traces: 1 rows"),
        ("wrong types", "cannot analyse traces"),
        ("no rows", "no trace rows found"),
    ],
)
def test_bad_traces_give_one_line(
    spark: SparkSession, tmp_path: Path, content: bytes | str, message: str
) -> None:
    if isinstance(content, bytes):
        (tmp_path / "trace-0000000000000000001-abcd-000000.parquet").write_bytes(content)
    elif content == "bad outcome":
        write_rows(tmp_path, [("p", "K", 1, 0, None, 5, "exploded")], wall=1)
    elif content == "wrong types":
        table = pa.table({"purgatory": ["p"], "created_ns": ["yesterday"]})
        pq.write_table(table, tmp_path / "trace-0000000000000000001-abcd-000000.parquet")
    else:
        write_rows(tmp_path, [], wall=1)
    with pytest.raises(AnalysisError, match=message) as caught:
        analyze(spark, [str(tmp_path)])
    assert "\n" not in str(caught.value)


def test_local_paths_are_checked_before_spark_starts(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="trace directory not found"):
        check_local_traces([str(tmp_path / "missing")])
    with pytest.raises(AnalysisError, match=r"no trace files \(trace-\*\.parquet\) under"):
        check_local_traces([str(tmp_path)])
    with pytest.raises(AnalysisError, match="no trace directory given"):
        check_local_traces([])
    check_local_traces(["hdfs://namenode/traces"])  # left to Spark


@pytest.mark.parametrize(
    ("value", "width"),
    [(0.7, 1.0), (1.0, 1.0), (1.2, 2.0), (3.0, 5.0), (0.0123, 0.02), (600, 1000)],
)
def test_nice_width(value: float, width: float) -> None:
    assert nice_width(value) == pytest.approx(width)


SCENARIO = Scenario("test", rate=5_000.0, timeout=0.2, median=0.2, p75=0.4)


def test_simulation_is_never_early_and_late_by_under_a_tick() -> None:
    for tick_ms, size in [(1.0, 8), (5.0, 20), (0.5, 4)]:
        row = simulate(SCENARIO, tick_ms, size, 3_000, seed=1)
        assert row["early"] == 0
        assert 0 <= float(row["lateness_max_ms"]) <= tick_ms
        assert 1_000 < int(row["expired"]) < 2_000  # the median reaches the timeout
        assert float(row["reinserts_per_op"]) > 0
        assert int(row["heap_max"]) <= size * int(row["levels"])


def test_a_wheel_covering_every_timeout_never_cascades() -> None:
    row = simulate(SCENARIO, 1.0, 4_096, 2_000)
    assert (row["levels"], row["reinserts_per_op"]) == (1, 0.0)


@pytest.mark.spark
def test_sweep_tasks_compute_what_a_local_run_does(spark: SparkSession) -> None:
    frame = run_sweep(
        spark, scenarios=[SCENARIO], ticks_ms=[1.0, 10.0], wheel_sizes=[8, 64], operations=1_500
    )
    assert len(frame) == 4
    for row in frame.to_dict("records"):
        local = simulate(SCENARIO, row["tick_ms"], row["wheel_size"], 1_500)
        del row["sim_seconds"], local["sim_seconds"]
        assert row == pytest.approx(local)


def bench_records() -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for impl, factor in [("wheel", 1.0), ("heap", 0.5)]:
        for rate in (1_000, 2_000):
            for repeat in range(3):
                achieved = rate * factor + repeat
                records.append(
                    {
                        "suite": "purgatory",
                        "impl": impl,
                        "loop": "asyncio",
                        "gc": "on",
                        "scenario": "low",
                        "keys": "shared",
                        "rate": rate,
                        "achieved_per_s": achieved,
                    }
                )
    records.append({"suite": "timer", "impl": "wheel", "loop": "asyncio", "ops_per_s": 1.0})
    records.append({"suite": "purgatory", "impl": "task", "rate": 1, "error": "boom"})
    return records


def test_bench_rates_are_medians_per_target_rate() -> None:
    rates = bench_rates(pd.DataFrame(bench_records()))
    assert rates.to_dict("records") == [
        {
            "panel": "low, shared, asyncio, on",
            "impl": impl,
            "target_rate": rate,
            "achieved_rate": rate * factor + 1,
            "runs": 3,
        }
        for impl, factor in [("heap", 0.5), ("wheel", 1.0)]
        for rate in (1_000, 2_000)
    ]
    assert bench_rates(pd.DataFrame([{"suite": "timer"}])).empty


@pytest.mark.spark
def test_report_directory(result: TraceAnalysis, tmp_path: Path) -> None:
    sweep = pd.DataFrame([simulate(SCENARIO, t, 8, 500) for t in (1.0, 2.0)])
    path = write_report(
        result,
        tmp_path,
        ReportInputs(title="Test report"),
        spark="Spark test",
        sweep=sweep,
        bench=pd.DataFrame(bench_records()),
        seconds=1.0,
    )
    text = path.read_text()
    assert text.startswith("# Test report\n")
    linked = re.findall(r"\]\(([^)]+)\)", text)
    assert "summary.csv" in linked
    for name in linked:
        assert (tmp_path / name).is_file(), name
    pngs = {p for p in linked if p.endswith(".png")}
    assert len(pngs) == 4 + 4 + 1  # trace, sweep, bench figures
    assert all((tmp_path / p).read_bytes().startswith(b"\x89PNG") for p in pngs)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    assert len(summary) == len(result.summary)
    timeline = pd.read_parquet(tmp_path / "tables" / "timeline.parquet")
    assert len(timeline) == len(result.timeline)
    assert "early expiries: **1**" in text


@pytest.mark.spark
def test_job_schema_is_the_writers(spark: SparkSession, tmp_path: Path) -> None:
    """The job's read schema and the trace writer's, tied: drift in either fails here."""
    from pyspark.sql.types import StructType

    write_rows(tmp_path, [("p", "K", 1, 0, None, 5, "completed")], wall=1)
    written = spark.read.parquet(str(tmp_path)).schema  # as Spark sees the writer's file
    declared = StructType.fromDDL(SCHEMA_DDL)
    assert isinstance(declared, StructType)
    assert [(f.name, f.dataType) for f in written] == [(f.name, f.dataType) for f in declared]
    assert tuple(declared.names) == COLUMNS == tuple(trace_schema().names)
    assert [f.nullable for f in trace_schema()] == [nullable for _, _, nullable in FIELDS]
