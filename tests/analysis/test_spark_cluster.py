"""The job on a real Spark standalone cluster (master and worker started here, on loopback).

Its tables must equal a ``local[*]`` run's on the same trace, through
``aiopurgatory report --master spark://...`` and through ``spark-submit``; executors get a
Python that does not exist, so the job cannot have used a Python UDF. Skipped only when
there is no Java.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from aiopurgatory.analysis.report import build_report
from aiopurgatory.analysis.session import find_java
from aiopurgatory.analysis.spark_cluster import Cluster, report_on, standalone_cluster
from aiopurgatory.analysis.synthetic import generate_trace

from ..support.spark_fixtures import PANDAS_WARNINGS, spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.cluster,
    *PANDAS_WARNINGS,
]

REPO: Path = Path(__file__).resolve().parents[2]
TABLES = ("summary", "timeline", "latency_cdf", "lateness_histogram")
ROWS = 20_000
"""Enough rows for several tasks; the tables are exact sums, minima and maxima, so any
partitioning gives the same ones."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if find_java() is None:
        pytest.skip("Spark needs Java, and none is installed")
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running
    for pid in running.pids:  # the master and worker (and what they started) are gone
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), pid


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("trace")
    generate_trace(directory / "a", ROWS, rows_per_file=6_000, base_wall_ns=10**18)
    generate_trace(directory / "b", 2_000, seed=3, base_wall_ns=10**18 + 10**8)
    return directory


@pytest.fixture(scope="module")
def local_report(
    spark: SparkSession, trace: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("local")
    build_report(spark, [str(trace)], out)
    return out


def assert_same_tables(out: Path, expected: Path) -> None:
    for name in TABLES:
        got = pd.read_parquet(out / "tables" / f"{name}.parquet")
        want = pd.read_parquet(expected / "tables" / f"{name}.parquet")
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9, obj=name)
    assert pd.read_csv(out / "summary.csv")["operations"].sum() == ROWS + 2_000


def test_report_with_master_on_a_standalone_cluster(
    cluster: Cluster, trace: Path, local_report: Path, tmp_path: Path
) -> None:
    done = report_on(cluster, [str(trace)], tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3_000:]
    assert done.stdout == f"report: {tmp_path / 'out' / 'report.md'}\n"
    assert f"on {cluster.master_url}" in (tmp_path / "out" / "report.md").read_text()
    assert_same_tables(tmp_path / "out", local_report)


def test_spark_submit_on_a_standalone_cluster(
    cluster: Cluster, trace: Path, local_report: Path, tmp_path: Path
) -> None:
    done = report_on(cluster, [str(trace)], tmp_path / "out", submit=True)
    assert done.returncode == 0, done.stderr[-3_000:]
    assert f"report: {tmp_path / 'out' / 'report.md'}" in done.stdout
    assert f"on {cluster.master_url}" in (tmp_path / "out" / "report.md").read_text()
    assert_same_tables(tmp_path / "out", local_report)


def test_the_guides_cluster_section_runs_as_written(tmp_path: Path) -> None:
    """The traces guide's cluster commands: ``make cluster-demo`` is the module it names."""
    if find_java() is None:
        pytest.skip("Spark needs Java, and none is installed")
    readme = (REPO / "docs" / "guides" / "traces.md").read_text()
    section = readme.split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    demo = next(
        line for line in section.splitlines() if "-m aiopurgatory.analysis.spark_cluster" in line
    )
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^cluster-demo:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert target is not None
    assert "-m aiopurgatory.analysis.spark_cluster" in target.group(1)
    args = [*shlex.split(demo.split("-m aiopurgatory.analysis.spark_cluster", 1)[1].split("#")[0])]
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiopurgatory.analysis.spark_cluster",
            *args,
            "--rows",
            "5000",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3_000:]
    assert "cluster stopped" in done.stdout
    assert pd.read_csv(out / "summary.csv")["operations"].sum() == 5_000
