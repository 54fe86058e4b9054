"""Kafka's request purgatory for asyncio.

Delayed operations wait until their condition holds or their timeout passes; a
hierarchical timing wheel times them (O(1) insert and cancel, one wake-up armed at
the earliest non-empty bucket) and watchers re-check them when a key they watch sees
an event.
"""

from .errors import PurgatoryClosed, PurgatoryError, PurgatoryFull
from .operation import DelayedOperation, Outcome
from .ops import DelayedFuture, PredicateOperation
from .purgatory import OperationObserver, Purgatory, PurgatoryStats
from .testing import ManualClock

__all__ = [
    "DelayedFuture",
    "DelayedOperation",
    "ManualClock",
    "OperationObserver",
    "Outcome",
    "PredicateOperation",
    "Purgatory",
    "PurgatoryClosed",
    "PurgatoryError",
    "PurgatoryFull",
    "PurgatoryStats",
]

__version__ = "0.1.0"
