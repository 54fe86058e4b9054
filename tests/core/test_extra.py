"""aiopurgatory._extra: the hint for a missing extra, and nothing else turned into one."""

from __future__ import annotations

import pytest

from aiopurgatory._extra import raise_missing_extra


def _handled(cause: ImportError) -> None:
    """What a package does around an import that needs the 'redis' extra."""
    try:
        raise cause
    except ImportError as exc:
        raise_missing_extra(exc, "redis", "aiopurgatory.redis")


def _import_error(name: str) -> ImportError:
    error = ModuleNotFoundError(f"No module named {name!r}")
    error.name = name
    return error


def test_an_extras_module_missing_raises_the_hint_from_the_import_error() -> None:
    cause = _import_error("redis.asyncio")
    with pytest.raises(ModuleNotFoundError) as raised:
        _handled(cause)
    assert str(raised.value) == (
        "aiopurgatory.redis needs the 'redis' extra (redis): pip install 'aiopurgatory[redis]'"
    )
    assert raised.value.name == "redis.asyncio"
    assert raised.value.__cause__ is cause


def test_any_other_import_error_goes_on_unchanged() -> None:
    # A bug or a broken install must not be dressed up as "install the extra".
    for cause in (_import_error("aiopurgatory.redis.nowhere"), ImportError("cannot import name")):
        with pytest.raises(ImportError) as raised:
            _handled(cause)
        assert raised.value is cause
