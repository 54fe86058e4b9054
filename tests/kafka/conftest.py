"""The Kafka-protocol broker (aiopurgatory.kafka) and its fixtures: the log core, groups,
transactions, replicas and clusters, faults, security, the real clients, hostile peers.

Every test in this folder is marked kafka (registered in pyproject.toml), so
pytest -m kafka runs them wherever they are named from.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    # pytest calls this hook through the item's own conftest chain: only this folder's.
    item.add_marker("kafka")
