"""The READMEs and the docs run as printed, show the real signature, cite only what is here.

Every ```python block of README.md, examples/*/README.md and the documentation site's
pages (docs/**/*.md) runs in a subprocess. A
block that cannot run alone (it needs a server, or is a deliberate fragment) must be
marked with an HTML comment on the line before its fence, ``<!-- not run: why -->``,
and is still compiled (top-level ``await`` allowed). A block marked
``<!-- file: NAME -->`` is a file the reader saves: the blocks of one document so
marked are written side by side into a fresh directory, and pytest runs the
``test_*.py`` among them there, as the reader would.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.doc_blocks import Block, python_blocks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_PAGES = sorted(p for p in DOCS.rglob("*.md") if "scripts" not in p.relative_to(DOCS).parts)
DOCUMENTS = [README, *sorted((ROOT / "examples").glob("*/README.md")), *DOC_PAGES]
API_PAGE = DOCS / "api.md"
BLOCKS = [block for path in DOCUMENTS for block in python_blocks(path)]


def test_the_documents_have_python_blocks() -> None:
    assert len([b for b in BLOCKS if b.path == README]) >= 1  # the quickstart
    assert any(b.path.is_relative_to(ROOT / "examples") for b in BLOCKS)
    # The site's pages are found and their blocks run too (the guides have them).
    assert len([b for b in BLOCKS if b.path.is_relative_to(DOCS)]) >= 10
    assert (DOCS / "guides" / "testing.md") in DOC_PAGES
    # Unterminated or oddly indented fences would hide blocks from the tests.
    for path in DOCUMENTS:
        opened = len(re.findall(r"^```python", path.read_text(), flags=re.MULTILINE))
        assert opened == len(python_blocks(path)), path


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_python_block_compiles(block: Block) -> None:
    compile(block.code, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.not_run is None and b.file is None], ids=lambda b: b.name
)
def test_every_python_block_runs_as_printed(block: Block, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=tmp_path,  # nothing from the checkout's directory is imported by accident
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.name}:\n{done.stderr}"


FILE_DOCUMENTS = sorted({b.path for b in BLOCKS if b.file is not None})


@pytest.mark.parametrize("path", FILE_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_files_a_document_has_you_save_pass_their_tests(path: Path, tmp_path: Path) -> None:
    files = [b for b in BLOCKS if b.path == path and b.file is not None]
    for block in files:
        assert not (tmp_path / str(block.file)).exists(), f"{block.name}: {block.file} twice"
        (tmp_path / str(block.file)).write_text(block.code)
    assert any(str(b.file).startswith("test_") for b in files), f"{path}: files, no test"
    inner = ["-q", "-p", "no:cacheprovider", "--durations=0", "--durations-min=0"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *inner],
        cwd=tmp_path,  # a directory of its own: no conftest or ini of the project applies
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{path}:\n{done.stdout}\n{done.stderr}"
    # The FastAPI guide's tests wait 30 s on virtual time, the Kafka guide's a 45 s
    # session and a day's tombstone on broker time (advance): no phase of a test may take
    # anything like that for real (0.7 s and 3 s here). Each phase, not the session:
    # under CI's load the Kafka guide's session once took 47 s with no phase above 3.1 s.
    phases = re.findall(r"^([0-9.]+)s (setup|call|teardown) +(\S+)", done.stdout, re.MULTILINE)
    assert phases, done.stdout
    slowest = max(phases, key=lambda phase: float(phase[0]))
    assert float(slowest[0]) < 15.0, f"{path}: {slowest}\n{done.stdout}"


def test_quickstart_prints_what_it_says() -> None:
    quickstart = next(b for b in BLOCKS if "class Produce" in b.code and b.path == README)
    done = subprocess.run(
        [sys.executable, "-c", quickstart.code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["OK REQUEST_TIMED_OUT", "0", ""]


def test_the_configuration_shown_is_the_real_signature() -> None:
    text = " ".join(API_PAGE.read_text().split())
    shown = re.search(r"`Purgatory\((name, \*, [^)]*)\)`", text)
    assert shown is not None, "the API page shows Purgatory(name, *, ...)"
    source = ast.parse((ROOT / "aiopurgatory" / "purgatory.py").read_text())
    init = next(
        node
        for cls in source.body
        if isinstance(cls, ast.ClassDef) and cls.name == "Purgatory"
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    defaults = dict(
        zip(
            [a.arg for a in init.args.kwonlyargs],
            [ast.unparse(d) if d is not None else None for d in init.args.kw_defaults],
            strict=True,
        )
    )
    real = ", ".join(["name", "*", *(f"{arg}={value}" for arg, value in defaults.items())])
    real = real.replace("=DEFAULT_MAX_WORK_PER_PASS", "=2048")
    assert [a.arg for a in init.args.args] == ["self", "name"]  # the rest keyword-only
    assert shown[1] == real


STALE = [
    r"\bSPEC\b",
    "§",
    r"redesign proposal",
    r"\bproposal\b",
    # Not on PyPI; but an extra's install hint (the broker's missing-kio message names
    # the `kafka` extra as a user of an installed package would type it) stays.
    r"pip install ['\"]?aiopurgatory\b(?!\[)",
]


def _documentation_files() -> list[Path]:
    files = [README, ROOT / "pyproject.toml", ROOT / "Makefile"]
    for folder in ("aiopurgatory", "docs", "examples", "bench"):
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in {".py", ".md", ".pxd", ".txt"} and "__pycache__" not in p.parts
        ]
    return files


def test_no_references_to_documents_that_are_not_in_the_repository() -> None:
    found = []
    for path in _documentation_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # "pip install aiopurgatory" is fine where the README says it is not available.
            if "finds nothing" in line:
                continue
            for pattern in STALE:
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_relative_links_in_the_documents_exist() -> None:
    # The site's own pages link within the site (the examples and bench records are
    # mounted there by docs/scripts/hooks.py): the strict build checks those
    # (tests/docs/test_docs.py). Here: what a reader follows in the repository.
    for path in [p for p in DOCUMENTS if p not in DOC_PAGES]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} -> {target}"


def test_blocks_marked_not_run_are_told_apart(tmp_path: Path) -> None:
    document = tmp_path / "README.md"
    document.write_text(
        "Intro\n\n```python\nprint(1)\n```\n\n<!-- not run: needs a server -->\n"
        "```python\nawait serve()\n```\n\n```python title\nx = 1\n```\n"
    )
    blocks = python_blocks(document)
    assert [(b.line, b.code, b.not_run) for b in blocks] == [
        (3, "print(1)\n", None),
        (8, "await serve()\n", "needs a server"),
        (12, "x = 1\n", None),
    ]
    document.write_text("<!-- file: app.py -->\n```python\napp = 1\n```\n")
    assert [(b.file, b.not_run) for b in python_blocks(document)] == [("app.py", None)]


def test_the_readme_fits_on_two_screens_and_points_into_the_site() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 200, "the README is what a newcomer reads first: move detail to docs/"
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", README.read_text()))
    for page in ["index", "getting-started", "api", "performance", "changelog"]:
        assert f"docs/{page}.md" in linked, page
    assert any(link.startswith("docs/guides/") for link in linked)
