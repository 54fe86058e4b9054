"""The CPython interpreters the project supports that are installed on this machine.

Tests that hold the project to CPython's own suites run them on each (every version's
``test.test_asyncio`` is its own: asyncio's semantics change between versions). Used by
tests/loop/test_loop.py and tests/core/test_timeouts.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path


def _supported_minors() -> tuple[int, ...]:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    prefix = "Programming Language :: Python :: 3."
    return tuple(
        int(c.removeprefix(prefix))
        for c in pyproject["project"]["classifiers"]
        if c.startswith(prefix) and c.removeprefix(prefix).isdigit()
    )


SUPPORTED_MINORS = _supported_minors()
"""CPython 3.x versions the project supports: pyproject's classifiers say which."""


def interpreters() -> list[str]:
    """This interpreter, then each other CPython the project supports that is installed
    (on PATH, or under pyenv's versions), as paths: each runs its own test.test_asyncio.

    With ``AIOPURGATORY_ONLY_THIS_PYTHON`` set (non-empty), this interpreter only: ``make
    test`` sets it in the runs on the pure-Python build and on the other versions, as
    the compiled default run covers every interpreter already; and in that run too
    when the other versions' own runs are made (``PYTHONS``), which cover theirs.
    """
    found = {version_of(sys.version_info[:2]): sys.executable}
    if os.environ.get("AIOPURGATORY_ONLY_THIS_PYTHON"):
        return list(found.values())
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    for minor in SUPPORTED_MINORS:
        version = f"3.{minor}"
        if version in found:
            continue
        candidates = [shutil.which(f"python{version}") or ""]
        candidates += sorted(
            str(p)
            for root in roots
            if root
            for p in Path(root, "versions").glob(f"{version}.*/bin/python{version}")
        )
        for candidate in candidates:
            if candidate and runs(candidate):
                found[version] = candidate
                break
    return list(found.values())


def version_of(info: tuple[int, ...]) -> str:
    """``3.12`` for ``sys.version_info`` (3, 12, ...)."""
    return f"{info[0]}.{info[1]}"


def ids(pythons: list[str]) -> list[str]:
    """Test ids for :func:`interpreters`' list: ``this`` for the running one, else the
    file name (``python3.12``)."""
    return [Path(p).name if i else "this" for i, p in enumerate(pythons)]


def runs(python: str) -> bool:
    """Whether ``python`` starts (a pyenv shim of a version not selected does not)."""
    try:
        return (
            subprocess.run(
                [python, "-c", "import asyncio"], capture_output=True, timeout=60
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
