"""Stands in for Cython's ``cython`` module when Cython is not installed (pure Python)."""

from collections.abc import Callable
from typing import TypeVar

_C = TypeVar("_C")

compiled = False


def freelist(size: int) -> Callable[[_C], _C]:
    """Cython's class decorator (a free list of ``size`` instances): nothing here."""

    def keep(cls: _C) -> _C:
        return cls

    return keep


def cclass(cls: _C) -> _C:
    """Cython's extension-type decorator: nothing here."""
    return cls


def cast(kind: object, value: _C) -> _C:
    """Cython's unchecked cast: the value itself here."""
    return value
