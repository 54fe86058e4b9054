"""The documentation: the site built strict and its code blocks run, the README's blocks,
and the structure page against the modules' imports.

Every test in this folder is marked docs (registered in pyproject.toml), so
pytest -m docs runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("docs")
