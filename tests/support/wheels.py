"""Wheels built from a copy of the checkout and installed in fresh virtual environments:
what ``pip install`` gives a user, for the packaging tests.

The wheel is built without build isolation from a copy without build products (the
compiled extensions of the checkout would otherwise leak into it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .servers import ROOT


def env_with(**changes: str | None) -> dict[str, str]:
    """This process's environment with ``changes`` (``None`` removes a variable)."""
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def pip_wheel(source: Path, out: Path, env: dict[str, str]) -> Path:
    """``pip wheel`` of ``source`` into ``out``, without build isolation; the wheel."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = out.glob("aiopurgatory-*.whl")
    return wheel


def copy_source(into: Path) -> Path:
    """The checkout without its build products, virtualenv or caches."""
    shutil.copytree(
        ROOT,
        into,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".git",
            "build",
            "dist",
            "*.egg-info",
            "*.so",
            "*.c",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "purgatory-report",
            "spark-warehouse",
            "metastore_db",
        ),
    )
    return into


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
        env=env_with(PYTHONPATH=None),
    )
    return Path(out.stdout.strip())


def install_wheel_in_fresh_venv(tmp_path: Path) -> tuple[Path, Path]:
    """Build a pure-Python wheel from a copy of the checkout, install it alone into a new
    venv that reaches this run's dependencies; returns (its python, its site-packages)."""
    # A pure-Python wheel builds in seconds; the compiled one is test_build's business.
    source = copy_source(tmp_path / "src")
    wheel = pip_wheel(source, tmp_path / "dist", env_with(AIOPURGATORY_NO_EXTENSIONS="1"))
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
        env=env_with(PYTHONPATH=None),
    )
    site = _site_packages(python)
    (site / "zz-test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python, site
