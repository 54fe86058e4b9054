"""Build script for the compiled hot path (all metadata lives in pyproject.toml).

The hot-path modules (``HOT_PATH`` below) are compiled with Cython in pure-Python
mode: the ``.py`` file is the source and the ``.pxd`` beside it declares the C types.
Compiling is optional, as in aiohttp, yarl and frozenlist:

* ``AIOPURGATORY_NO_EXTENSIONS`` set (non-empty) at build time: nothing is compiled.
* Cython missing, no C compiler or no Python headers: a warning is printed and the
  package is built as pure Python (the same ``.py`` modules).

After editing a compiled module in a checkout, rebuild in place with ``make build``
(``python setup.py build_ext --inplace``); ``AIOPURGATORY_NO_EXTENSIONS=1`` at import
time loads the ``.py`` modules instead of the extensions.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HOT_PATH = ("wheel", "timer", "looptimers", "operation", "ops", "purgatory", "timeouts")
"""Modules of the package compiled to extension modules."""

NO_EXTENSIONS = bool(os.environ.get("AIOPURGATORY_NO_EXTENSIONS"))

COMPILER_DIRECTIVES: dict[str, Any] = {
    "language_level": 3,
    # Keep Python's semantics where they differ from C's.
    "cdivision": False,  # // and % round towards minus infinity, ZeroDivisionError
    "wraparound": True,
    "boundscheck": True,
    # The .pxd files give the C types; annotations stay documentation for mypy (an
    # `x: float` must keep accepting an int).
    "annotation_typing": False,
    # Attribute access on a typed None raises AttributeError, as in Python.
    "nonecheck": True,
    "embedsignature": True,
}


def _warn(message: str) -> None:
    bar = "*" * 75
    print(f"{bar}\nWARNING: {message}\n{bar}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """Cythonize and compile the hot path; on any failure, fall back to pure Python."""

    def run(self) -> None:
        if not self.extensions:
            return
        inplace = self.inplace
        try:
            from Cython.Build import cythonize

            generated = cythonize(
                self.extensions,
                compiler_directives=COMPILER_DIRECTIVES,
                build_dir=os.path.join(self.build_temp, "cython"),
                quiet=True,
            )
            # The extensions setuptools prepared, now built from the generated C.
            sources = {ext.name: ext.sources for ext in generated}
            for ext in self.extensions:
                ext.sources = sources[ext.name]
            super().run()
        except Exception as exc:  # no Cython, no compiler, no headers, a bad source
            self.inplace = inplace  # setuptools clears it while it builds
            self._remove_outputs()
            _warn(
                f"aiopurgatory: the C extensions could not be built ({type(exc).__name__}:"
                f" {exc}); the pure-Python modules are used instead."
            )

    def _remove_outputs(self) -> None:
        """A failed build leaves no extension that would shadow the new .py files."""
        for ext in self.extensions:
            for inplace in (False, True):
                self.inplace = inplace
                path = Path(self.get_ext_fullpath(ext.name))
                if path.exists():
                    path.unlink()
        self.inplace = False


def _extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        return []
    return [Extension(f"aiopurgatory.{name}", [f"aiopurgatory/{name}.py"]) for name in HOT_PATH]


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
