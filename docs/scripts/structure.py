"""The package's structure, read from its imports at docs build time: rooms, floors, arrows.

A *room* is a top-level module of ``aiopurgatory/`` (``aiopurgatory.wheel``, the package's
own ``__init__`` as ``aiopurgatory``) or one of its packages (``aiopurgatory.kafka``, all
of its modules together). An *arrow* goes from a room to each room it imports. An import
made when the module loads is *eager* (``if TYPE_CHECKING:`` blocks count as eager: a type
that points up is a layer that points up); one made inside a function is *lazy* (loaded
only when that code runs, as the command line loads Spark).

Floors: a room with no eager arrow out is on floor 1; any other is one above the highest
room it imports eagerly. So an eager arrow always points down, and a cycle of eager
imports has no floors: :func:`floors` raises ValueError naming it. Lazy arrows do not
raise a floor, so one could point up (none does: ``aiopurgatory.loop`` loads uvloop's
base, a room below it, on demand).

``python docs/scripts/structure.py`` prints the rooms by floor; the MkDocs hook draws
``img/structure.svg`` and the table of the architecture page from :func:`rooms`, and
tests/docs/test_architecture.py holds the page against :func:`modules`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Final

from diagrams import ACCENT, FONT, INK, LIGHT, MUTED  # the concept diagrams' palette

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGE: Final = "aiopurgatory"

SUBPACKAGE: Final = "#e3f2fd"


@dataclass(slots=True)
class Room:
    name: str
    """Dotted: ``aiopurgatory.kafka`` for a package, ``aiopurgatory.wheel`` for a module."""
    modules: list[str]
    lines: int
    eager: set[str] = field(default_factory=set)
    """The rooms it imports when it loads."""
    lazy: set[str] = field(default_factory=set)
    """The rooms it imports only inside functions, and not eagerly."""
    floor: int = 0


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def modules(root: Path = ROOT) -> list[str]:
    return list(module_files(root))


def room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, bool]]:
    """(module imported, lazily) for each import of ``path`` inside the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, lazy: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, inner
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    # `from pkg import module` imports the module, else a name of pkg.
                    submodule = f"{base}.{alias.name}"
                    yield (submodule if submodule in known else base), inner
            else:
                yield from visit(child, inner)

    for target, lazy in visit(ast.parse(path.read_text()), False):
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            yield target, lazy


def rooms(root: Path = ROOT) -> dict[str, Room]:
    """The rooms with their arrows and floors, read from the sources under ``root``."""
    files = module_files(root)
    known = set(files)
    found: dict[str, Room] = {}
    for name, path in files.items():
        room = found.setdefault(room_of(name), Room(room_of(name), [], 0))
        room.modules.append(name)
        room.lines += len(path.read_text().splitlines())
        for target, lazy in _imports(name, path, known):
            other = room_of(target)
            if other != room.name:
                (room.lazy if lazy else room.eager).add(other)
    for room in found.values():
        room.lazy -= room.eager
    for name, floor in floors(found).items():
        found[name].floor = floor
    return found


def floors(found: dict[str, Room]) -> dict[str, int]:
    """Each room's floor; ValueError on a cycle of eager imports."""
    done: dict[str, int] = {}

    def floor(name: str, path: tuple[str, ...]) -> int:
        if name in done:
            return done[name]
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise ValueError(f"a cycle of imports has no floors: {cycle}")
        below = [floor(other, (*path, name)) for other in sorted(found[name].eager)]
        done[name] = 1 + max(below, default=0)
        return done[name]

    for name in sorted(found):
        floor(name, ())
    return done


def table_markdown(found: dict[str, Room]) -> str:
    """The rooms from the top floor down: floor, lines, what each imports."""

    def names(rooms_: set[str]) -> str:
        return ", ".join(f"`{name}`" for name in sorted(rooms_)) or "nothing of the package"

    rows = [
        "| floor | room | lines | imports when it loads | only inside functions |",
        "| ---: | --- | ---: | --- | --- |",
    ]
    for room in sorted(found.values(), key=lambda r: (-r.floor, r.name)):
        lazy = names(room.lazy) if room.lazy else ""
        rows.append(
            f"| {room.floor} | `{room.name}` | {room.lines:,} | {names(room.eager)} | {lazy} |"
        )
    return "\n".join(rows) + "\n"


BOX_W: Final = 150
BOX_H: Final = 40
GAP_X: Final = 18
ROW_H: Final = 92
MARGIN: Final = 24


def structure_svg(root: Path = ROOT) -> str:
    """The rooms as boxes on their floors (the top floor at the top), arrows down to what
    each imports: solid when it loads, dashed inside functions."""
    found = rooms(root)
    top = max(room.floor for room in found.values())
    by_floor: dict[int, list[Room]] = {}
    for room in sorted(found.values(), key=lambda r: r.name):
        by_floor.setdefault(room.floor, []).append(room)
    widest = max(len(row) for row in by_floor.values())
    width = 2 * MARGIN + 70 + widest * (BOX_W + GAP_X)
    height = 2 * MARGIN + top * ROW_H
    where: dict[str, tuple[float, float]] = {}
    for floor, row in by_floor.items():
        row_y = float(MARGIN + (top - floor) * ROW_H)
        span = len(row) * (BOX_W + GAP_X) - GAP_X
        x0 = MARGIN + 70 + (widest * (BOX_W + GAP_X) - GAP_X - span) / 2
        for index, room in enumerate(row):
            where[room.name] = (x0 + index * (BOX_W + GAP_X), row_y)
    parts: list[str] = [
        "<defs><marker id='structure-arrow' viewBox='0 0 10 10' refX='9' refY='5' "
        "markerWidth='6' markerHeight='6' orient='auto-start-reverse'>"
        f"<path d='M0,0 L10,5 L0,10 z' fill='{MUTED}'/></marker></defs>"
    ]
    for floor in range(1, top + 1):
        label_y = MARGIN + (top - floor) * ROW_H + BOX_H / 2 + 4
        parts.append(_text(MARGIN, label_y, f"floor {floor}", size=11, fill=MUTED))
    for room in found.values():
        x, y = where[room.name]
        for other, dashed in [(o, False) for o in room.eager] + [(o, True) for o in room.lazy]:
            ox, oy = where[other]
            down = oy > y
            x1, y1 = x + BOX_W / 2, y + (BOX_H if down else 0)
            x2, y2 = ox + BOX_W / 2, oy + (0 if down else BOX_H)
            dash = " stroke-dasharray='4 3'" if dashed else ""
            parts.append(
                f"<line x1='{x1:g}' y1='{y1:g}' x2='{x2:g}' y2='{y2:g}' stroke='{MUTED}' "
                f"stroke-width='1' stroke-opacity='0.7'{dash} marker-end='url(#structure-arrow)'/>"
            )
    for room in found.values():
        x, y = where[room.name]
        fill = SUBPACKAGE if len(room.modules) > 1 else LIGHT
        parts.append(
            f"<rect x='{x:g}' y='{y:g}' width='{BOX_W}' height='{BOX_H}' rx='6' "
            f"fill='{fill}' stroke='{ACCENT}' stroke-width='1.2'/>"
        )
        label = room.name.removeprefix(PACKAGE + ".") if room.name != PACKAGE else PACKAGE
        if len(room.modules) > 1:
            label += "/"
        parts.append(_text(x + BOX_W / 2, y + 17, label, size=12, anchor="middle", bold=True))
        detail = f"{len(room.modules)} modules, " if len(room.modules) > 1 else ""
        parts.append(
            _text(x + BOX_W / 2, y + 32, f"{detail}{room.lines:,} lines", size=10, anchor="middle")
        )
    title = "aiopurgatory's rooms by floor, with their imports"
    body = "\n".join(parts)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width:g} {height:g}' "
        f"width='{width:g}' height='{height:g}' role='img' aria-label='{escape(title)}' {FONT}>\n"
        f"<title>{escape(title)}</title>\n"
        f"<rect width='{width:g}' height='{height:g}' fill='white'/>\n{body}\n</svg>\n"
    )


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: float,
    anchor: str = "start",
    bold: bool = False,
    fill: str = INK,
) -> str:
    weight = "bold" if bold else "normal"
    return (
        f"<text x='{x:g}' y='{y:g}' font-size='{size}' text-anchor='{anchor}' "
        f"font-weight='{weight}' fill='{fill}'>{escape(text)}</text>"
    )


def main() -> int:
    """Print the rooms from the top floor down, with what each imports."""
    for room in sorted(rooms().values(), key=lambda r: (-r.floor, r.name)):
        lazy = f"  (lazily: {', '.join(sorted(room.lazy))})" if room.lazy else ""
        print(f"floor {room.floor:2}  {room.name}: {', '.join(sorted(room.eager))}{lazy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
