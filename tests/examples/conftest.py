"""The programs in examples/, run as a user runs them (servers in subprocesses, real
clients over loopback).

Every test in this folder is marked examples (registered in pyproject.toml), so
pytest -m examples runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("examples")
