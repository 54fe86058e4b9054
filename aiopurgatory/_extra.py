"""What to say when an extra is missing: one sentence for every extra, from one place.

Ground rules: imports nothing (every package may import it before its extra's
dependencies); a package whose import needs an extra catches ImportError and hands it
to :func:`raise_missing_extra`, which raises the hint for that extra's modules only;
any other ImportError (a bug, a broken install) goes on unchanged.
"""

from __future__ import annotations

from typing import Final, NoReturn

__all__ = ["EXTRAS", "extra_hint", "missing_extra", "raise_missing_extra"]

EXTRAS: Final = {
    "kafka": ("kio", "crc32c"),
    "redis": ("redis",),
    "metrics": ("prometheus_client",),
    "trace": ("pyarrow",),
    "analysis": ("pyspark", "pyarrow", "pandas", "numpy", "matplotlib", "tqdm"),
}
"""Each extra a package of the library needs, and the top-level modules it brings
(pyproject.toml's optional-dependencies; the others, uvloop, asgi, examples, ...,
bring nothing the library itself imports)."""


def extra_hint(extra: str, what: str, needs: str | None = None) -> str:
    """``"<what> needs the '<extra>' extra (<needs>): pip install 'aiopurgatory[<extra>]'"``."""
    needs = needs or ", ".join(EXTRAS[extra])
    return f"{what} needs the {extra!r} extra ({needs}): pip install 'aiopurgatory[{extra}]'"


def missing_extra(exc: ImportError, extra: str, what: str) -> ImportError | None:
    """The error to raise from ``exc`` (its hint, its module name), or None if ``exc``
    is not about one of ``extra``'s modules (then re-raise ``exc`` itself)."""
    root = (exc.name or "").split(".")[0]
    if root not in EXTRAS[extra]:
        return None
    error = ModuleNotFoundError(extra_hint(extra, what, root))
    error.name = exc.name
    return error


def raise_missing_extra(exc: ImportError, extra: str, what: str) -> NoReturn:
    """Raise, from inside ``except ImportError as exc``, the hint for ``extra`` if
    ``exc`` is about one of its modules, else ``exc`` itself unchanged."""
    error = missing_extra(exc, extra, what)
    if error is None:
        raise exc
    raise error from exc
