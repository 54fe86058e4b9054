"""The benchmark harness (bench/): its smoke runs, pacing, the ceiling search and the Redis
fan-out benchmark.

Every test in this folder is marked bench (registered in pyproject.toml), so
pytest -m bench runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("bench")
