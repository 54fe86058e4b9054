"""The Performance page's plots and tables, drawn from the committed bench records.

Every ``bench/*.json`` file (``python -m bench ... --json FILE``) is read at docs
build time, so a new run committed there redraws the page. For each suite the newest
file that has it (file names sort by date) feeds the plots; every file gets its own
tables (``bench.report.render``, medians over repeats). The ceiling's plot is the
bench's own (``bench.report.ceiling_plot``, which ``python -m bench ceiling --plot``
draws too), from the newest ``ceiling`` records and the JVM anchor when it is there.

``python docs/scripts/bench_figures.py OUT_DIR`` writes the same files by hand.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
BENCH: Final = ROOT / "bench"
if str(ROOT) not in sys.path:  # the bench package sits at the repository's root
    sys.path.insert(0, str(ROOT))

from bench import ceiling, report  # noqa: E402

Record = dict[str, Any]

IMPL_STYLE: Final = report.IMPL_STYLE
"""impl -> (colour, marker, legend label): the bench report's, shared by every plot."""


def record_files(bench: Path = BENCH) -> list[Path]:
    """The committed record files, oldest first (their names carry the date)."""
    return sorted(bench.glob("*.json"))


def load(path: Path) -> list[Record]:
    """The records of one file; a file that is not a list of records raises ValueError."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON list of benchmark records")
    return [r for r in data if "error" not in r]


def newest_by_suite(files: Sequence[Path]) -> dict[str, tuple[Path, list[Record]]]:
    """suite -> (file, its records of that suite), from the newest file that has it."""
    out: dict[str, tuple[Path, list[Record]]] = {}
    for path in files:  # oldest first: a newer file replaces what an older one gave
        by_suite: dict[str, list[Record]] = {}
        for record in load(path):
            by_suite.setdefault(str(record.get("suite")), []).append(record)
        for suite, records in by_suite.items():
            out[suite] = (path, records)
    return out


def _median(records: Sequence[Record], field: str) -> float | None:
    values = [float(r[field]) for r in records if isinstance(r.get(field), int | float)]
    return statistics.median(values) if values else None


def _svg_with_legend_below(figure: Any, ax: Any, columns: int) -> bytes:
    """``figure`` as SVG, the legend of ``ax`` (the panels plot alike) below them in
    ``columns``; the figure is closed."""
    import matplotlib.pyplot as plt

    handles, labels = ax.get_legend_handles_labels()
    figure.legend(
        handles, labels, loc="lower center", ncol=columns, fontsize=8, bbox_to_anchor=(0.5, 0.0)
    )
    figure.tight_layout(rect=(0, 0.1, 1, 1))  # room for the legend below
    data = _svg(figure)
    plt.close(figure)
    return data


def _svg(figure: Any) -> bytes:
    import matplotlib

    buffer = io.BytesIO()
    # Text stays text (the page's fonts draw it): a third of the size of glyph paths.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buffer.getvalue()


def rate_plot(suites: dict[str, tuple[Path, list[Record]]]) -> bytes | None:
    """CPU rate against pending operations, per implementation (churn and timer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in ("churn", "timer") if s in suites]
    if not shown:
        return None
    loops = ["asyncio", "uvloop"]
    figure, axes = plt.subplots(
        len(shown), len(loops), figsize=(10, 3.6 * len(shown)), squeeze=False, sharex=True
    )
    for row, suite in enumerate(shown):
        path, records = suites[suite]
        for col, loop in enumerate(loops):
            ax = axes[row][col]
            for impl, (colour, marker, label) in IMPL_STYLE.items():
                for gc, dash in (("on", "-"), ("off", ":")):
                    runs = [
                        r
                        for r in records
                        if r["impl"] == impl and r["loop"] == loop and r["gc"] == gc
                    ]
                    sizes = sorted({int(r["pending"]) for r in runs})
                    if not sizes:
                        continue
                    rates = [
                        _median([r for r in runs if r["pending"] == n], "cpu_ops_per_s")
                        for n in sizes
                    ]
                    ax.plot(
                        sizes,
                        [(v or 0) / 1e6 for v in rates],
                        dash,
                        color=colour,
                        marker=marker,
                        label=f"{label}, GC {gc}",
                    )
            ax.set_xscale("log")
            ax.set_title(f"{suite} on {loop} ({path.name})", fontsize=10)
            ax.set_ylabel("M pairs per CPU second")
            ax.grid(True, alpha=0.3)
            if row == len(shown) - 1:
                ax.set_xlabel("pending operations")
    return _svg_with_legend_below(figure, axes[0][0], columns=3)


def lateness_plot(suites: dict[str, tuple[Path, list[Record]]]) -> bytes | None:
    """Expiry lateness percentiles per implementation (Kafka's purgatory workload)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "purgatory" not in suites:
        return None
    path, records = suites["purgatory"]
    rate = max(int(r["rate"]) for r in records)
    records = [r for r in records if int(r["rate"]) == rate]
    scenarios = sorted({str(r["scenario"]) for r in records}, reverse=True)  # low, high
    panels = [(s, loop) for s in scenarios for loop in ("asyncio", "uvloop")]
    fields = [
        ("late_p50_ms", "p50"),
        ("late_p99_ms", "p99"),
        ("late_p999_ms", "p99.9"),
        ("late_max_ms", "max"),
    ]
    impls = [i for i in IMPL_STYLE if any(r["impl"] == i for r in records)]
    figure, axes = plt.subplots(
        len(scenarios), 2, figsize=(10, 3.4 * len(scenarios)), squeeze=False
    )
    width = 0.8 / max(len(impls), 1)
    for index, (scenario, loop) in enumerate(panels):
        ax = axes[index // 2][index % 2]
        for k, impl in enumerate(impls):
            colour, _, label = IMPL_STYLE[impl]
            runs = [
                r
                for r in records
                if r["impl"] == impl
                and r["scenario"] == scenario
                and r["loop"] == loop
                and r["gc"] == "on"
            ]
            values = [_median(runs, f) or 0.0 for f, _ in fields]
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(fields))]
            ax.bar(xs, values, width, color=colour, label=label)
        ax.set_xticks(range(len(fields)), [name for _, name in fields])
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylabel("ms after the deadline")
        ax.set_title(f"{scenario}, {loop}, GC on, {rate:,} req/s ({path.name})", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    return _svg_with_legend_below(figure, axes[0][0], columns=4)


def ceiling_lateness_plot(suites: dict[str, tuple[Path, list[Record]]]) -> bytes | None:
    """Expiry lateness against offered rate, from the newest ceiling records (GC on)."""
    if "ceiling" not in suites:
        return None
    path, records = suites["ceiling"]
    return report.ceiling_plot(records, ceiling.load_jvm_lateness(), source=path.name)


def tables_markdown(files: Sequence[Path]) -> str:
    """A section per record file with ``bench.report``'s tables, newest file first."""
    out: list[str] = []
    for path in reversed(files):
        out += [f"### `bench/{path.name}`", ""]
        # render() heads each suite with "## suite": one level under the file's heading.
        for line in report.render(load(path), markdown=True).splitlines():
            out.append(f"#### {line[3:]}" if line.startswith("## ") else line)
        out.append("")
    return "\n".join(out)


def figures(bench: Path = BENCH) -> dict[str, bytes]:
    """File name (under ``img/``) -> SVG bytes, for every plot the records allow."""
    suites = newest_by_suite(record_files(bench))
    out: dict[str, bytes] = {}
    for name, draw in (
        ("bench-rate.svg", rate_plot),
        ("bench-lateness.svg", lateness_plot),
        ("bench-ceiling.svg", ceiling_lateness_plot),
    ):
        data = draw(suites)
        if data is not None:
            out[name] = data
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in figures().items():
        (out / name).write_bytes(data)
        print(out / name)
    (out / "bench-tables.md").write_text(tables_markdown(record_files()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
