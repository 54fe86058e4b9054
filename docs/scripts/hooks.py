"""MkDocs hooks (``hooks:`` in mkdocs.yml): what the site draws and mounts at build time.

* ``img/wheel.svg`` and ``img/lifecycle.svg``: the concept diagrams (``diagrams.py``);
* ``img/structure.svg`` and the table that replaces the ``<!-- structure-table -->``
  marker: the package's rooms, floors and imports, read from the sources
  (``structure.py``), so the architecture page cannot drift from the code;
* ``img/bench-rate.svg``, ``img/bench-lateness.svg`` and the tables that replace the
  ``<!-- bench-tables -->`` marker: from the committed ``bench/*.json``
  (``bench_figures.py``), so a new bench run redraws the Performance page;
* the examples' READMEs as pages under ``examples/NAME/`` with their sources beside
  them, and ``bench/RESULTS.md`` with the committed records, so that the guides link
  to what is in the repository and a broken link fails the strict build.

Nothing is written into ``docs/``: generated files live only in the build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parents[1]
sys.path.insert(0, str(HERE))

import bench_figures  # noqa: E402
import diagrams  # noqa: E402
import structure  # noqa: E402

BENCH_MARKER: Final = "<!-- bench-tables -->"
STRUCTURE_MARKER: Final = "<!-- structure-table -->"
MOUNTED_SUFFIXES: Final = {".md", ".py", ".txt", ".toml", ".json", ".yaml", ".yml"}


def _mounted(folder: str) -> list[Path]:
    """Files of a repository folder the site carries (sources and READMEs)."""
    return sorted(
        path
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
        and path.suffix in MOUNTED_SUFFIXES
        and "__pycache__" not in path.parts
        and not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
    )


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    for name, draw in diagrams.DIAGRAMS.items():
        files.append(File.generated(config, f"img/{name}", content=draw()))
    files.append(File.generated(config, "img/structure.svg", content=structure.structure_svg()))
    for name, data in bench_figures.figures().items():
        files.append(File.generated(config, f"img/{name}", content=data))
    for path in _mounted("examples"):
        uri = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    for path in _mounted("bench"):
        if path.suffix in {".md", ".json"}:  # the study and the records the pages cite
            uri = path.relative_to(ROOT).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    if BENCH_MARKER in markdown:
        tables = bench_figures.tables_markdown(bench_figures.record_files())
        markdown = markdown.replace(BENCH_MARKER, tables)
    if STRUCTURE_MARKER in markdown:
        table = structure.table_markdown(structure.rooms())
        markdown = markdown.replace(STRUCTURE_MARKER, table)
    return markdown
