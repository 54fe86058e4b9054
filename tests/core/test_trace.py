"""The trace recorder: rows, files, rolling, close, crash bound."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock
from aiopurgatory.trace import COLUMNS, FILE_PATTERN, TraceRecorder

REPO: Path = Path(__file__).resolve().parents[2]


class Flag:
    value = False


class Wait(ap.DelayedOperation[str]):
    label = "wait"
    __slots__ = ("flag",)

    def __init__(self, flag: Flag, timeout: float | None) -> None:
        super().__init__(timeout)
        self.flag = flag

    def try_complete(self) -> bool:
        return self.flag.value and self.force_complete()

    def on_complete(self) -> str:
        return "expired" if self.expired else "ok"


class FakeOp:
    """Just the attributes the recorder reads."""

    __slots__ = ("created", "deadline", "kind", "num_keys")

    def __init__(self, created: float, deadline: float | None) -> None:
        self.kind = "Fake"
        self.num_keys = 3
        self.created = created
        self.deadline = deadline


def record(recorder: TraceRecorder, count: int, *, start: float = 0.0, step: float = 1e-3) -> None:
    for i in range(count):
        t = start + i * step
        op: Any = FakeOp(t, t + 0.5)
        recorder.operation_finished("p", op, ap.Outcome.COMPLETED, t + 0.1)


def read(directory: Path) -> pa.Table:
    return ds.dataset(directory, format="parquet").to_table()


def trace_files(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if re.match(FILE_PATTERN, name))


@pytest.mark.anyio
async def test_records_every_outcome_from_a_real_purgatory(tmp_path: Path) -> None:
    clock = ManualClock(start=100.0)
    flag = Flag()
    with TraceRecorder(tmp_path, clock=clock.time) as recorder:
        async with ap.Purgatory("produce", clock=clock, observer=recorder) as purgatory:
            done = purgatory.try_complete_else_watch(Wait(flag, 1.0), ["a", "b"])
            late = purgatory.try_complete_else_watch(Wait(flag, 0.25), ["c"])
            gone = purgatory.try_complete_else_watch(Wait(flag, None), ["a"])
            await clock.advance(0.1)
            gone.cancel()
            await clock.advance(0.2)  # expires `late`
            flag.value = True
            purgatory.check_and_complete("a")  # completes `done`
            left = purgatory.try_complete_else_watch(Wait(Flag(), 5.0), ["z"])
        assert await done == "ok"
        assert await late == "expired"
        assert left.done()
    rows = read(tmp_path).sort_by([("finished_ns", "ascending"), ("outcome", "ascending")])
    ms = 1_000_000
    assert rows.to_pylist() == [
        dict(zip(COLUMNS, row, strict=True))
        for row in [
            ("produce", "wait", 1, 0, None, 100 * ms, "cancelled"),
            ("produce", "wait", 1, 0, 250 * ms, 250 * ms, "expired"),
            ("produce", "wait", 1, 300 * ms, 5300 * ms, 300 * ms, "closed"),
            ("produce", "wait", 2, 0, 1000 * ms, 300 * ms, "completed"),
        ]
    ]


def test_nothing_lost_at_close_across_many_rolls(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path, rows_per_file=100, clock=lambda: 0.0)
    record(recorder, 10_050)
    recorder.close()
    assert recorder.rows_written == 10_050
    assert recorder.files_written == 101
    files = trace_files(tmp_path)
    assert len(files) == 101
    assert [pq.read_metadata(tmp_path / name).num_rows for name in files] == [100] * 100 + [50]
    finished = read(tmp_path).column("finished_ns").to_pylist()
    assert sorted(finished) == [round((i * 1e-3 + 0.1) * 1e9) for i in range(10_050)]


def test_a_file_per_interval_of_clock_time(tmp_path: Path) -> None:
    with TraceRecorder(tmp_path, seconds_per_file=1.0, clock=lambda: 0.0) as recorder:
        record(recorder, 35, step=0.1)  # finishes at 0.1 .. 3.5 s
    sizes = [pq.read_metadata(tmp_path / name).num_rows for name in trace_files(tmp_path)]
    assert sum(sizes) == 35
    assert sizes == [10, 10, 10, 5]  # the row reaching the interval closes its file


def test_file_name_and_metadata_carry_the_base(tmp_path: Path) -> None:
    before = time.time_ns()
    with TraceRecorder(tmp_path, clock=lambda: 12.5) as recorder:
        record(recorder, 3, start=12.5)
    (name,) = trace_files(tmp_path)
    match = re.match(FILE_PATTERN, name)
    assert match is not None
    wall = int(match.group(1))
    assert before <= wall <= time.time_ns()
    metadata = pq.read_schema(tmp_path / name).metadata
    assert metadata[b"aiopurgatory.base_wall_ns"] == str(wall).encode()
    assert metadata[b"aiopurgatory.base_clock_ns"] == b"12500000000"
    assert read(tmp_path).column("created_ns").to_pylist() == [0, 1_000_000, 2_000_000]
    assert repr(recorder).endswith("closed files=1 rows=3>")


def test_close_is_idempotent_and_later_rows_are_counted_as_dropped(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path, clock=lambda: 0.0)
    record(recorder, 5)
    recorder.flush()
    recorder.close()
    recorder.close()
    assert recorder.closed
    record(recorder, 2)
    assert (recorder.rows_written, recorder.dropped_rows) == (5, 2)
    assert read(tmp_path).num_rows == 5


def test_writer_errors_surface_at_close(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path / "t", rows_per_file=10, clock=lambda: 0.0)
    (tmp_path / "t").rmdir()
    (tmp_path / "t").write_text("not a directory")
    record(recorder, 25)
    with pytest.raises(RuntimeError, match="trace writer failed"):
        recorder.close()
    assert recorder.dropped_rows == 25


@pytest.mark.parametrize(("rows", "seconds"), [(0, 1.0), (10, 0.0), (10, float("nan"))])
def test_rejects_bad_roll_settings(tmp_path: Path, rows: int, seconds: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        TraceRecorder(tmp_path, rows_per_file=rows, seconds_per_file=seconds)


CHILD = """
import os, sys, time
import aiopurgatory as ap
from aiopurgatory.trace import TraceRecorder

class Op:
    kind = "Fake"
    num_keys = 1
    created = 0.0
    deadline = None

recorder = TraceRecorder(sys.argv[1], rows_per_file=100, clock=lambda: 0.0)
mode = sys.argv[2]
count = 0
announced = False
while mode == "stream" or count < 1_050:
    recorder.operation_finished("p", Op(), ap.Outcome.COMPLETED, count * 1e-6)
    count += 1
    if mode == "stream" and not announced and recorder.files_written >= 3:
        print("streaming", flush=True)
        announced = True
while recorder.files_written < 10:
    time.sleep(0.01)
os._exit(1)  # crash: no close(), no atexit
"""


def run_child(directory: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(directory), mode],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_crash_loses_at_most_the_open_batch(tmp_path: Path) -> None:
    child = run_child(tmp_path, "batch")
    assert child.wait(timeout=60) == 1
    assert read(tmp_path).num_rows == 1_000  # the 50 rows of the open batch are lost


def test_a_killed_writer_leaves_only_complete_files(tmp_path: Path) -> None:
    child = run_child(tmp_path, "stream")
    assert child.stdout is not None
    assert child.stdout.readline() == "streaming\n"
    time.sleep(0.3)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    files = trace_files(tmp_path)
    assert files
    assert all(pq.read_metadata(tmp_path / name).num_rows == 100 for name in files)
    assert read(tmp_path).num_rows == 100 * len(files)


def test_importing_the_package_or_the_module_does_not_import_pyarrow() -> None:
    code = "import sys, aiopurgatory, aiopurgatory.trace; print('pyarrow' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
