"""``python -m bench allocs``: what the library allocates per registration and per finish.

In steady state: ``pending`` operations are held; each of ``n`` cycles finishes the
oldest by the path measured and registers a new one in its place (the user's operation
object made outside the count, as the user makes it). Counted around the library's
call alone, for each path:

* ``allocs_per_op``: allocations (``PyObject_Malloc``/``PyMem_Malloc`` and their
  calloc, realloc of nothing), transient ones included, by a counting allocator
  (``bench/allocount.c``, compiled on first use with the C compiler Python was built
  with; without one these columns are None);
* ``bytes_per_op``: the bytes those allocations asked for;
* ``young_per_op``: how far the collector's young-generation counter moved
  (``gc.get_count()[0]``: allocations of objects the collector can track, minus those
  freed; the GC is off during the count, so nothing resets it);
* ``net_blocks_per_op``: ``sys.getallocatedblocks()`` after minus before (what stays
  allocated: per registration, what a pending operation holds beyond itself).

Each figure is the path's count minus a baseline loop making the same calls around a
function that does nothing, divided by ``n``. Paths: ``register`` (with 1 key of its
own, or 3 keys every operation shares), ``complete`` (``force_complete``),
``complete_key`` (the operation made ready, then ``check_and_complete`` of its key; 1
key), ``cancel``, ``expire`` (``n`` operations due at one tick, expired by the wheel
while ``pending`` others wait; the count runs across the loop's wait, minus the same
wait with nothing due: a burst, so the entries beyond the free list's 4,096 are freed).
``operation`` is the user's own object, for scale (held by a list). Each build runs in
a fresh interpreter (the pure one with ``AIOPURGATORY_NO_EXTENSIONS=1``). The counts
depend on the code path, not on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from .common import Record, run_child

SOURCE: Final = Path(__file__).resolve().parent / "allocount.c"
BUILDS: Final = ("compiled", "pure")
PATHS: Final = (
    ("operation", 1),
    ("register", 1),
    ("register", 3),
    ("complete", 1),
    ("complete", 3),
    ("complete_key", 1),
    ("cancel", 1),
    ("cancel", 3),
    ("expire", 1),
    ("expire", 3),
)
"""(path, keys per operation) measured, in this order."""
FIELDS: Final = ("allocs_per_op", "bytes_per_op", "young_per_op", "net_blocks_per_op")
TICK: Final = 0.001
WHEEL_SIZE: Final = 20
PURGE_INTERVAL: Final = 1000
SHARED: Final = ("fakeKey7", "fakeKey42", "fakeKey93")
EXPIRE_WAIT: Final = 0.1
"""The ``expire`` path sleeps this long until its operations (due in 5 ms) expired, and
its baseline as many times with nothing due."""


# -- the counting allocator ---------------------------------------------------------------


def library_path() -> Path:
    """Where the compiled counter lives: the temp dir, by source and interpreter."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = sys.implementation.cache_tag
    return Path(tempfile.gettempdir()) / f"aiopurgatory-allocount-{tag}-{digest}.so"


def build_counter() -> Path | None:
    """Compile bench/allocount.c once; None (and a note on stderr) without a compiler."""
    if not SOURCE.exists():
        print(f"allocs: no {SOURCE}; no gross counts", file=sys.stderr)
        return None
    out = library_path()
    if out.exists():
        return out
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths()["include"]
    partial = out.with_suffix(f".{os.getpid()}.tmp")
    command = [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(partial)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        print(f"allocs: cannot compile {SOURCE.name} ({detail}); no gross counts", file=sys.stderr)
        return None
    partial.replace(out)
    return out


class Counter:
    """The compiled counter, or (``lib`` None) a stand-in that counts nothing."""

    def __init__(self, path: Path | None) -> None:
        self.lib: Any = None
        if path is not None:
            self.lib = ctypes.PyDLL(str(path))
            for name in ("allocs", "reallocs", "frees", "bytes"):
                getattr(self.lib, f"allocount_{name}").restype = ctypes.c_ulonglong
            self.lib.allocount_install.restype = None
            self.lib.allocount_uninstall.restype = None
            self.lib.allocount_count.restype = None
            self.lib.allocount_install()
        self.on: Callable[[], None] = (lambda: None) if self.lib is None else self._on
        self.off: Callable[[], None] = (lambda: None) if self.lib is None else self._off

    def _on(self) -> None:
        self.lib.allocount_count(1)

    def _off(self) -> None:
        self.lib.allocount_count(0)

    def read(self) -> tuple[int, int]:
        """(allocations, bytes) so far."""
        if self.lib is None:
            return 0, 0
        return int(self.lib.allocount_allocs()), int(self.lib.allocount_bytes())

    def close(self) -> None:
        if self.lib is not None:
            self.lib.allocount_uninstall()


# -- the measurement ----------------------------------------------------------------------


class Tally:
    """What the counted regions added up to: allocations, bytes, young-generation moves,
    blocks."""

    __slots__ = ("allocs", "blocks", "bytes", "young")

    def __init__(self) -> None:
        self.allocs = self.bytes = self.young = self.blocks = 0

    def minus(self, base: Tally, n: int, counted: bool) -> dict[str, float | None]:
        def per(a: int, b: int) -> float:
            return round((a - b) / n, 2) + 0.0  # + 0.0: no -0.0

        return {
            "allocs_per_op": per(self.allocs, base.allocs) if counted else None,
            "bytes_per_op": per(self.bytes, base.bytes) if counted else None,
            "young_per_op": per(self.young, base.young),
            "net_blocks_per_op": per(self.blocks, base.blocks),
        }


def _region(counter: Counter, tally: Tally) -> Callable[[Callable[[], object]], None]:
    """``count(call)``: run ``call()`` with everything it allocates added to ``tally``."""
    get_count, blocks = gc.get_count, sys.getallocatedblocks
    on, off, read = counter.on, counter.off, counter.read

    def count(call: Callable[[], object]) -> None:
        young0 = get_count()[0]
        blocks0 = blocks()
        allocs0, bytes0 = read()
        on()
        call()
        off()
        allocs1, bytes1 = read()
        blocks1 = blocks()
        young1 = get_count()[0]
        tally.allocs += allocs1 - allocs0
        tally.bytes += bytes1 - bytes0
        tally.young += young1 - young0
        tally.blocks += blocks1 - blocks0

    return count


def _noop(*_: object) -> None:
    return None


def _nothing(timeout: float) -> None:
    return None


def _append_new(out: list[Any], make: Callable[[float], object]) -> None:
    out.append(make(3600.0))


async def measure(n: int, pending: int, counter: Counter) -> list[Record]:
    """Every path of :data:`PATHS`: ``n`` operations each, at ``pending`` held."""
    import aiopurgatory as ap

    class Op(ap.DelayedOperation[None]):
        """The user's operation: a flag its check reads, hooks that do nothing."""

        __slots__ = ("ready",)

        def __init__(self, timeout: float) -> None:
            super().__init__(timeout)
            self.ready = False

        def try_complete(self) -> bool:
            return self.ready and self.force_complete()

        def on_complete(self) -> None:
            return None

    build = "compiled" if ap.COMPILED else "pure"
    records: list[Record] = []

    def purgatory() -> ap.Purgatory:
        return ap.Purgatory(
            "allocs", tick=TICK, wheel_size=WHEEL_SIZE, purge_interval=PURGE_INTERVAL
        )

    def keyset(keys: int, count: int) -> list[tuple[Hashable, ...]]:
        # made before counting: the keys are the user's objects
        return [(f"k{i}",) for i in range(count)] if keys == 1 else [SHARED] * count

    def cycles(path: str, keys: int, tally: Tally, base: Tally) -> None:
        """``n`` cycles at ``pending`` held: finish the oldest, register a new one."""
        p = purgatory()
        total = pending + 2 * n
        keysets = keyset(keys, total)
        ops: list[Any] = [None] * total
        for i in range(pending):
            ops[i] = p.try_complete_else_watch(Op(3600.0), keysets[i])
        count, count_base = _region(counter, tally), _region(counter, base)
        # twice: the first n warm the free lists and the dicts, the second n count
        for i in range(pending, pending + 2 * n):
            counting = i >= pending + n
            old = ops[i - pending]
            ops[i - pending] = None
            if path == "register":
                op = Op(3600.0)
                old.force_complete()
                if counting:
                    ks = keysets[i]
                    count_base(partial(_noop, op, ks))
                    count(partial(p.try_complete_else_watch, op, ks))
                else:
                    p.try_complete_else_watch(op, keysets[i])
                ops[i] = op
            else:
                if path == "complete_key":
                    old.ready = True
                    key = keysets[i - pending][0]
                    call: Callable[[], object] = partial(p.check_and_complete, key)
                elif path == "complete":
                    call = old.force_complete
                else:
                    call = old.cancel
                if counting:
                    count_base(partial(_noop, old))
                    count(call)
                else:
                    call()
                ops[i] = p.try_complete_else_watch(Op(3600.0), keysets[i])
            del old
        p.close()

    for path, keys in PATHS:
        tally, base = Tally(), Tally()
        if path == "operation":  # the user's own object: what a registration starts from
            count, count_base = _region(counter, tally), _region(counter, base)
            held: list[Any] = []
            for _ in range(n):
                count_base(partial(_append_new, held, _nothing))
                count(partial(_append_new, held, Op))
            del held
        elif path == "expire":
            p = purgatory()
            keysets = keyset(keys, 2 * n + pending)
            held = [  # held meanwhile, due in an hour
                p.try_complete_else_watch(Op(3600.0), ks) for ks in keysets[2 * n :]
            ]
            for rnd in range(2):  # the first round warms up, the second counts
                ops = [Op(0.005) for _ in range(n)]
                await asyncio.sleep(0)  # start on a fresh loop pass
                for op, ks in zip(ops, keysets[rnd * n : (rnd + 1) * n], strict=True):
                    p.try_complete_else_watch(op, ks)
                # sleeps of EXPIRE_WAIT until all expired, and as many with nothing due
                sleeps = [0]
                await _counted(counter, tally if rnd else Tally(), _expiring(p, pending, sleeps))
                if p.num_delayed() != pending or not all(op.expired for op in ops):
                    raise RuntimeError("an operation due expired in neither round")
                if rnd:
                    await _counted(counter, base, _idle(sleeps[0]))
                del ops
            del held
            p.close()
        else:
            cycles(path, keys, tally, base)
        record: Record = {
            "suite": "allocs",
            "impl": "wheel" if build == "compiled" else "pure",
            "build": build,
            "loop": "asyncio",
            "gc": "off",
            "path": path,
            "keys": keys,
            "n": n,
            "pending": pending,
        }
        record.update(tally.minus(base, n, counter.lib is not None))
        records.append(record)
    return records


async def _expiring(purgatory: Any, pending: int, sleeps: list[int]) -> None:
    """Sleep until only ``pending`` operations are left; ``sleeps[0]``: how many times."""
    while purgatory.num_delayed() > pending:
        await asyncio.sleep(EXPIRE_WAIT)
        sleeps[0] += 1


async def _idle(sleeps: int) -> None:
    for _ in range(sleeps):
        await asyncio.sleep(EXPIRE_WAIT)


async def _counted(counter: Counter, tally: Tally, awaitable: Any) -> None:
    """Count across an await: everything the loop ran meanwhile."""
    young0, blocks0 = gc.get_count()[0], sys.getallocatedblocks()
    allocs0, bytes0 = counter.read()
    counter.on()
    await awaitable
    counter.off()
    allocs1, bytes1 = counter.read()
    tally.allocs += allocs1 - allocs0
    tally.bytes += bytes1 - bytes0
    tally.young += gc.get_count()[0] - young0
    tally.blocks += sys.getallocatedblocks() - blocks0


def run_here(n: int, pending: int, library: Path | None) -> list[Record]:
    """Measure the build this interpreter loaded, with the GC off (and a young count
    raised well above what any path frees, so that it never stops at zero)."""
    counter = Counter(library)
    gc.collect()
    gc.disable()
    ballast: list[list[None]] = [[] for _ in range(4 * (n + pending) + 100_000)]
    try:
        return asyncio.run(measure(n, pending, counter))
    finally:
        counter.close()
        del ballast
        gc.enable()


def run_build(build: str, n: int, pending: int, library: Path | None) -> list[Record]:
    """One build, in a fresh interpreter."""
    env = dict(os.environ)
    env.pop("AIOPURGATORY_NO_EXTENSIONS", None)
    if build == "pure":
        env["AIOPURGATORY_NO_EXTENSIONS"] = "1"
    argv = [sys.executable, "-m", "bench", "allocs", "--child", "-n", str(n)]
    argv += ["--pending", str(pending), "--library", str(library or "")]
    child = run_child(argv, env)
    if child.returncode:
        raise SystemExit(f"allocs ({build}): {child.stderr.strip()}")
    records: list[Record] = json.loads(child.stdout)
    if {r["build"] for r in records} != {build}:
        raise SystemExit(f"allocs: asked for the {build} build, measured {records[0]['build']}")
    return records


def render(records: Sequence[Record], *, markdown: bool = False) -> str:
    """Per path and keys: each build's figures side by side."""
    builds = [b for b in BUILDS if any(r.get("build") == b for r in records)]
    head = ["path", "keys", "pending"]
    head += [f"{b}: {f.removesuffix('_per_op')}" for b in builds for f in FIELDS]
    rows: list[list[str]] = []
    for held in sorted({r.get("pending") for r in records}, key=lambda p: int(p or 0)):
        for path, keys in PATHS:
            row = [path, str(keys), str(held)]
            found = False
            for build in builds:
                match = [
                    r
                    for r in records
                    if (r.get("build"), r.get("path"), r.get("keys"), r.get("pending"))
                    == (build, path, keys, held)
                ]
                found = found or bool(match)
                for field in FIELDS:
                    value = match[-1].get(field) if match else None
                    row.append("-" if value is None else f"{value:g}")
            if found:
                rows.append(row)
    lines = [
        "## allocs",
        "",
        "per operation, the library's call alone minus a baseline loop (the user's"
        " operation object made outside the count); allocs and bytes include transient"
        " allocations, young is the collector's young-generation counter, net blocks what"
        " stays allocated",
        "",
    ]
    if markdown:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines += [
            "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]
        ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench allocs", description=__doc__)
    p.add_argument("-n", type=int, default=20_000, help="operations counted per path")
    p.add_argument(
        "--pending",
        default="1000",
        help="operations held meanwhile; comma-separated: a run per value",
    )
    p.add_argument("--build", default="compiled,pure", help="comma-separated, of: compiled, pure")
    p.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--library", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    pendings = [int(p) for p in args.pending.split(",") if p]
    if args.n < 1 or not pendings or min(pendings) < 1:
        raise SystemExit("-n and --pending must be >= 1")
    if args.child:
        library = Path(args.library) if args.library else None
        print(json.dumps(run_here(args.n, pendings[0], library), allow_nan=False))
        return 0
    builds = [b for b in args.build.split(",") if b]
    if set(builds) - set(BUILDS):
        raise SystemExit(f"--build takes {', '.join(BUILDS)}, got {args.build!r}")
    library = build_counter()
    records: list[Record] = []
    for pending in pendings:
        for build in builds:
            records += run_build(build, args.n, pending, library)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(records, file, indent=1, allow_nan=False)
    print(render(records, markdown=args.markdown))
    return 0
