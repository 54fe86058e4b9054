"""The trace analysis: per purgatory and kind, computed with Spark's DataFrame API.

Raw rows never leave Spark: three aggregations (a summary with approximate
percentiles, a dense time line, a lateness histogram) each return a table whose size
is bounded by groups x bins, and only those reach the driver as pandas frames.

Times are aligned across recordings on the wall clock: each file name carries its
recording's wall-clock base (see :mod:`aiopurgatory.trace`), added to the row's ns.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pandas as pd

from aiopurgatory.analysis.errors import AnalysisError, spark_errors
from aiopurgatory.trace import OUTCOMES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "ACCURACY",
    "CDF_QUANTILES",
    "SUMMARY_QUANTILES",
    "TraceAnalysis",
    "analyze",
    "check_local_traces",
    "nice_width",
    "read_traces",
    "to_pandas",
]

SCHEMA_DDL: Final = (
    "purgatory STRING, kind STRING, num_keys INT, created_ns BIGINT,"
    " deadline_ns BIGINT, finished_ns BIGINT, outcome STRING"
)
ACCURACY: Final = 10_000
"""``percentile_approx`` accuracy: the rank error is at most 1/ACCURACY."""
SUMMARY_QUANTILES: Final = (0.5, 0.9, 0.99, 0.999)
CDF_QUANTILES: Final = tuple(
    sorted({*(i / 100 for i in range(1, 100)), *SUMMARY_QUANTILES, 0.001, 0.005, 0.995, 0.9999})
)
TARGET_BINS: Final = 200
"""About this many time bins over the whole trace."""
LATENESS_BINS: Final = 40
"""Histogram bins between 0 and 1.25 x the largest lateness p99; more is one bin."""
GROUP: Final = ("purgatory", "kind")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TraceAnalysis:
    """The job's tables (small pandas frames) and the facts the report quotes."""

    summary: pd.DataFrame
    """One row per purgatory and kind."""
    timeline: pd.DataFrame
    """Per group and time bin: events counted by type, pending at the bin's end."""
    latency_cdf: pd.DataFrame
    """Per group: completion latency (ms) at each of :data:`CDF_QUANTILES`."""
    lateness: pd.DataFrame
    """Per group: histogram of expiry lateness (ms), with early and overflow bins."""
    sources: tuple[str, ...]
    operations: int
    start_wall_ns: int
    duration_s: float
    bin_seconds: float
    lateness_bin_ms: float


def nice_width(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k that is >= ``value`` (> 0)."""
    exponent = math.floor(math.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        width = step * 10.0**exponent
        if width >= value * (1 - 1e-12):
            return width
    raise AssertionError("unreachable")  # pragma: no cover


def check_local_traces(paths: Sequence[str]) -> None:
    """Fail early, before Spark starts, on local paths that are missing or hold no trace."""
    if not paths:
        raise AnalysisError("no trace directory given")
    for path in paths:
        local = _local_path(path)
        if local is None:
            continue  # a URI: Spark reports it
        if not os.path.exists(local):
            raise AnalysisError(f"trace directory not found: {path}")
        if os.path.isdir(local) and not any(Path(local).rglob("trace-*.parquet")):
            raise AnalysisError(f"no trace files (trace-*.parquet) under {path}")


def read_traces(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The trace rows under ``paths`` (directories or files, local or any Hadoop URI).

    Adds ``created``, ``deadline`` and ``finished``: wall-clock ns.
    """
    from pyspark.sql import functions as F

    check_local_traces(paths)
    try:
        raw = (
            spark.read.schema(SCHEMA_DDL)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "trace-*.parquet")
            .parquet(*paths)
        )
    except spark_errors() as exc:
        raise AnalysisError(f"cannot read traces {', '.join(paths)}: {one_line(exc)}") from exc
    # The wall base is the 19 digits after "trace-" (see FILE_PATTERN); a file renamed
    # otherwise gets 0, so its times stay relative to its recording's start.
    digits = F.substring(F.col("_metadata.file_name"), len("trace-") + 1, 19)
    base = F.coalesce(digits.try_cast("long"), F.lit(0)).alias("base")
    return raw.select(
        *GROUP, "num_keys", "outcome", "created_ns", "deadline_ns", "finished_ns", base
    ).select(
        *GROUP,
        "num_keys",
        "outcome",
        (F.col("base") + F.col("created_ns")).alias("created"),
        (F.col("base") + F.col("deadline_ns")).alias("deadline"),
        (F.col("base") + F.col("finished_ns")).alias("finished"),
    )


def analyze(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    bin_seconds: float | None = None,
    progress: Progress | None = None,
) -> TraceAnalysis:
    """Run the job over the traces under ``paths``."""
    step = progress or (lambda _: None)
    step("reading traces")
    traces = read_traces(spark, paths)
    try:
        step("summary and latency percentiles")
        summary = _summary(traces)
        start = int(summary["first_ns"].min())
        end = int(summary["last_ns"].max())
        duration = (end - start) / 1e9
        width = bin_seconds or nice_width(max(duration, 1e-3) / TARGET_BINS)
        step("time line")
        timeline = _timeline(spark, traces, summary, start, end, width)
        step("lateness histogram")
        upper = float(summary["lateness_p99_ms"].max(skipna=True))
        lateness_width = nice_width(upper * 1.25 / LATENESS_BINS) if upper > 0 else 0.1
        lateness = _lateness(traces, lateness_width)
    except spark_errors() as exc:
        raise AnalysisError(f"cannot analyse traces: {one_line(exc)}") from exc
    return TraceAnalysis(
        summary=summary.drop(columns=["latency_q"]),
        timeline=timeline,
        latency_cdf=_cdf(summary),
        lateness=lateness,
        sources=tuple(paths),
        operations=int(summary["operations"].sum()),
        start_wall_ns=start,
        duration_s=duration,
        bin_seconds=width,
        lateness_bin_ms=lateness_width,
    )


def to_pandas(frame: DataFrame) -> pd.DataFrame:
    """Collect a (small, aggregated) DataFrame.

    PySpark also reports a failed Arrow collection as a warning carrying the whole
    Java stack trace; the exception that follows says the same in one line.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="toPandas attempted Arrow", category=UserWarning)
        collected: pd.DataFrame = frame.toPandas()
    collected.attrs.clear()  # Spark Connect leaves query metrics there, which Parquet rejects
    return collected


def one_line(exc: BaseException) -> str:
    """An error's message in one line: the innermost ``...Error: ...`` line if any.

    Errors from Python workers carry a whole traceback; its last line says what failed.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return re.sub(r"\s+", " ", causes[-1] if causes else lines[0])[:300]


def _local_path(path: str) -> str | None:
    if path.startswith("file:"):
        return re.sub(r"^file:(//)?", "", path)
    return None if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) else path


def _outcome_is(outcome: str) -> Column:
    from pyspark.sql import functions as F

    return F.col("outcome") == F.lit(outcome)


def _count_if(condition: Column) -> Column:
    from pyspark.sql import functions as F

    return F.sum(F.when(condition, F.lit(1)).otherwise(F.lit(0))).cast("long")


def _summary(traces: DataFrame) -> pd.DataFrame:
    from pyspark.sql import functions as F

    latency = (F.col("finished") - F.col("created")) / F.lit(1e6)
    lateness = F.when(_outcome_is("expired"), (F.col("finished") - F.col("deadline")) / F.lit(1e6))
    malformed = (
        F.col("outcome").isNull()
        | ~F.col("outcome").isin(*OUTCOMES)
        | F.col("created").isNull()
        | F.col("finished").isNull()
        | (_outcome_is("expired") & F.col("deadline").isNull())
    )
    summary = (
        traces.groupBy(*GROUP)
        .agg(
            F.count(F.lit(1)).alias("operations"),
            *(_count_if(_outcome_is(o)).alias(o) for o in OUTCOMES),
            _count_if(malformed).alias("malformed"),
            F.avg("num_keys").alias("mean_keys"),
            F.min("created").alias("first_ns"),
            F.max("finished").alias("last_ns"),
            F.percentile_approx(
                F.when(_outcome_is("completed"), latency), list(CDF_QUANTILES), ACCURACY
            ).alias("latency_q"),
            F.percentile_approx(lateness, [0.5, 0.99], ACCURACY).alias("lateness_q"),
            F.max(lateness).alias("lateness_max_ms"),
            _count_if(lateness < F.lit(0)).alias("early_expiries"),
        )
        .orderBy(*GROUP)
    )
    frame = to_pandas(summary)
    if frame.empty:
        raise AnalysisError(
            "no trace rows found (expected trace-*.parquet files written by aiopurgatory.trace)"
        )
    bad = int(frame["malformed"].sum())
    if bad:
        raise AnalysisError(
            f"malformed traces: {bad} rows lack a time or have an unknown outcome"
            f" (outcomes are {', '.join(OUTCOMES)})"
        )
    span = (frame["last_ns"] - frame["first_ns"]).clip(lower=1) / 1e9
    frame["throughput_per_s"] = frame["operations"] / span
    frame["timeout_rate"] = frame["expired"] / frame["operations"]
    index = {q: i for i, q in enumerate(CDF_QUANTILES)}
    for q in SUMMARY_QUANTILES:
        frame[f"latency_{_label(q)}_ms"] = [
            None if qs is None else float(qs[index[q]]) for qs in frame["latency_q"]
        ]
    frame["lateness_p50_ms"] = [None if qs is None else float(qs[0]) for qs in frame["lateness_q"]]
    frame["lateness_p99_ms"] = [None if qs is None else float(qs[1]) for qs in frame["lateness_q"]]
    frame["lateness_max_ms"] = frame["lateness_max_ms"].astype("float64")
    frame["lateness_p50_ms"] = frame["lateness_p50_ms"].astype("float64")
    frame["lateness_p99_ms"] = frame["lateness_p99_ms"].astype("float64")
    return frame.drop(columns=["lateness_q", "malformed"])


def _label(q: float) -> str:
    """0.5 -> 'p50', 0.999 -> 'p99.9'."""
    return "p" + f"{q * 100:.4f}".rstrip("0").rstrip(".")


def _cdf(summary: pd.DataFrame) -> pd.DataFrame:
    rows = [
        (purgatory, kind, q, float(value))
        for purgatory, kind, qs in summary[[*GROUP, "latency_q"]].itertuples(index=False)
        if qs is not None
        for q, value in zip(CDF_QUANTILES, qs, strict=True)
    ]
    return pd.DataFrame(rows, columns=[*GROUP, "quantile", "latency_ms"])


def _timeline(
    spark: SparkSession,
    traces: DataFrame,
    summary: pd.DataFrame,
    start: int,
    end: int,
    width: float,
) -> pd.DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    width_ns = max(1, round(width * 1e9))
    bins = (end - start) // width_ns + 1

    def bin_of(column: str) -> Column:
        return F.floor((F.col(column) - F.lit(start)) / F.lit(width_ns)).alias("bin")

    events = traces.select(*GROUP, bin_of("created"), F.lit("created").alias("event")).unionByName(
        traces.select(*GROUP, bin_of("finished"), F.col("outcome").alias("event"))
    )
    kinds = ["created", *OUTCOMES]
    pivot_values: list[bool | float | int | str] = [*kinds]
    counts = events.groupBy(*GROUP, "bin").pivot("event", pivot_values).count()
    groups = spark.createDataFrame(summary[list(GROUP)].astype(str))
    grid = groups.crossJoin(spark.range(bins).withColumnRenamed("id", "bin"))
    finished = sum((F.col(o) for o in OUTCOMES[1:]), F.col(OUTCOMES[0]))
    running = Window.partitionBy(*GROUP).orderBy("bin").rowsBetween(Window.unboundedPreceding, 0)
    dense = (
        grid.join(counts, [*GROUP, "bin"], "left")
        .fillna(0, subset=kinds)
        .withColumn("finished", finished)
        .withColumn("pending", F.sum(F.col("created") - F.col("finished")).over(running))
        .withColumn("t_s", F.col("bin") * F.lit(width))
        .orderBy(*GROUP, "bin")
    )
    frame = to_pandas(dense)
    for column in (*kinds, "finished", "pending"):
        frame[column] = frame[column].astype("int64")
    frame["throughput_per_s"] = frame["finished"] / width
    frame["expired_per_s"] = frame["expired"] / width
    return frame


def _lateness(traces: DataFrame, width_ms: float) -> pd.DataFrame:
    from pyspark.sql import functions as F

    lateness = (F.col("finished") - F.col("deadline")) / F.lit(1e6)
    index = F.greatest(F.lit(-1), F.least(F.lit(LATENESS_BINS), F.floor(lateness / width_ms)))
    histogram = (
        traces.where(_outcome_is("expired"))
        .groupBy(*GROUP, index.alias("bin"))
        .count()
        .orderBy(*GROUP, "bin")
    )
    frame = to_pandas(histogram)
    frame["count"] = frame["count"].astype("int64")
    # Bin -1 holds early expiries (< 0 ms); bin LATENESS_BINS everything above the range.
    frame["low_ms"] = [-math.inf if b < 0 else b * width_ms for b in frame["bin"]]
    frame["high_ms"] = [
        0.0 if b < 0 else math.inf if b >= LATENESS_BINS else (b + 1) * width_ms
        for b in frame["bin"]
    ]
    return frame
