"""Where a Spark job's time goes, read from Spark's event log (``report --profile``).

Spark writes one JSON event per line (``spark.eventLog.enabled``); the stage-completed
events carry each stage's submission and completion times and its tasks' summed
metrics. :func:`stage_times` turns them into a small table, one row per stage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["format_stages", "stage_times"]


def _events(path: Path) -> Iterator[dict[str, Any]]:
    files = (
        sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if path.is_dir()
        else [path]
    )
    for file in files:
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def stage_times(event_log: Path) -> pd.DataFrame:
    """Per completed stage: job, stage, tasks, wall seconds, task seconds, GC seconds, rows.

    ``event_log`` is a file or a directory of event logs (``spark.eventLog.dir``).
    """
    job_of: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    for event in _events(event_log):
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            for stage in event.get("Stage IDs", []):
                job_of[int(stage)] = int(event["Job ID"])
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            metrics = {m["Name"]: m.get("Value") for m in info.get("Accumulables", [])}
            submitted = info.get("Submission Time") or 0
            completed = info.get("Completion Time") or submitted
            rows.append(
                {
                    "job": job_of.get(int(info["Stage ID"]), -1),
                    "stage": int(info["Stage ID"]),
                    "name": str(info.get("Stage Name", "")).split(" at ")[0],
                    "tasks": int(info.get("Number of Tasks", 0)),
                    "wall_s": (completed - submitted) / 1e3,
                    "task_s": float(metrics.get("internal.metrics.executorRunTime", 0)) / 1e3,
                    "gc_s": float(metrics.get("internal.metrics.jvmGCTime", 0)) / 1e3,
                    "input_rows": int(metrics.get("internal.metrics.input.recordsRead", 0)),
                    "shuffle_rows": int(
                        metrics.get("internal.metrics.shuffle.write.recordsWritten", 0)
                    ),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "job",
            "stage",
            "name",
            "tasks",
            "wall_s",
            "task_s",
            "gc_s",
            "input_rows",
            "shuffle_rows",
        ],
    )


def format_stages(stages: pd.DataFrame) -> str:
    """The stage table as aligned text."""
    if stages.empty:
        return "(no completed Spark stage in the event log)"
    return str(stages.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
