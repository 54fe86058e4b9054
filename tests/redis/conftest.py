"""The Redis fan-out (aiopurgatory.redis) against real redis-server processes, one server
or a cluster of six.

Every test in this folder is marked redis (registered in pyproject.toml), so
pytest -m redis runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("redis")
