"""The concept diagrams as SVG, drawn at docs build time (no image is committed).

``python docs/scripts/diagrams.py OUT_DIR`` writes them by hand; the MkDocs hook
(``docs/scripts/hooks.py``) adds them to the site as ``img/wheel.svg`` and
``img/lifecycle.svg``. Plain SVG with the page's own fonts: nothing to fetch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Final

FONT: Final = "font-family='system-ui, -apple-system, Segoe UI, Roboto, sans-serif'"
INK: Final = "#263238"
ACCENT: Final = "#5e35b1"
LIGHT: Final = "#ede7f6"
DONE: Final = "#e8f5e9"
WARN: Final = "#fff3e0"
MUTED: Final = "#90a4ae"

_ARROW_DEFS: Final = (
    "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' "
    f"markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='{INK}'/>"
    "</marker></defs>"
)


def _svg(width: int, height: int, title: str, parts: Iterable[str]) -> str:
    body = "\n".join(parts)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' "
        f"width='{width}' height='{height}' role='img' aria-label='{escape(title)}' {FONT}>\n"
        f"<title>{escape(title)}</title>\n{_ARROW_DEFS}\n"
        f"<rect width='{width}' height='{height}' fill='white'/>\n{body}\n</svg>\n"
    )


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: float = 13,
    anchor: str = "start",
    weight: str = "normal",
    fill: str = INK,
) -> str:
    return (
        f"<text x='{x:g}' y='{y:g}' font-size='{size}' text-anchor='{anchor}' "
        f"font-weight='{weight}' fill='{fill}'>{escape(text)}</text>"
    )


def _box(
    x: float,
    y: float,
    w: float,
    h: float,
    *,
    fill: str = "white",
    stroke: str = INK,
    radius: int = 4,
) -> str:
    return (
        f"<rect x='{x:g}' y='{y:g}' width='{w:g}' height='{h:g}' rx='{radius}' "
        f"fill='{fill}' stroke='{stroke}' stroke-width='1.2'/>"
    )


def _arrow(x1: float, y1: float, x2: float, y2: float, *, dashed: bool = False) -> str:
    dash = " stroke-dasharray='5,4'" if dashed else ""
    return (
        f"<line x1='{x1:g}' y1='{y1:g}' x2='{x2:g}' y2='{y2:g}' stroke='{INK}' "
        f"stroke-width='1.3' marker-end='url(#arrow)'{dash}/>"
    )


def wheel_svg(buckets: int = 8) -> str:
    """Three levels of a wheel (``buckets`` drawn per level), entries and the heap."""
    width, height = 900, 430
    left, cell, row_h = 170, 62, 54
    parts = [
        _text(
            20,
            30,
            "A hierarchical timing wheel: wheel_size buckets per level",
            size=16,
            weight="bold",
        ),
    ]
    # Entries per (level, bucket): where operations sit in this made-up moment.
    entries = {(0, 1): 3, (0, 2): 1, (0, 5): 2, (1, 1): 4, (1, 3): 2, (2, 1): 1}
    spans = ["tick", "tick·wheel_size", "tick·wheel_size²"]
    for level in range(3):
        y = 70 + level * (row_h + 40)
        parts.append(_text(20, y + 22, f"level {level}", size=14, weight="bold"))
        parts.append(_text(20, y + 40, f"bucket = {spans[level]}", size=11, fill=MUTED))
        for b in range(buckets):
            x = left + b * cell
            count = entries.get((level, b), 0)
            fill = LIGHT if count else "white"
            parts.append(_box(x, y, cell - 6, row_h, fill=fill, stroke=ACCENT if count else MUTED))
            for i in range(count):
                cx = x + 12 + (i % 4) * 11
                cy = y + 20 + (i // 4) * 14
                parts.append(f"<circle cx='{cx}' cy='{cy}' r='4' fill='{ACCENT}'/>")
            if count:
                parts.append(
                    _text(
                        x + (cell - 6) / 2, y + row_h - 8, f"{count} ops", size=10, anchor="middle"
                    )
                )
        parts.append(_text(left + buckets * cell + 4, y + 32, "…", size=18))
    # "now" cursor on level 0.
    now_x = left + cell - 3
    parts.append(
        f"<line x1='{now_x}' y1='58' x2='{now_x}' y2='{70 + 3 * (row_h + 40) - 40}' "
        f"stroke='#d81b60' stroke-width='2' stroke-dasharray='3,3'/>"
    )
    parts.append(_text(now_x, 54, "now", size=12, anchor="middle", fill="#d81b60"))
    # A cascade: the level-1 bucket at 1 moves down into level 0 when it comes due.
    y1 = 70 + (row_h + 40)
    parts.append(_arrow(left + cell + 20, y1, left + 3 * cell + 20, 70 + row_h + 2, dashed=True))
    parts.append(
        _text(
            left + 2 * cell + 40,
            y1 - 14,
            "cascade: re-inserted one level down",
            size=11,
            fill=ACCENT,
        )
    )
    # The heap of bucket expirations.
    hx = left + buckets * cell + 40
    parts.append(_box(hx, 70, 150, 230, fill=WARN))
    parts.append(_text(hx + 75, 92, "heap of buckets", size=13, anchor="middle", weight="bold"))
    parts.append(_text(hx + 75, 110, "one item per non-empty", size=11, anchor="middle"))
    parts.append(_text(hx + 75, 124, "bucket, keyed by its tick", size=11, anchor="middle"))
    for i, label in enumerate(["L0 b1 (next)", "L0 b2", "L1 b1", "L0 b5", "L1 b3", "L2 b1"]):
        parts.append(_text(hx + 20, 150 + i * 22, f"{i + 1}. {label}", size=12))
    parts.append(_text(hx, 330, "one alarm armed at the top", size=12, fill="#d81b60"))
    parts.append(
        _text(
            20,
            400,
            "insert / cancel: O(1) (an intrusive list per bucket);"
            " the heap holds buckets, never operations",
            size=12,
            fill=MUTED,
        )
    )
    return _svg(width, height, "Levels, buckets and the heap of a timing wheel", parts)


def lifecycle_svg() -> str:
    """An operation from registration to its one outcome."""
    width, height = 900, 470
    parts = [_text(20, 30, "The life of a delayed operation", size=16, weight="bold")]

    def node(x: float, y: float, w: float, label: str, sub: str = "", fill: str = "white") -> None:
        parts.append(_box(x, y, w, 50 if sub else 38, fill=fill))
        parts.append(_text(x + w / 2, y + 23, label, size=13, anchor="middle", weight="bold"))
        if sub:
            parts.append(_text(x + w / 2, y + 40, sub, size=11, anchor="middle", fill=MUTED))

    node(20, 60, 210, "op = Operation(timeout)", "created, not watched")
    node(300, 60, 300, "try_complete_else_watch(op, keys)", "calls op.try_complete() once")
    parts.append(_arrow(230, 85, 298, 85))
    node(300, 170, 300, "pending", "in the timer + a watcher list per key", fill=LIGHT)
    parts.append(_arrow(450, 110, 450, 168))
    parts.append(_text(458, 145, "False: not done yet", size=11))
    node(660, 60, 220, "completed at once", "force_complete() won", fill=DONE)
    parts.append(_arrow(600, 85, 658, 85))
    parts.append(_text(612, 78, "True", size=11))
    # The four ways out of pending.
    outs = [
        (
            20,
            "COMPLETED",
            "notify(key) → try_complete()",
            "→ force_complete() → on_complete()",
            DONE,
        ),
        (245, "EXPIRED", "deadline → expired = True", "→ on_complete() → on_expiration()", WARN),
        (
            470,
            "CANCELLED",
            "op.cancel(), cancel_for_key(),",
            "or the awaiting task cancelled",
            "#eceff1",
        ),
        (
            695,
            "PurgatoryClosed",
            "close(): neither hook runs",
            "(expire_pending=True: EXPIRED)",
            "#eceff1",
        ),
    ]
    for x, label, line1, line2, fill in outs:
        parts.append(_arrow(450, 222, x + 92, 318))
        parts.append(_box(x, 320, 185, 78, fill=fill))
        parts.append(_text(x + 92, 343, label, size=13, anchor="middle", weight="bold"))
        parts.append(_text(x + 92, 363, line1, size=10.5, anchor="middle"))
        parts.append(_text(x + 92, 380, line2, size=10.5, anchor="middle"))
    parts.append(
        _text(
            20,
            430,
            "Exactly one path wins: force_complete() returns True once; the winner "
            "leaves the timer and every watcher list",
            size=12,
        )
    )
    parts.append(
        _text(
            20,
            450,
            "before any awaiter resumes. A loser's force_complete() returns False "
            "and changes nothing.",
            size=12,
        )
    )
    return _svg(width, height, "The life of a delayed operation", parts)


DIAGRAMS: Final = {"wheel.svg": wheel_svg, "lifecycle.svg": lifecycle_svg}
"""File name -> function drawing it."""


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in DIAGRAMS.items():
        (out / name).write_text(draw(), encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
