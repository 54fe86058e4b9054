"""The ```python blocks of a Markdown document, with their markers: test support for the
tests that run the documents (tests/docs/test_readme.py) and the files a guide has the
reader save (tests/loop/test_loop_servers.py).

A block marked ``<!-- not run: why -->`` on the line before its fence is a fragment;
one marked ``<!-- file: NAME -->`` is a file the reader saves as NAME.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.+?)\s*-->")
FILE = re.compile(r"<!--\s*file:\s*(?P<name>[\w.]+\.py)\s*-->")
FENCE = re.compile(r"^```python[^\n]*\n(?P<code>.*?)^```$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    not_run: str | None  # why, when marked
    file: str | None = None  # the file name the reader saves it as, when marked

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before.strip())
        saved = FILE.fullmatch(before.strip())
        blocks.append(
            Block(
                path,
                line,
                match["code"],
                marker["why"] if marker else None,
                saved["name"] if saved else None,
            )
        )
    return blocks
