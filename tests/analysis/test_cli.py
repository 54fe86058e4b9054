"""The command line: user errors in one line, the report command, a demo smoke run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq
import pytest

from aiopurgatory.analysis.eventlog import stage_times
from aiopurgatory.analysis.synthetic import generate_trace
from aiopurgatory.cli import main
from aiopurgatory.trace import COLUMNS

from ..support.spark_fixtures import PANDAS_WARNINGS, spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, *PANDAS_WARNINGS]

REPO: Path = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "aiopurgatory", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line_error(stderr: str, message: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("aiopurgatory: error: ")
    assert message in lines[0]


def test_help_lists_both_commands() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    assert "demo" in out.stdout
    assert "report" in out.stdout


def test_missing_trace_directory(tmp_path: Path) -> None:
    out = run_cli("report", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert out.returncode == 1
    assert_one_line_error(out.stderr, "trace directory not found")


def test_the_spark_submit_file_runs_the_report_command_alone(tmp_path: Path) -> None:
    """analysis/submit.py (what spark-submit runs) is below the command line: it imports
    none of it, nor pandas or Spark until the report runs, and errs as it does."""
    submit = REPO / "aiopurgatory" / "analysis" / "submit.py"
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    code = (
        "import sys, aiopurgatory.analysis.submit;"
        " print([m for m in ('aiopurgatory.cli', 'pandas', 'pyspark') if m in sys.modules])"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60
    )
    assert imported.stdout == "[]\n", imported.stderr
    missing = str(tmp_path / "nope")
    done = subprocess.run(
        [sys.executable, str(submit), "report", missing, "--out", str(tmp_path / "out")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert_one_line_error(done.stderr, "trace directory not found")
    usage = subprocess.run(
        [sys.executable, str(submit), "report", "--help"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    for option in ("--out", "--master", "--bench", "--sweep", "--profile"):
        assert option in usage.stdout


def test_directory_without_traces(tmp_path: Path) -> None:
    out = run_cli("report", str(tmp_path), "--out", str(tmp_path / "out"))
    assert out.returncode == 1
    assert_one_line_error(out.stderr, "no trace files (trace-*.parquet) under")


def test_no_java(tmp_path: Path) -> None:
    generate_trace(tmp_path / "t", 10)
    out = run_cli(
        "report",
        str(tmp_path / "t"),
        "--out",
        str(tmp_path / "out"),
        env={"JAVA_HOME": str(tmp_path / "no-jdk")},
    )
    assert out.returncode == 1
    assert_one_line_error(out.stderr, "Spark needs Java 17 or later, and none was found")


def test_missing_benchmark_records(tmp_path: Path) -> None:
    generate_trace(tmp_path / "t", 10)
    out = run_cli(
        "report", str(tmp_path / "t"), "--out", str(tmp_path / "o"), "--bench", "nope.json"
    )
    assert out.returncode == 1
    assert_one_line_error(out.stderr, "benchmark records not found: nope.json")


def test_bad_duration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--duration", "0", "--out", str(tmp_path)]) == 1
    assert_one_line_error(capsys.readouterr().err, "--duration must be > 0")


@pytest.mark.spark
def test_malformed_file_gives_one_line(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    traces = tmp_path / "t"
    traces.mkdir()
    (traces / "trace-0000000000000000001-abcd-000000.parquet").write_bytes(b"garbage")
    assert main(["report", str(traces), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err, "cannot analyse traces")
    assert "at org.apache" not in err
    assert "Traceback" not in err


@pytest.mark.spark
def test_report_command(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    generate_trace(tmp_path / "t", 5_000)
    assert main(["report", str(tmp_path / "t"), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == f"report: {tmp_path / 'out' / 'report.md'}\n"
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert summary["operations"].sum() == 5_000


@pytest.mark.spark
def test_demo_smoke(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "report"
    assert main(["demo", "--duration", "1.5", "--out", str(out), "--no-sweep"]) == 0
    assert capsys.readouterr().out == f"report: {out / 'report.md'}\n"
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["purgatory"]) == {"produce", "fetch"}
    assert summary["early_expiries"].sum() == 0
    assert (out / "plots" / "throughput.png").is_file()
    assert "broker simulator" in (out / "report.md").read_text()
    assert any((out / "traces").glob("trace-*.parquet"))


@pytest.mark.spark
@pytest.mark.slow
def test_report_through_spark_connect(tmp_path: Path) -> None:
    """``SPARK_REMOTE=local[2]``: pyspark starts a Spark Connect server, the job is its client."""
    pytest.importorskip("grpc", reason="Spark Connect needs pip install 'pyspark[connect]'")
    generate_trace(tmp_path / "t", 2_000)
    out = run_cli(
        "report",
        str(tmp_path / "t"),
        "--out",
        str(tmp_path / "out"),
        env={"SPARK_REMOTE": "local[2]"},
    )
    assert out.returncode == 0, out.stderr[-2_000:]
    assert out.stdout == f"report: {tmp_path / 'out' / 'report.md'}\n"
    assert "Spark Connect" not in out.stderr  # no error about the client
    assert pd.read_csv(tmp_path / "out" / "summary.csv")["operations"].sum() == 2_000


def test_trace_synth_writes_a_trace(tmp_path: Path) -> None:
    out = run_cli("trace", "synth", "--rows", "2500", "--out", str(tmp_path / "t"), "--seed", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trace: {tmp_path / 't'}\n"
    table = pq.read_table(tmp_path / "t")
    assert table.num_rows == 2_500
    assert table.schema.names == list(COLUMNS)
    bad = run_cli("trace", "synth", "--rows", "0", "--out", str(tmp_path / "u"))
    assert bad.returncode == 1
    assert_one_line_error(bad.stderr, "--rows must be >= 1")


@pytest.mark.spark
def test_report_profile_prints_steps_and_stages(tmp_path: Path) -> None:
    generate_trace(tmp_path / "t", 3_000)
    out = run_cli(
        "report",
        str(tmp_path / "t"),
        "--out",
        str(tmp_path / "out"),
        "--master",
        "local[2]",
        "--profile",
    )
    assert out.returncode == 0, out.stderr[-2_000:]
    err = out.stderr
    for step in ("starting Spark", "summary and latency percentiles", "time line and lateness"):
        assert re.search(rf"^  {step}.* \d+\.\d\d$", err, flags=re.MULTILINE), (step, err)
    assert "(3,000 rows," in err
    assert "profile: Spark stages (from the event log)" in err
    stages = stage_times(tmp_path / "out" / "spark-events")
    assert len(stages) >= 2
    assert stages["input_rows"].max() == 3_000  # the trace is read whole, by one stage ...
    assert (stages["input_rows"] == 3_000).sum() == 2  # ... twice: summary and events
