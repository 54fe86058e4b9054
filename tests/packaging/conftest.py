"""What users install: the wheels built (compiled and pure) and installed in fresh virtual
environments, the demo and the Kafka fixtures from them.

Every test in this folder is marked packaging (registered in pyproject.toml), so
pytest -m packaging runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("packaging")
