"""Which build of the hot path is loaded: the C extensions or the pure-Python modules.

The hot-path modules (:data:`HOT_PATH`) are compiled with Cython from their own
``.py`` source when the package is installed with a C compiler at hand (see
``setup.py``); each extension module sits beside its ``.py`` file and is found first.
Setting ``AIOPURGATORY_NO_EXTENSIONS`` (to any non-empty value) before the package is
imported loads the ``.py`` files instead, as aiohttp, yarl and frozenlist do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Final

__all__ = ["HOT_PATH", "NO_EXTENSIONS", "PurePythonFinder", "is_compiled", "use_pure_python"]

HOT_PATH: Final = ("wheel", "timer", "looptimers", "operation", "ops", "purgatory", "timeouts")
"""The modules that may be compiled (setup.py lists the same ones)."""

NO_EXTENSIONS: Final = bool(os.environ.get("AIOPURGATORY_NO_EXTENSIONS"))
"""Whether the environment asked for the pure-Python modules at import time."""


class PurePythonFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` file of the hot-path modules, ahead of their extension modules."""

    def __init__(self, package: str, directory: str, modules: Sequence[str]) -> None:
        self.files = {
            f"{package}.{name}": os.path.join(directory, f"{name}.py") for name in modules
        }

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        filename = self.files.get(fullname)
        if filename is None or not os.path.isfile(filename):
            return None
        return importlib.util.spec_from_file_location(fullname, filename)


def use_pure_python(package: str, directory: str) -> None:
    """Make the hot-path modules of ``package`` load from their ``.py`` files."""
    for finder in sys.meta_path:
        if isinstance(finder, PurePythonFinder) and f"{package}.wheel" in finder.files:
            return
    sys.meta_path.insert(0, PurePythonFinder(package, directory, HOT_PATH))


def is_compiled(package: str) -> bool:
    """Whether every hot-path module of ``package`` loaded is an extension module."""
    for name in HOT_PATH:
        module = sys.modules.get(f"{package}.{name}")
        spec = getattr(module, "__spec__", None)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return False
    return True
