"""Kafka's request purgatory for asyncio.

Delayed operations wait until their condition holds or their timeout passes; a
hierarchical timing wheel times them (O(1) insert and cancel, one wake-up armed at
the earliest non-empty bucket) and watchers re-check them when a key they watch sees
an event.

The hot path (wheel, timer, looptimers, operation, ops, purgatory, timeouts) is compiled with
Cython when the package was built with a C compiler; :data:`COMPILED` tells which
build is loaded, and ``AIOPURGATORY_NO_EXTENSIONS=1`` at import time forces the
pure-Python modules.
"""

import os as _os

from . import _build

if _build.NO_EXTENSIONS:  # before any hot-path module is imported
    _build.use_pure_python(__name__, _os.path.dirname(__file__))

# The wheel loop's per-timer module is part of the hot path: loaded here so that
# COMPILED speaks for it too (aiopurgatory.loop itself is imported on demand).
from . import looptimers as _looptimers  # noqa: F401
from .errors import PurgatoryClosed, PurgatoryError, PurgatoryFull
from .operation import DelayedOperation, Outcome
from .ops import DelayedFuture, PredicateOperation
from .purgatory import OperationObserver, Purgatory, PurgatoryStats
from .testing import ManualClock

COMPILED: bool = _build.is_compiled(__name__)
"""True when the hot-path modules loaded are the compiled (Cython) extension modules."""

__all__ = [
    "COMPILED",
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
