"""Spark's class-data-sharing archive: where it lives, when a run writes or maps it,
and that a report runs the same with it, without it, and with a damaged one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from aiopurgatory.analysis.class_cache import CLASS_CACHE_ENV, ClassArchive, default_class_cache
from aiopurgatory.analysis.session import JVM_OPTIONS, find_java
from aiopurgatory.analysis.synthetic import generate_trace

pytestmark = pytest.mark.spark

REPO: Path = Path(__file__).resolve().parents[2]


def test_cache_directory_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CLASS_CACHE_ENV, "off")
    assert default_class_cache() is None
    monkeypatch.setenv(CLASS_CACHE_ENV, " OFF ")
    assert default_class_cache() is None
    monkeypatch.setenv(CLASS_CACHE_ENV, str(tmp_path / "c"))
    assert default_class_cache() == tmp_path / "c"
    monkeypatch.delenv(CLASS_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_class_cache() == tmp_path / "xdg" / "aiopurgatory"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_class_cache() == tmp_path / "home" / ".cache" / "aiopurgatory"


def test_first_run_writes_under_a_private_name_later_runs_map(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "cache", sys.executable, JVM_OPTIONS)
    options = archive.java_options()
    writes = archive.dumping
    assert writes
    flag = "-XX:ArchiveClassesAtExit="
    (dump,) = (o.removeprefix(flag) for o in options.split() if o.startswith(flag))
    assert Path(dump).parent == tmp_path / "cache"  # created for the JVM to write into
    assert Path(dump) != archive.path
    assert "-Xlog:all=warning:stderr" in options  # not on stdout, the report's output
    Path(dump).write_bytes(b"archive")
    archive.finish()
    assert archive.path.read_bytes() == b"archive"
    assert not archive.dumping
    assert os.listdir(tmp_path / "cache") == [archive.path.name]

    later = ClassArchive(tmp_path / "cache", sys.executable, JVM_OPTIONS)
    assert later.path == archive.path
    assert f"-XX:SharedArchiveFile={archive.path}" in later.java_options().split()
    assert not later.dumping
    later.finish()
    assert archive.path.read_bytes() == b"archive"


def test_nothing_written_leaves_nothing(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path, sys.executable, JVM_OPTIONS)
    archive.java_options()
    archive.finish()  # a JVM that could not dump (no base archive): no file
    assert os.listdir(tmp_path) == []
    archive = ClassArchive(tmp_path, sys.executable, JVM_OPTIONS)
    options = archive.java_options()
    Path(options.split()[0].split("=", 1)[1]).touch()  # killed before it wrote anything
    archive.finish()
    assert os.listdir(tmp_path) == []


def test_one_archive_per_java_and_options(tmp_path: Path) -> None:
    java = ClassArchive(tmp_path, sys.executable, JVM_OPTIONS).path
    assert ClassArchive(tmp_path, sys.executable, JVM_OPTIONS).path == java
    assert ClassArchive(tmp_path, sys.executable, JVM_OPTIONS + " -Xmx1g").path != java
    other = tmp_path / "other-java"
    other.write_bytes(b"#!/bin/sh\n")
    assert ClassArchive(tmp_path, str(other), JVM_OPTIONS).path != java


def test_no_archive_where_spark_would_split_the_path(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "with space", sys.executable, JVM_OPTIONS)
    assert archive.java_options() == ""
    assert not archive.dumping


def _report(trace: Path, out: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), CLASS_CACHE_ENV: str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "aiopurgatory", "report", str(trace), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.spark
def test_report_writes_then_maps_the_archive_and_survives_a_damaged_one(tmp_path: Path) -> None:
    java = find_java()
    if java is None:
        pytest.skip("Spark needs Java, and none is installed")
    generate_trace(tmp_path / "t", 2_000)
    cache = tmp_path / "cache"
    archive = ClassArchive(cache, java, JVM_OPTIONS).path  # the report's own JVM options

    first = _report(tmp_path / "t", tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-2_000:]
    assert archive.stat().st_size > 1_000_000, os.listdir(cache)
    assert os.listdir(cache) == [archive.name]  # no private dump left behind
    written = archive.stat().st_mtime_ns

    second = _report(tmp_path / "t", tmp_path / "b", cache)
    assert second.returncode == 0, second.stderr[-2_000:]
    assert archive.stat().st_mtime_ns == written  # mapped, not written again

    archive.chmod(0o644)
    archive.write_bytes(b"not an archive")
    damaged = _report(tmp_path / "t", tmp_path / "c", cache)
    assert damaged.returncode == 0, damaged.stderr[-2_000:]

    for run in (first, second, damaged):
        assert "[warning]" not in run.stdout  # the JVM's own logging stays in spark.log
    tables = [pd.read_csv(tmp_path / d / "summary.csv") for d in "abc"]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    pd.testing.assert_frame_equal(tables[0], tables[2])
