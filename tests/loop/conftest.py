"""The wheel-backed event loop: asyncio's own suites on it, uvloop beside it, and the
ASGI and HTTP servers run on it.

Every test in this folder is marked loop (registered in pyproject.toml), so
pytest -m loop runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("loop")
