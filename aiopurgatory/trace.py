"""Record one row per finished operation to Parquet, batched off the hot path.

A :class:`TraceRecorder` is an operation observer: pass it as a purgatory's
``observer``. The purgatory calls :meth:`TraceRecorder.operation_finished` on the event
loop; the recorder only appends a tuple to a list. Full batches go to one background
thread that converts them and writes one Parquet file per batch, so a crash loses at
most the batch still in memory. Needs the ``trace`` extra (pyarrow).

Times are int64 nanoseconds since the recorder's *base*: the reading of its clock
(the purgatory's clock) when it was created. The file metadata holds the base's
wall-clock time (``aiopurgatory.base_wall_ns``) and the clock reading itself
(``aiopurgatory.base_clock_ns``); the wall time of a row is ``base_wall_ns + t_ns``.
File names ``trace-<base_wall_ns>-<token>-<seq>.parquet`` carry the wall base too, so
readers that cannot see file metadata (Spark) can align several recordings.

Times are recorded within :data:`MAX_OFFSET_NS` of the base (about 146 years), so that
``base_wall_ns + t_ns`` stays an int64 for every reader. Beyond it a *deadline* is
recorded as null, the value that also means "no timeout": such a deadline is far
future (legal, and never reached in practice). A row whose creation or finish time lies
beyond it (a clock that is not the purgatory's, say) is dropped and counted in
``dropped_rows``; the other rows of its batch are written as usual.
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from aiopurgatory._extra import raise_missing_extra
from aiopurgatory.operation import Outcome

if TYPE_CHECKING:
    import pyarrow as pa

    from aiopurgatory.operation import DelayedOperation

__all__ = [
    "COLUMNS",
    "FIELDS",
    "FILE_PATTERN",
    "OUTCOMES",
    "TraceRecorder",
    "trace_file_name",
    "trace_schema",
    "write_trace_table",
]

FIELDS: Final = (
    ("purgatory", "string", False),
    ("kind", "string", False),
    ("num_keys", "int32", False),
    ("created_ns", "int64", False),
    ("deadline_ns", "int64", True),
    ("finished_ns", "int64", False),
    ("outcome", "string", False),
)
"""The trace schema, stated once: (column, Arrow type name, nullable). The Arrow schema
(:func:`trace_schema`) and the Spark job's read schema are derived from it."""
COLUMNS: Final = tuple(name for name, _, _ in FIELDS)
"""The trace's column names, in file order (the first item of each of :data:`FIELDS`)."""
OUTCOMES: Final = tuple(str(outcome.value) for outcome in Outcome)
"""The ``outcome`` column's values."""
FILE_PATTERN: Final = r"^trace-(\d+)-([0-9a-f]+)-(\d+)\.parquet$"
"""Regular expression of a trace file name; group 1 is the base wall time in ns."""

MAX_OFFSET_NS: Final = 2**62
"""The furthest a recorded time may lie from the recording's base, in ns (146 years).

Nanoseconds since a base that itself lies within :data:`MAX_BASE_NS` of the clock's
zero, so the clock reading in ns (an int64 when converted) and ``base_wall_ns + t_ns``
(Spark adds them) both stay in range."""
MAX_BASE_NS: Final = 2**61
"""The furthest from zero a recorder's clock may read at its creation, in ns (73 years)."""

FORMAT_VERSION: Final = "1"
_META_PREFIX: Final = "aiopurgatory."

# A row as buffered on the hot path: times still in clock seconds, outcome an enum.
_Row = tuple[str, str, int, "float | None", "float | None", float, "Outcome"]


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:  # without the extra: say which to install
        raise_missing_extra(exc, "trace", "trace recording")


def trace_schema() -> pa.Schema:
    """The Arrow schema of a trace file (without its key-value metadata)."""
    import pyarrow as pa

    return pa.schema(
        [pa.field(name, getattr(pa, kind)(), nullable=nullable) for name, kind, nullable in FIELDS]
    )


def trace_file_name(base_wall_ns: int, token: str, seq: int) -> str:
    """The name of the ``seq``-th file of the recording ``token`` (see :data:`FILE_PATTERN`)."""
    return f"trace-{base_wall_ns:019d}-{token}-{seq:06d}.parquet"


def write_trace_table(
    directory: Path, table: pa.Table, *, base_wall_ns: int, base_clock_ns: int, token: str, seq: int
) -> Path:
    """Write ``table`` (in :func:`trace_schema`) as one trace file, atomically.

    The file appears under its final name only once complete; until then it is a
    hidden ``.tmp`` file that Spark and pyarrow datasets skip.
    """
    import pyarrow.parquet as pq

    metadata = {
        f"{_META_PREFIX}format": FORMAT_VERSION,
        f"{_META_PREFIX}base_wall_ns": str(base_wall_ns),
        f"{_META_PREFIX}base_clock_ns": str(base_clock_ns),
    }
    table = table.cast(trace_schema()).replace_schema_metadata(metadata)
    name = trace_file_name(base_wall_ns, token, seq)
    final = directory / name
    partial = directory / f".{name}.tmp"
    pq.write_table(table, partial, compression="zstd")
    os.replace(partial, final)
    return final


class TraceRecorder:
    """An operation observer writing Parquet trace files into ``directory``.

    A batch is handed to the writer thread when it holds ``rows_per_file`` rows, or at
    the first finish ``seconds_per_file`` or more after the batch began; each batch
    becomes one file. ``clock`` must be the purgatory's clock (the default matches the
    default event loop's ``time()``). Use the recorder from one event loop thread, and
    :meth:`close` it (or use ``with``); one still open at interpreter exit is closed then.

    Pass it as a purgatory's observer (``Purgatory(name, observer=recorder)``), or as
    a Prometheus collector's ``forward_to``. Recording a finished operation appends one
    tuple to a list on the loop (O(1), no lock, no I/O); the conversion to Arrow and the
    Parquet writes happen on the writer thread.

    Args:
        directory: where the files go (created if missing); a local path.
        rows_per_file: the most rows per file (at least 1).
        seconds_per_file: the longest a batch stays open, in the clock's seconds.
        clock: the purgatory's clock, ``time.monotonic`` by default.

    Raises:
        ValueError: ``rows_per_file`` below 1, ``seconds_per_file`` not above 0, or a
            clock that reads more than 2**61 ns (73 years) from zero.
        ImportError: pyarrow is not installed (the ``trace`` extra).
    """

    __slots__ = (
        "_base_clock_ns",
        "_base_wall_ns",
        "_closed",
        "_directory",
        "_error",
        "_queue",
        "_roll_at",
        "_rows",
        "_rows_per_file",
        "_seconds_per_file",
        "_seq",
        "_thread",
        "_token",
        "dropped_rows",
        "files_written",
        "rows_written",
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rows_per_file: int = 100_000,
        seconds_per_file: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file!r}")
        if not seconds_per_file > 0:
            raise ValueError(f"seconds_per_file must be > 0, got {seconds_per_file!r}")
        _require_pyarrow()
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._rows_per_file = rows_per_file
        self._seconds_per_file = float(seconds_per_file)
        base = clock()
        if not abs(base) * 1e9 < MAX_BASE_NS:  # also NaN
            raise ValueError(
                f"the clock must read a finite time within {MAX_BASE_NS / 1e9:.3g} s of zero,"
                f" got {base!r}"
            )
        self._base_wall_ns = time.time_ns()
        self._base_clock_ns = round(base * 1e9)
        self._roll_at = base + self._seconds_per_file
        self._token = secrets.token_hex(4)
        self._seq = 0
        self._rows: list[_Row] = []
        self._closed = False
        self._error: BaseException | None = None
        self.rows_written = 0
        """Rows written to files so far (by the writer thread)."""
        self.files_written = 0
        """Files written so far."""
        self.dropped_rows = 0
        """Rows not recorded: finished after :meth:`close`, or with a creation or finish
        time more than 2**62 ns from the recording's start (a recorder on another clock
        than its purgatory's)."""
        self._queue: queue.SimpleQueue[tuple[int, list[_Row]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._write_loop, name=f"aiopurgatory-trace-{self._token}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    @property
    def directory(self) -> Path:
        """The directory the trace files are written to."""
        return self._directory

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def operation_finished(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
    ) -> None:
        """Buffer one row (called by the purgatory on the event loop)."""
        if self._closed:
            self.dropped_rows += 1
            return
        rows = self._rows
        rows.append((purgatory, op.kind, op.num_keys, op.created, op.deadline, finished, outcome))
        if len(rows) >= self._rows_per_file or finished >= self._roll_at:
            self._hand_off()
            self._roll_at = finished + self._seconds_per_file

    def flush(self) -> None:
        """Hand the open batch to the writer now (it is written shortly after)."""
        if not self._closed:
            self._hand_off()

    def close(self) -> None:
        """Write every buffered row, stop the writer thread; idempotent.

        Raises the first error the writer met (for example a full disk), if any.
        """
        if self._closed:
            return
        self._hand_off()
        self._closed = True
        atexit.unregister(self.close)
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"trace writer failed: {self._error}") from self._error

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<TraceRecorder {str(self._directory)!r} {state} "
            f"files={self.files_written} rows={self.rows_written}>"
        )

    def _hand_off(self) -> None:
        rows = self._rows
        if rows:
            self._rows = []
            self._queue.put((self._seq, rows))
            self._seq += 1

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            seq, rows = item
            try:
                table = self._to_table(rows)
                if table.num_rows:
                    write_trace_table(
                        self._directory,
                        table,
                        base_wall_ns=self._base_wall_ns,
                        base_clock_ns=self._base_clock_ns,
                        token=self._token,
                        seq=seq,
                    )
            except Exception as exc:  # keep writing later batches; close() reports it
                self.dropped_rows += len(rows)
                if self._error is None:
                    self._error = exc
            else:
                # Rows whose times cannot be recorded were left out (see the module doc).
                self.dropped_rows += len(rows) - table.num_rows
                if table.num_rows:
                    self.rows_written += table.num_rows
                    self.files_written += 1

    def _to_table(self, rows: Sequence[_Row]) -> pa.Table:
        """The rows as a table, leaving out those whose times cannot be recorded."""
        import pyarrow as pa
        import pyarrow.compute as pc

        def column(index: int) -> list[Any]:
            return list(map(itemgetter(index), rows))

        outcomes = column(6)
        names = {member: str(member.value) for member in type(outcomes[0])}
        base_ns = self._base_clock_ns
        base = pa.scalar(base_ns, pa.int64())
        no_time = pa.scalar(None, pa.float64())

        def to_ns(index: int) -> tuple[pa.Array, pa.Array]:
            """ns since the base (null where it is too far or not finite), and whether
            each value fitted (null where the value was None)."""
            scaled = pc.round(pc.multiply(pa.array(column(index), pa.float64()), 1e9))
            # Compared as floats first, so no value that overflows an int64 is cast:
            # inf and NaN compare False and become null too.
            fits = pc.less_equal(pc.abs(pc.subtract(scaled, float(base_ns))), float(MAX_OFFSET_NS))
            kept = pc.if_else(fits, scaled, no_time)
            return pc.subtract(pc.cast(kept, pa.int64()), base), fits

        finished_ns, finished_fits = to_ns(5)
        created_at, created_fits = to_ns(3)
        deadline_ns, _ = to_ns(4)  # a deadline too far away is recorded as null
        # An operation finished before it was registered has no creation time: it
        # spent no time in the purgatory.
        created_ns = pc.coalesce(created_at, finished_ns)
        table = pa.table(
            [
                pa.array(column(0), pa.string()),
                pa.array(column(1), pa.string()),
                pa.array(column(2), pa.int32()),
                created_ns,
                deadline_ns,
                finished_ns,
                pa.array(list(map(names.__getitem__, outcomes)), pa.string()),
            ],
            schema=trace_schema(),
        )
        keep = pc.and_(pc.fill_null(finished_fits, False), pc.fill_null(created_fits, True))
        if pc.all(keep).as_py():
            return table
        return table.filter(keep)
