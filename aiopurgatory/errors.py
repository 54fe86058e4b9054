"""Exceptions raised by aiopurgatory."""

from __future__ import annotations

__all__ = ["PurgatoryClosed", "PurgatoryError", "PurgatoryFull"]


class PurgatoryError(Exception):
    """Base class of every error this package raises on its own account.

    ``except PurgatoryError`` catches :class:`PurgatoryClosed`, :class:`PurgatoryFull`
    and the Redis fan-out's errors (``aiopurgatory.redis.FanoutError``); errors of the
    caller's own making (a bad argument) are ``TypeError`` / ``ValueError``.
    """


class PurgatoryClosed(PurgatoryError, RuntimeError):
    """The purgatory was closed.

    Raised when a closed purgatory is used, and by ``await op`` / ``op.result()`` for an
    operation that was still pending when its purgatory closed. Also a
    ``RuntimeError``, which is what using a closed resource raises elsewhere in asyncio.
    Should the purgatory's timer task fail, the pending operations finish with this
    error, caused by (``__cause__``) what failed.
    """


class PurgatoryFull(PurgatoryError):
    """Adding the operation would exceed the purgatory's ``max_pending``.

    Raised by ``try_complete_else_watch`` before it touches the new operation (it is
    neither checked nor watched), so the caller may answer "busy" and drop it.
    """
