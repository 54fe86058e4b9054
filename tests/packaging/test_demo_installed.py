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
from pathlib import Path

import pandas as pd
import pytest

from ..support.wheels import env_with, install_wheel_in_fresh_venv

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_demo_runs_from_a_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    python, site = install_wheel_in_fresh_venv(tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = env_with(PYTHONPATH=None, AIOPURGATORY_NO_EXTENSIONS=None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"

    def run_there(command: list[str | Path], timeout: float) -> str:
        """What ``command`` prints, run from ``elsewhere`` on the venv's PATH (it must
        succeed)."""
        done = subprocess.run(
            command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    where = run_there(
        [
            python,
            "-c",
            "import aiopurgatory.kafka.simulator as b, aiopurgatory as a;"
            " print(a.__file__); print(b.__file__)",
        ],
        timeout=60,
    )
    for file in where.split():
        assert Path(file).is_relative_to(site), where  # the wheel, not the checkout

    out = elsewhere / "report"
    demo = run_there(
        [python.parent / "aiopurgatory", "demo", "--duration", "1.5", "--no-sweep", "--out", out],
        timeout=600,
    )
    assert demo == f"report: {out / 'report.md'}\n"
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["purgatory"]) == {"produce", "fetch"}
    assert summary["operations"].sum() > 0
    assert "aiopurgatory.kafka.simulator" in (out / "report.md").read_text()
