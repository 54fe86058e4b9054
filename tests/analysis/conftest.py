"""The Spark analysis job (aiopurgatory.analysis), its command line, Spark's class cache and
the standalone cluster; most tests also carry the spark marker.

Every test in this folder is marked analysis (registered in pyproject.toml), so
pytest -m analysis runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("analysis")
