"""The trace analysis on Spark (extra ``analysis``): tables, plots and a report.

Entry points: :func:`build_report` (what ``aiopurgatory report`` runs),
:func:`analyze` for the tables alone, :func:`spark_session` for the session the
command line uses, and :func:`run_sweep` for the tick x wheel-size sweep.
"""

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
