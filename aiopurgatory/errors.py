"""Exceptions raised by aiopurgatory."""

from __future__ import annotations

__all__ = ["PurgatoryClosed", "PurgatoryError", "PurgatoryFull"]


class PurgatoryError(Exception):
    """Base class of every error this package raises on its own account."""


class PurgatoryClosed(PurgatoryError, RuntimeError):
    """The purgatory was closed.

    Raised when a closed purgatory is used, and by ``await op`` / ``op.result()`` for an
    operation that was still pending when its purgatory closed.
    """


class PurgatoryFull(PurgatoryError):
    """Adding the operation would exceed the purgatory's ``max_pending``."""
