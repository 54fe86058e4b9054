"""The trace analysis on Spark (extra ``analysis``): tables, plots and a report.

Entry points: :func:`build_report` (what ``aiopurgatory report`` runs),
:func:`analyze` for the tables alone, :func:`spark_session` for the session the
command line uses, and :func:`run_sweep` for the tick x wheel-size sweep.

Importing this package imports neither pandas nor Spark: the names below load their
modules on first use (PEP 562), so that the command line, which parses the report's
arguments with :mod:`aiopurgatory.analysis.command`, starts (``--help``, ``kafka``)
without the extra. ``from aiopurgatory.analysis import analyze`` loads what it did
before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from aiopurgatory._extra import raise_missing_extra

if TYPE_CHECKING:
    from aiopurgatory.analysis.errors import AnalysisError
    from aiopurgatory.analysis.job import TraceAnalysis, analyze, read_traces
    from aiopurgatory.analysis.report import ReportInputs, build_report, write_report
    from aiopurgatory.analysis.session import spark_session
    from aiopurgatory.analysis.sweep import run_sweep, simulate

__all__ = [
    "AnalysisError",
    "ReportInputs",
    "TraceAnalysis",
    "analyze",
    "build_report",
    "read_traces",
    "run_sweep",
    "simulate",
    "spark_session",
    "write_report",
]

_LAZY: Final = {
    "AnalysisError": "errors",
    "ReportInputs": "report",
    "TraceAnalysis": "job",
    "analyze": "job",
    "build_report": "report",
    "read_traces": "job",
    "run_sweep": "sweep",
    "simulate": "sweep",
    "spark_session": "session",
    "write_report": "report",
}
"""The public names, and the module of this package each comes from."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # Also how `from aiopurgatory.analysis import plots` falls through to the submodule.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ImportError as exc:  # without the extra: say which to install
        raise_missing_extra(exc, "analysis", "aiopurgatory.analysis")
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
