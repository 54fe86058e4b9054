"""``aiopurgatory demo`` from a wheel installed in a fresh virtual environment.

The wheel is built from a copy of the checkout and installed into a new venv, whose
console script runs in a directory outside any checkout. The analysis extra's
dependencies (PySpark, pyarrow, pandas, matplotlib, tqdm) come from this test run's
environment through a path entry appended after the fresh venv's own site-packages,
rather than downloaded again: a ``.pth`` line adds a directory to ``sys.path`` without
processing the ``.pth`` files inside it, so the editable install of the checkout there
stays out of reach, and ``aiopurgatory`` can only be the installed wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

from .test_build import _copy_source, _env, _pip_wheel

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NO_DEPS = ("--no-deps", "--no-index")  # the wheel alone: its dependencies are found below


def _fresh_venv(path: Path) -> Path:
    """A new virtual environment without pip; returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = path / "bin" / "python"
    assert python.is_file()
    return python


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(PYTHONPATH=None),
    )
    return Path(out.stdout.strip())


def install_wheel_in_fresh_venv(tmp_path: Path) -> tuple[Path, Path]:
    """Build a pure-Python wheel from a copy of the checkout, install it alone into a new
    venv that reaches this run's dependencies; returns (its python, its site-packages)."""
    # A pure-Python wheel builds in seconds; the compiled one is test_build's business.
    source = _copy_source(tmp_path / "src")
    wheel = _pip_wheel(source, tmp_path / "dist", _env(AIOPURGATORY_NO_EXTENSIONS="1"))
    python = _fresh_venv(tmp_path / "venv")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--ignore-installed",
            *NO_DEPS,
            wheel,
        ],
        check=True,
        capture_output=True,
        timeout=300,
        # Without PYTHONPATH: a Spark session started by an earlier test puts the
        # checkout there (for its Python workers), and pip would then find
        # aiopurgatory "already installed" and install nothing.
        env=_env(PYTHONPATH=None),
    )
    site = _site_packages(python)
    (site / "zz-test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python, site


def test_the_demo_runs_from_a_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    python, site = install_wheel_in_fresh_venv(tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(PYTHONPATH=None, AIOPURGATORY_NO_EXTENSIONS=None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import aiopurgatory.kafka.simulator as b, aiopurgatory as a;"
            " print(a.__file__); print(b.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    for file in where.stdout.split():
        assert Path(file).is_relative_to(site), where.stdout  # the wheel, not the checkout

    out = elsewhere / "report"
    demo = subprocess.run(
        [python.parent / "aiopurgatory", "demo", "--duration", "1.5", "--no-sweep", "--out", out],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert demo.stdout == f"report: {out / 'report.md'}\n"
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["purgatory"]) == {"produce", "fetch"}
    assert summary["operations"].sum() > 0
    assert "aiopurgatory.kafka.simulator" in (out / "report.md").read_text()
