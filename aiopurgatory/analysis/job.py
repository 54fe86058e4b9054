"""The trace analysis: per purgatory and kind, computed with Spark's DataFrame API.

Raw rows never leave Spark, and the trace is read twice, each time into one
aggregation: the *summary* (per group, outcome and log-spaced value bin: counts,
extremes; the percentiles are read from these counts), then the *events* (per group
and time bin: operations created and finished by outcome; per group and lateness bin:
expired operations), whose bins depend on the summary's time span and lateness p99.
Both return tables bounded by groups x bins; the dense time line, the running count of
pending operations and the histogram are then built from them on the driver with pandas.
The job uses the DataFrame API only (no Python UDF), so executors need nothing of
this package.

Times are aligned across recordings on the wall clock: each file name carries its
recording's wall-clock base (see :mod:`aiopurgatory.trace`), added to the row's ns. The
bases are parsed once per file on the driver and enter the plan as constants; only when
there are more than :data:`MAX_RECORDINGS` recordings is the file name parsed per row.
"""

from __future__ import annotations

import functools
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import pandas as pd

from aiopurgatory.analysis.errors import AnalysisError, spark_errors
from aiopurgatory.trace import FIELDS, FILE_PATTERN, OUTCOMES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession

__all__ = [
    "CDF_QUANTILES",
    "GAMMA",
    "RELATIVE_ERROR",
    "SCHEMA_DDL",
    "SUMMARY_QUANTILES",
    "TraceAnalysis",
    "analyze",
    "check_local_traces",
    "label",
    "nice_width",
    "read_traces",
    "to_pandas",
]

_SPARK_TYPES: Final = {"string": "STRING", "int32": "INT", "int64": "BIGINT"}
SCHEMA_DDL: Final = ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind, _ in FIELDS)
"""The trace's read schema, derived from :data:`aiopurgatory.trace.FIELDS`."""
MAX_RECORDINGS: Final = 64
"""Up to this many recordings (wall bases), each is read as its own scan with its base
as a constant; beyond, the base is parsed from each row's file name."""
RELATIVE_ERROR: Final = 0.001
"""Percentiles have exact ranks and values within this fraction of the true value: the
values are counted in log-spaced bins, each at most ``GAMMA`` times as wide as it is
far from 0 (the construction of DDSketch, Masson et al., VLDB 2019)."""
GAMMA: Final = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
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

    def reader() -> DataFrameReader:
        return spark.read.schema(SCHEMA_DDL)

    try:
        raw = (
            reader()
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "trace-*.parquet")
            .parquet(*paths)
        )
        files = raw.inputFiles()
    except spark_errors() as exc:
        raise AnalysisError(f"cannot read traces {', '.join(paths)}: {one_line(exc)}") from exc
    recordings: dict[int, list[str]] = {}
    for file in files:
        # The wall base is the 19 digits after "trace-" (see FILE_PATTERN); a file renamed
        # otherwise gets 0, so its times stay relative to its recording's start.
        match = re.match(FILE_PATTERN, file.rsplit("/", 1)[-1])
        recordings.setdefault(int(match.group(1)) if match else 0, []).append(file)
    if files and len(recordings) <= MAX_RECORDINGS:
        scans = [
            reader().parquet(*map(_literal_path, group)).withColumn("base", F.lit(base))
            for base, group in sorted(recordings.items())
        ]
        with_base = functools.reduce(lambda left, right: left.unionByName(right), scans)
    else:
        digits = F.substring(F.col("_metadata.file_name"), len("trace-") + 1, 19)
        with_base = raw.withColumn("base", F.coalesce(digits.try_cast("long"), F.lit(0)))
    return with_base.select(
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
        upper = float(summary["lateness_p99_ms"].max(skipna=True))
        lateness_width = nice_width(upper * 1.25 / LATENESS_BINS) if upper > 0 else 0.1
        step("time line and lateness histogram")
        events = _events(traces, start, width, lateness_width)
    except spark_errors() as exc:
        raise AnalysisError(f"cannot analyse traces: {one_line(exc)}") from exc
    return TraceAnalysis(
        summary=summary.drop(columns=["latency_q"]),
        timeline=_timeline(events, summary, start, end, width),
        latency_cdf=_cdf(summary),
        lateness=_lateness(events, lateness_width),
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


def _literal_path(path: str) -> str:
    """A file path as Spark's reader takes it literally (glob characters escaped)."""
    return re.sub(r"([\\*?\[\]{}])", r"\\\1", path)


def _outcome_is(outcome: str) -> Column:
    from pyspark.sql import functions as F

    return F.col("outcome") == F.lit(outcome)


def _log_bin(value: Column) -> Column:
    """The signed log-spaced bin of an integer ns ``value``: 0 for 0, ``k`` for
    ``GAMMA**(k-1) <= value < GAMMA**k``, ``-k`` for the negative mirror image, null for null."""
    from pyspark.sql import functions as F

    magnitude = F.floor(F.log(F.abs(value).cast("double")) / F.lit(math.log(GAMMA))) + F.lit(1)
    return F.when(value > 0, magnitude).when(value < 0, -magnitude).when(value == 0, F.lit(0))


def _summary(traces: DataFrame) -> pd.DataFrame:
    """One row per group, from one aggregation into per-(group, outcome, value bin) counts.

    The value is the latency of a completed operation and the lateness of an expired
    one, in integer ns (no division per row). Percentiles are read from the binned
    counts on the driver (:func:`_quantiles`): a hash aggregation that Spark's code
    generation compiles, where ``percentile_approx`` kept a sorted sketch per group and
    cost most of the job (see the README's performance notes on the report).
    """
    from pyspark.sql import functions as F

    latency = F.col("finished") - F.col("created")
    lateness = F.col("finished") - F.col("deadline")
    value = F.when(_outcome_is("completed"), latency).when(_outcome_is("expired"), lateness)
    malformed = (
        F.col("outcome").isNull()
        | ~F.col("outcome").isin(*OUTCOMES)
        | F.col("created").isNull()
        | F.col("finished").isNull()
        | (_outcome_is("expired") & F.col("deadline").isNull())
    )
    binned = traces.groupBy(*GROUP, "outcome", _log_bin(value).alias("bin")).agg(
        F.count(F.lit(1)).alias("n"),
        F.count_if(malformed).alias("malformed"),
        F.sum("num_keys").alias("keys"),
        F.count("num_keys").alias("with_keys"),
        F.min("created").alias("first_ns"),
        F.max("finished").alias("last_ns"),
        F.min(value).alias("low"),
        F.max(value).alias("high"),
    )
    bins = to_pandas(binned)
    if bins.empty:
        raise AnalysisError(
            "no trace rows found (expected trace-*.parquet files written by aiopurgatory.trace)"
        )
    bad = int(bins["malformed"].sum())
    if bad:
        raise AnalysisError(
            f"malformed traces: {bad} rows lack a time or have an unknown outcome"
            f" (outcomes are {', '.join(OUTCOMES)})"
        )
    rows = []
    for (purgatory, kind), group in bins.groupby(list(GROUP), sort=True):
        by_outcome = group.groupby("outcome")["n"].sum()
        completed = group[group["outcome"] == "completed"]
        expired = group[group["outcome"] == "expired"]
        latency_q = _quantiles(completed, CDF_QUANTILES)
        lateness_q = _quantiles(expired, (0.5, 0.99))
        rows.append(
            {
                "purgatory": purgatory,
                "kind": kind,
                "operations": int(group["n"].sum()),
                **{o: int(by_outcome.get(o, 0)) for o in OUTCOMES},
                "mean_keys": float(group["keys"].sum()) / max(1, int(group["with_keys"].sum())),
                "first_ns": int(group["first_ns"].min()),
                "last_ns": int(group["last_ns"].max()),
                "latency_q": None if latency_q is None else [v / 1e6 for v in latency_q],
                "lateness_q": lateness_q,
                "lateness_max_ms": float(expired["high"].max()) / 1e6 if len(expired) else math.nan,
                "early_expiries": int(expired.loc[expired["bin"] < 0, "n"].sum()),
            }
        )
    frame = pd.DataFrame(rows)
    span = (frame["last_ns"] - frame["first_ns"]).clip(lower=1) / 1e9
    frame["throughput_per_s"] = frame["operations"] / span
    frame["timeout_rate"] = frame["expired"] / frame["operations"]
    index = {q: i for i, q in enumerate(CDF_QUANTILES)}
    for q in SUMMARY_QUANTILES:
        frame[f"latency_{label(q)}_ms"] = pd.Series(
            [None if qs is None else qs[index[q]] for qs in frame["latency_q"]], dtype="float64"
        )
    for i, q in enumerate((0.5, 0.99)):
        frame[f"lateness_{label(q)}_ms"] = pd.Series(
            [None if qs is None else qs[i] / 1e6 for qs in frame["lateness_q"]], dtype="float64"
        )
    frame["lateness_max_ms"] = frame.pop("lateness_max_ms")
    return frame.drop(columns=["lateness_q"])


def _quantiles(bins: pd.DataFrame, quantiles: Sequence[float]) -> list[float] | None:
    """The ``quantiles`` of the values counted in ``bins`` (one group's rows of one
    outcome: ``bin``, ``n``, ``low``, ``high``), or None if there are none.

    The q-quantile is the value of rank ``ceil(q * n)`` (the smallest value with at
    least a fraction q of the values at or below it, as ``percentile_approx`` defines
    it). The rank is exact; the value is the bin's centre (in ratio), clamped to the
    smallest and largest value seen in the bin, and exact when the rank is the bin's
    first or last: within :data:`RELATIVE_ERROR` of the true value.
    """
    counted = bins[bins["bin"].notna()].sort_values("bin")
    if counted.empty:
        return None
    counts = counted["n"].to_numpy(dtype="int64")
    ends = counts.cumsum()
    total = int(ends[-1])
    numbers = counted["bin"].to_numpy(dtype="int64")
    lows = counted["low"].to_numpy(dtype="int64")
    highs = counted["high"].to_numpy(dtype="int64")
    values = []
    for q in quantiles:
        # round(): 0.07 * 100 is 7.000000000000001 in floating point, its rank is 7.
        rank = min(total, max(1, math.ceil(round(q * total, 6))))
        i = int(np.searchsorted(ends, rank))
        if rank == ends[i] - counts[i] + 1:
            values.append(float(lows[i]))
        elif rank == ends[i]:
            values.append(float(highs[i]))
        else:
            k = int(numbers[i])
            centre = math.copysign(2 * GAMMA ** abs(k) / (1 + GAMMA), k) if k else 0.0
            values.append(min(max(centre, float(lows[i])), float(highs[i])))
    return values


def label(q: float) -> str:
    """A quantile's column label: 0.5 -> 'p50', 0.99 -> 'p99', 0.999 -> 'p999'."""
    return "p" + f"{q * 100:.4f}".rstrip("0").rstrip(".").replace(".", "")


def _cdf(summary: pd.DataFrame) -> pd.DataFrame:
    rows = [
        (purgatory, kind, q, float(value))
        for purgatory, kind, qs in summary[[*GROUP, "latency_q"]].itertuples(index=False)
        if qs is not None
        for q, value in zip(CDF_QUANTILES, qs, strict=True)
    ]
    return pd.DataFrame(rows, columns=[*GROUP, "quantile", "latency_ms"])


def _events(traces: DataFrame, start: int, width: float, lateness_width_ms: float) -> pd.DataFrame:
    """Counts per group: ``created`` and each outcome per time bin, ``late`` per lateness bin.

    One pass over the trace: a single aggregation by (group, created bin, finished bin,
    outcome, lateness bin), checkpointed (it is small) so that the three re-aggregations
    below read it rather than the trace.
    """
    from pyspark.sql import functions as F

    width_ns = max(1, round(width * 1e9))
    lateness_ns = max(1, round(lateness_width_ms * 1e6))

    def bin_of(column: str) -> Column:
        return F.floor((F.col(column) - F.lit(start)) / F.lit(width_ns))

    late_bin = F.when(
        _outcome_is("expired"),
        F.greatest(
            F.lit(-1),
            F.least(
                F.lit(LATENESS_BINS), F.floor((F.col("finished") - F.col("deadline")) / lateness_ns)
            ),
        ),
    )
    pairs = traces.groupBy(
        *GROUP,
        bin_of("created").alias("created_bin"),
        bin_of("finished").alias("finished_bin"),
        "outcome",
        late_bin.alias("late_bin"),
    ).agg(F.count(F.lit(1)).alias("n"))
    pairs = pairs.localCheckpoint(eager=True)

    def total(frame: DataFrame, event: Column, bin_column: str) -> DataFrame:
        return frame.groupBy(*GROUP, event.alias("event"), F.col(bin_column).alias("bin")).agg(
            F.sum("n").alias("count")
        )

    counts = (
        total(pairs, F.lit("created"), "created_bin")
        .unionByName(total(pairs, F.col("outcome"), "finished_bin"))
        .unionByName(total(pairs.where(F.col("late_bin").isNotNull()), F.lit("late"), "late_bin"))
    )
    frame = to_pandas(counts)
    frame["bin"] = frame["bin"].astype("int64")
    frame["count"] = frame["count"].astype("int64")
    return frame


def _timeline(
    events: pd.DataFrame, summary: pd.DataFrame, start: int, end: int, width: float
) -> pd.DataFrame:
    width_ns = max(1, round(width * 1e9))
    bins = (end - start) // width_ns + 1
    kinds = ["created", *OUTCOMES]
    grid = pd.MultiIndex.from_tuples(
        [
            (purgatory, kind, b)
            for purgatory, kind in summary[list(GROUP)].itertuples(index=False)
            for b in range(bins)
        ],
        names=[*GROUP, "bin"],
    )
    counts = (
        events[events["event"].isin(kinds)]
        .pivot_table(index=[*GROUP, "bin"], columns="event", values="count", aggfunc="sum")
        .reindex(index=grid, columns=kinds)
        .fillna(0)
        .astype("int64")
    )
    frame = counts.reset_index()
    frame.columns.name = None
    frame["finished"] = frame[list(OUTCOMES)].sum(axis=1)
    frame["pending"] = (
        (frame["created"] - frame["finished"]).groupby([frame[g] for g in GROUP]).cumsum()
    )
    frame["t_s"] = frame["bin"] * width
    frame["throughput_per_s"] = frame["finished"] / width
    frame["expired_per_s"] = frame["expired"] / width
    return frame


def _lateness(events: pd.DataFrame, width_ms: float) -> pd.DataFrame:
    frame = (
        events[events["event"] == "late"]
        .drop(columns=["event"])
        .sort_values([*GROUP, "bin"], ignore_index=True)
    )
    # Bin -1 holds early expiries (< 0 ms); bin LATENESS_BINS everything above the range.
    frame["low_ms"] = [-math.inf if b < 0 else b * width_ms for b in frame["bin"]]
    frame["high_ms"] = [
        0.0 if b < 0 else math.inf if b >= LATENESS_BINS else (b + 1) * width_ms
        for b in frame["bin"]
    ]
    return frame[[*GROUP, "bin", "count", "low_ms", "high_ms"]]
