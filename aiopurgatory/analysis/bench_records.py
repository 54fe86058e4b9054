"""``python -m bench ... --json FILE`` records for the report: loading and the rate table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from aiopurgatory.analysis.errors import AnalysisError

__all__ = ["bench_rates", "load_bench"]


def load_bench(paths: Sequence[Path]) -> pd.DataFrame:
    """``python -m bench ... --json FILE`` records (lists of dicts) as one frame."""
    records: list[dict[str, object]] = []
    for path in paths:
        try:
            loaded = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise AnalysisError(f"cannot read benchmark records {path}: {exc}") from exc
        if not isinstance(loaded, list) or not all(isinstance(r, dict) for r in loaded):
            raise AnalysisError(f"{path}: expected a JSON list of benchmark records")
        records += loaded
    return pd.DataFrame(records)


def bench_rates(records: pd.DataFrame) -> pd.DataFrame:
    """Median achieved rate per target rate and implementation (``purgatory`` suite)."""
    needed = {"suite", "impl", "rate", "achieved_per_s"}
    if records.empty or not needed <= set(records.columns):
        return pd.DataFrame(columns=["panel", "impl", "target_rate", "achieved_rate", "runs"])
    rows = records[records["suite"] == "purgatory"]
    if "error" in rows.columns:
        rows = rows[rows["error"].isna()]
    facets = [c for c in ("scenario", "keys", "loop", "gc") if c in rows.columns]
    panel = rows[facets].astype(str).agg(", ".join, axis=1) if facets else "purgatory"
    table = (
        rows.assign(panel=panel)
        .groupby(["panel", "impl", "rate"], as_index=False)
        .agg(achieved_rate=("achieved_per_s", "median"), runs=("achieved_per_s", "size"))
        .rename(columns={"rate": "target_rate"})
    )
    return table[["panel", "impl", "target_rate", "achieved_rate", "runs"]]
