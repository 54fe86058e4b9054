"""The core: the purgatory and its operations, the timer, wheel and timeouts, metrics,
traces, the ASGI lifespan and the pytest plugin; nothing here starts a server.

Every test in this folder is marked ``core`` (registered in pyproject.toml), so
``pytest -m core`` runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("core")
