"""The two builds: compiled hot path (Cython) and the pure-Python fallback.

``make test`` runs the suite once with ``AIOPURGATORY_EXPECT_COMPILED=1`` (the
compiled build must be the one loaded) and once with ``AIOPURGATORY_NO_EXTENSIONS=1``
(the ``.py`` modules must be). The user-facing contract of ``DelayedOperation`` is
checked here on whichever build is loaded.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import time
import weakref
import zipfile
from pathlib import Path

import pytest

import aiopurgatory as ap
from aiopurgatory import _build
from aiopurgatory.testing import ManualClock

from ..support.servers import ROOT
from ..support.wheels import copy_source, env_with, pip_wheel

pytestmark = pytest.mark.anyio

EXPECT_COMPILED = os.environ.get("AIOPURGATORY_EXPECT_COMPILED") == "1"
FORCED_PURE = _build.NO_EXTENSIONS


def _loaded_files() -> dict[str, str]:
    return {name: str(sys.modules[f"aiopurgatory.{name}"].__file__) for name in _build.HOT_PATH}


def _is_extension(name: str) -> bool:
    spec = sys.modules[f"aiopurgatory.{name}"].__spec__
    assert spec is not None
    return isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


def _run(code: str, *, env: dict[str, str], cwd: Path | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


_REPORT = (
    "import json, sys, aiopurgatory;"
    "from aiopurgatory import _build;"
    "print(json.dumps({'compiled': aiopurgatory.COMPILED, 'files': "
    "{n: sys.modules['aiopurgatory.' + n].__file__ for n in _build.HOT_PATH},"
    " 'extensions': sorted(n for n, m in sys.modules.items() if n.startswith('aiopurgatory')"
    " and not str(getattr(m, '__file__', '') or '').endswith('.py'))}))"
)


# -- which build is loaded --------------------------------------------------------


def test_compiled_flag_matches_the_loaded_modules() -> None:
    loaded = all(_is_extension(name) for name in _build.HOT_PATH)
    assert ap.COMPILED is loaded


@pytest.mark.skipif(not EXPECT_COMPILED, reason="AIOPURGATORY_EXPECT_COMPILED=1 not set")
def test_the_build_meant_to_be_compiled_is() -> None:
    assert not FORCED_PURE, "AIOPURGATORY_EXPECT_COMPILED=1 with AIOPURGATORY_NO_EXTENSIONS set"
    assert ap.COMPILED, f"expected the compiled build, loaded {_loaded_files()}"
    for name in _build.HOT_PATH:
        assert _is_extension(name), name


@pytest.mark.skipif(not FORCED_PURE, reason="AIOPURGATORY_NO_EXTENSIONS not set")
def test_the_forced_fallback_is_loaded_here() -> None:
    assert not ap.COMPILED
    for name, file in _loaded_files().items():
        assert file.endswith(f"{name}.py"), file


def test_forced_fallback_loads_no_extension_module() -> None:
    report = json.loads(_run(_REPORT, env=env_with(AIOPURGATORY_NO_EXTENSIONS="1")))
    assert report["compiled"] is False
    assert report["extensions"] == []
    for name, file in report["files"].items():
        assert file.endswith(f"{name}.py"), file


def test_an_empty_variable_does_not_force_the_fallback() -> None:
    report = json.loads(_run(_REPORT, env=env_with(AIOPURGATORY_NO_EXTENSIONS="")))
    built = all(
        any(
            (ROOT / "aiopurgatory" / f"{name}{suffix}").is_file()
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
        )
        for name in _build.HOT_PATH
    )
    assert report["compiled"] is built
    if EXPECT_COMPILED:
        assert report["compiled"] is True
        assert report["extensions"] == sorted(f"aiopurgatory.{n}" for n in _build.HOT_PATH)


@pytest.mark.parametrize("forced", [False, True])
def test_version_says_which_build_is_loaded(forced: bool) -> None:
    env = env_with(AIOPURGATORY_NO_EXTENSIONS="1" if forced else None)
    result = subprocess.run(
        [sys.executable, "-m", "aiopurgatory", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == f"aiopurgatory {ap.__version__}"
    if forced:
        assert lines[1] == "pure Python"
    elif EXPECT_COMPILED:
        assert lines[1] == "compiled (Cython)"
    else:
        assert lines[1] in {"pure Python", "compiled (Cython)"}


def test_setup_compiles_the_hot_path_and_ships_its_declarations() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "HOT_PATH" for t in node.targets)
    )
    assert tuple(listed) == _build.HOT_PATH
    for name in ("wheel", "timer", "operation", "purgatory", "timeouts"):
        assert (ROOT / "aiopurgatory" / f"{name}.pxd").is_file()


# -- what users rely on, on whichever build is loaded --------------------------------


class Counter(ap.DelayedOperation[int]):
    __slots__ = ("calls", "ready")

    def __init__(self, timeout: float | None) -> None:
        super().__init__(timeout)
        self.ready = False
        self.calls = 0

    def try_complete(self) -> bool:
        self.calls += 1
        return self.ready and self.force_complete()

    def on_complete(self) -> int:
        return -1 if self.expired else self.calls


class Doubled(Counter):
    __slots__ = ()

    def on_complete(self) -> int:
        return 2 * super().on_complete()


def test_python_subclasses_keep_slots_isinstance_and_generics() -> None:
    op = Doubled(None)
    assert isinstance(op, ap.DelayedOperation)
    assert isinstance(op, Counter)
    assert issubclass(Doubled, ap.DelayedOperation)
    with pytest.raises(AttributeError):
        op.undeclared = 1  # type: ignore[attr-defined]
    alias = ap.DelayedOperation[int]
    assert alias.__origin__ is ap.DelayedOperation  # type: ignore[attr-defined]
    assert alias.__args__ == (int,)  # type: ignore[attr-defined]
    assert ap.DelayedOperation in Counter.__mro__
    assert op.kind == "Doubled"


class Referable(Counter):
    __slots__ = ("__weakref__",)  # as for any slotted class


class Unslotted(Counter):  # a __dict__, and weak references
    pass


@pytest.mark.parametrize("cls", [Referable, Unslotted])
def test_weak_references_to_subclass_instances(cls: type[Counter]) -> None:
    op = cls(None)
    ref = weakref.ref(op)
    assert ref() is op
    registry: weakref.WeakValueDictionary[int, Counter] = weakref.WeakValueDictionary({1: op})
    assert registry[1] is op
    del op
    gc.collect()
    assert ref() is None
    assert not registry


def test_an_operation_without_hooks_fails_when_checked() -> None:
    class Bare(ap.DelayedOperation[None]):
        __slots__ = ()

    op = Bare(None)  # type: ignore[abstract]  # abstract for mypy only
    with pytest.raises(NotImplementedError):
        op.try_complete()
    assert op._check()  # the exception completes the operation with it
    with pytest.raises(NotImplementedError):
        op.result()


def test_hooks_overridden_in_python_are_the_ones_called() -> None:
    op = Doubled(None)
    op.ready = True
    assert not op.done()
    assert op._check()
    assert op.result() == 2


async def test_awaiting_shield_wait_for_and_task_group() -> None:
    async with ap.Purgatory("build") as p:

        def complete(op: Counter, key: object) -> None:
            op.ready = True
            p.check_and_complete(key)

        op = p.try_complete_else_watch(Doubled(None), ["k"])
        asyncio.get_running_loop().call_soon(complete, op, "k")
        # One check at registration, one on the event: on_complete doubles 2.
        assert await asyncio.wait_for(asyncio.shield(op), 5) == 4
        assert await asyncio.ensure_future(op) == 4

        shielded = p.try_complete_else_watch(Counter(None), ["s"])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(shielded), 0.01)
        assert not shielded.done()  # the shield kept it pending
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(shielded, 0.01)
        assert shielded.cancelled()  # wait_for cancelled it, and it left the purgatory
        assert p.num_delayed() == 0

        ops = [p.try_complete_else_watch(Counter(None), [i]) for i in range(3)]
        results: list[int] = []

        async def wait(op: Counter) -> None:
            results.append(await op)

        async with asyncio.TaskGroup() as group:
            for each in ops:
                group.create_task(wait(each))
            await asyncio.sleep(0)
            for i, each in enumerate(ops):
                complete(each, i)
        assert results == [2, 2, 2]


async def test_timeouts_fire_through_the_compiled_timer() -> None:
    clock = ManualClock()
    async with ap.Purgatory("timeouts", clock=clock) as p:
        op = p.try_complete_else_watch(Counter(0.5), ["k"])
        await clock.advance(0.4)
        assert not op.done()
        await clock.advance(0.2)
        assert op.expired
        assert await op == -1


def test_purgatory_subclasses_work() -> None:
    class Named(ap.Purgatory):
        def describe(self) -> str:
            return f"purgatory {self.name}"

    assert Named("x").describe() == "purgatory x"
    assert isinstance(Named("y"), ap.Purgatory)


def test_a_typed_argument_of_none_raises_instead_of_crashing() -> None:
    async def main() -> None:
        async with ap.Purgatory("none") as p:
            with pytest.raises((AttributeError, TypeError)):
                p.try_complete_else_watch(None, ["k"])  # type: ignore[type-var]

    asyncio.run(main())


# -- the packages pip builds ----------------------------------------------------------

needs_tools = pytest.mark.skipif(
    FORCED_PURE or (shutil.which("cc") is None and shutil.which("gcc") is None),
    reason="builds the compiled wheel (skipped in the forced-fallback run)",
)


def _unpack(wheel: Path, into: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(into)
        return archive.namelist()


@pytest.mark.slow
@needs_tools
def test_the_wheel_carries_and_imports_its_extensions(tmp_path: Path) -> None:
    source = copy_source(tmp_path / "src")
    # gcc without optimization: what this test asserts (the wheel carries extension
    # modules that load) does not depend on it, and it builds in 19 s instead of 77
    # (one run here); nor on debug information (-g0: gcc's time down by a sixth more).
    # `make build` compiles the checkout as users get it (-O2 or -O3).
    env = env_with(AIOPURGATORY_NO_EXTENSIONS=None, CFLAGS="-O0 -g0")
    wheel = pip_wheel(source, tmp_path / "dist", env)
    assert "-none-any" not in wheel.name, wheel.name  # a platform wheel
    names = _unpack(wheel, tmp_path / "site")
    for name in _build.HOT_PATH:
        assert any(n.startswith(f"aiopurgatory/{name}.") and n.endswith(".so") for n in names)
    for name in ("wheel", "timer", "operation", "purgatory", "timeouts"):
        assert f"aiopurgatory/{name}.pxd" in names
    assert "aiopurgatory/py.typed" in names
    assert not any(n.endswith(".c") for n in names)

    site = str(tmp_path / "site")
    compiled = json.loads(
        _run(_REPORT, env=env_with(PYTHONPATH=site, AIOPURGATORY_NO_EXTENSIONS=None), cwd=tmp_path)
    )
    assert compiled["compiled"] is True
    assert all(file.startswith(site) for file in compiled["files"].values())
    forced = json.loads(
        _run(_REPORT, env=env_with(PYTHONPATH=site, AIOPURGATORY_NO_EXTENSIONS="1"), cwd=tmp_path)
    )
    assert forced["compiled"] is False
    assert forced["extensions"] == []
    assert all(file.startswith(site) and file.endswith(".py") for file in forced["files"].values())


@pytest.mark.slow
@needs_tools
def test_the_sdist_builds_without_a_compiler_to_pure_python(tmp_path: Path) -> None:
    source = copy_source(tmp_path / "src")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "sdist")],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = (tmp_path / "sdist").glob("aiopurgatory-*.tar.gz")
    no_compiler = env_with(CC="false", LDSHARED="false", AIOPURGATORY_NO_EXTENSIONS=None)
    wheel = pip_wheel(sdist, tmp_path / "dist", no_compiler)
    names = _unpack(wheel, tmp_path / "site")
    assert not any(n.endswith(".so") for n in names)
    assert "aiopurgatory/timer.py" in names
    report = json.loads(
        _run(
            _REPORT,
            env=env_with(PYTHONPATH=str(tmp_path / "site"), AIOPURGATORY_NO_EXTENSIONS=None),
            cwd=tmp_path,
        )
    )
    assert report["compiled"] is False
    assert report["extensions"] == []


# -- an extra not installed ---------------------------------------------------------

_WITHOUT_EXTRA = [
    ("redis", ["redis"], "import aiopurgatory.redis"),
    ("metrics", ["prometheus_client"], "import aiopurgatory.metrics"),
    ("trace", ["pyarrow"], "from aiopurgatory.trace import TraceRecorder; TraceRecorder('t')"),
    (
        "analysis",
        ["pyspark", "pyarrow", "pandas", "numpy", "matplotlib", "tqdm"],
        "from aiopurgatory.analysis import analyze",
    ),
    ("kafka", ["kio"], "from aiopurgatory.kafka import KafkaBroker"),
]


@pytest.mark.parametrize(("extra", "hidden", "code"), _WITHOUT_EXTRA, ids=lambda v: str(v)[:9])
def test_each_extra_missing_says_the_same_one_line_hint(
    extra: str, hidden: list[str], code: str, tmp_path: Path
) -> None:
    """Without an extra's modules (``sys.modules[name] = None``, as if not installed),
    using what needs it ends on one line naming the extra and the command (issue 49,
    item 7: redis and metrics gave a bare ModuleNotFoundError)."""
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in hidden)
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; {hide}{code}"],
        cwd=tmp_path,
        env=env_with(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result
    last = result.stderr.strip().splitlines()[-1]
    hint = rf"needs the '{extra}' extra \([\w, ]+\): pip install 'aiopurgatory\[{extra}\]'"
    assert re.fullmatch(rf"(ModuleNotFound|Import)Error: .+ {hint}", last), last


# -- the install page's wheel, built once ---------------------------------------------


@pytest.mark.slow
def test_the_documented_wheel_is_built_once_and_installed_with_each_extra(
    tmp_path: Path,
) -> None:
    """docs/getting-started.md's three lines (build the wheel, install it with an extra,
    then with another) run in a fresh venv: the second install compiles nothing and
    both extras import (issue 49, item 10: each '.[extra]' install recompiled)."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", page, flags=re.DOTALL)
    (block,) = [b for b in blocks if "pip wheel" in b]
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    lines = [line for line in lines if line]
    assert len(lines) == 3, lines
    assert lines[0].startswith("pip wheel"), lines
    source = copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    # Without pip of its own: this environment's pip installs into it (`pip --python`),
    # as tests/support/wheels.py does; putting pip into the venv cost 5 CPU-s (issue 46).
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    into_venv = f"{sys.executable} -m pip --python {venv / 'bin' / 'python'} "
    # The build tools of this environment (setuptools, Cython): no download for them.
    # The pure build: the same commands, a minute less of compiling on 2 cores (the
    # compiled wheel is test_the_wheel_carries_and_imports_its_extensions' business).
    build = lines[0].replace("pip wheel", "pip wheel --no-build-isolation", 1)
    took = []
    for line, pip in ((build, f"{sys.executable} -m pip "), (lines[1], into_venv)):
        began = time.perf_counter()
        done = subprocess.run(
            ["bash", "-c", line.replace("pip ", pip, 1)],
            cwd=source,
            env=env_with(AIOPURGATORY_NO_EXTENSIONS="1", PIP_DISABLE_PIP_VERSION_CHECK="1"),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        took.append(time.perf_counter() - began)
    began = time.perf_counter()
    again = subprocess.run(
        ["bash", "-c", lines[2].replace("pip ", into_venv, 1)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    took.append(time.perf_counter() - began)
    assert "Building wheel" not in again.stdout + again.stderr
    checked = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import aiopurgatory.redis, aiopurgatory.metrics"],
        cwd=tmp_path,
        env=env_with(PYTHONPATH=None, AIOPURGATORY_NO_EXTENSIONS=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    print(
        f"\nwheel built in {took[0]:.1f} s; installed with redis {took[1]:.1f} s,"
        f" with metrics {took[2]:.1f} s"
    )
