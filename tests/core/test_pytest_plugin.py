"""The pytest plugin: its fixtures under pytest-asyncio (strict, auto) and anyio.

Each test writes a small test module and runs pytest on it in-process (``pytester``),
so the plugin is loaded the way users get it: from the ``pytest11`` entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# In-process runs import nothing anew, so pytest cannot rewrite the asserts of the
# plugin's package (it says so with a warning).
QUIET = ("-W", "ignore::pytest.PytestAssertRewriteWarning")
ARGS = ("-p", "no:cacheprovider", "-q", "-o", "asyncio_default_fixture_loop_scope=function")

FRESH_PER_TEST = """
    import asyncio
    import aiopurgatory as ap

    SEEN = []

    {mark}
    async def test_first(purgatory):
        assert isinstance(purgatory, ap.Purgatory)
        assert purgatory.name == "test_first"
        assert not await purgatory.wait_for(["k"], lambda: False, 0.01)
        assert purgatory.loop is asyncio.get_running_loop()
        SEEN.append(purgatory)

    {mark}
    async def test_second(purgatory):
        assert SEEN and SEEN[0] is not purgatory
        assert SEEN[0].closed  # the first test's purgatory was closed after it
        assert not purgatory.closed
        purgatory.notify("k")
        assert purgatory.loop is asyncio.get_running_loop()

    def test_third_checks_the_second_closed_too():
        pass
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(textwrap.dedent(source))
    return pytester.runpytest_inprocess(*ARGS, *args, *QUIET)


def run_marked(pytester: pytest.Pytester, source: str, mark: str, *args: str) -> pytest.RunResult:
    """``run`` of ``source`` with its ``{mark}`` filled in; an anyio mark gets the
    asyncio backend."""
    header = "import pytest\n"
    if "anyio" in mark:
        header += "@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'\n"
    return run(pytester, header + textwrap.dedent(source).format(mark=mark), *args)


@pytest.mark.parametrize(
    ("mark", "args"),
    [
        pytest.param("@pytest.mark.asyncio", ("-o", "asyncio_mode=strict"), id="asyncio-strict"),
        pytest.param("", ("-o", "asyncio_mode=auto"), id="asyncio-auto"),
        # pytest-asyncio stays loaded (strict mode leaves anyio's tests alone).
        pytest.param("@pytest.mark.anyio", (), id="anyio"),
    ],
)
def test_purgatory_fixture_is_fresh_per_test_and_closed_after(
    pytester: pytest.Pytester, mark: str, args: tuple[str, ...]
) -> None:
    result = run_marked(pytester, FRESH_PER_TEST, mark, *args)
    result.assert_outcomes(passed=3)


CHECKED = """
    import asyncio
    import pytest

    {mark}
    @pytest.mark.asyncio
    async def test_leaves_one_pending(purgatory):
        purgatory.call_later(60, print)
        asyncio.ensure_future(purgatory.wait_for(["k"], lambda: False, None))
        await asyncio.sleep(0)

    {mark}
    @pytest.mark.asyncio
    async def test_leaves_nothing(purgatory):
        purgatory.call_later(60, print).cancel()
        assert await purgatory.wait_for(["k"], lambda: True, 1)

    {mark}
    @pytest.mark.asyncio
    async def test_fails_on_its_own(purgatory):
        purgatory.call_later(60, print)
        assert False, "its own failure"
"""


def test_check_pending_marker_fails_a_test_that_leaves_work_pending(
    pytester: pytest.Pytester,
) -> None:
    mark = "@pytest.mark.purgatory(check_pending=True, name='checked')"
    result = run(pytester, CHECKED.format(mark=mark))
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*purgatory 'checked' was left with 1 operation(s) pending and 1 entry on its wheel*",
            "*its own failure*",
        ]
    )
    # The test's own failure is the one reported, not the pending check.
    assert "was left with" not in "\n".join(
        line for line in result.outlines if "test_fails_on_its_own" in line
    )


def test_check_pending_ini_option_applies_to_every_test(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npurgatory_check_pending = true\n")
    result = run(pytester, CHECKED.format(mark=""))
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*'test_leaves_one_pending' was left with 1 operation(s)*"])


def test_without_the_check_pending_work_is_closed_quietly(pytester: pytest.Pytester) -> None:
    result = run(pytester, CHECKED.format(mark=""), "-W", "error")
    result.assert_outcomes(passed=2, failed=1)


FEATURES = """
    import asyncio
    import time

    import pytest

    import aiopurgatory as ap

    SHARED = ap.Purgatory("shared")


    @pytest.mark.asyncio
    async def test_manual_clock(purgatory, manual_clock):
        # The purgatory runs on the manual clock when the test asks for one.
        waiting = asyncio.ensure_future(purgatory.wait_for(["k"], lambda: False, 30))
        await manual_clock.advance(29.999)
        assert not waiting.done()
        await manual_clock.advance(0.001)
        assert waiting.done() and waiting.result() is False
        assert manual_clock.time() == 30.0


    @pytest.mark.purgatory(max_pending=1, tick=0.01)
    @pytest.mark.asyncio
    async def test_marker_options(purgatory):
        purgatory.try_complete_else_watch(ap.PredicateOperation(lambda: False, 1), ["k"])
        with pytest.raises(ap.PurgatoryFull):
            purgatory.try_complete_else_watch(ap.PredicateOperation(lambda: False, 1), ["k"])


    @pytest.mark.asyncio
    @pytest.mark.looptime
    async def test_looptime(purgatory):
        # What the README recommends for code that also uses asyncio.sleep or
        # asyncio.timeout: the purgatory on the loop's clock, made virtual by looptime.
        loop = asyncio.get_running_loop()
        start, real = loop.time(), time.monotonic()
        waiting = asyncio.ensure_future(purgatory.wait_for(["k"], lambda: False, 30))
        await asyncio.sleep(29)
        assert not waiting.done()
        async with asyncio.timeout(5):
            assert await waiting is False
        assert 30 <= loop.time() - start < 30.1
        async with purgatory.timeout(3600):
            await asyncio.sleep(3599)
        assert time.monotonic() - real < 5  # an hour of loop time, in no time


    @pytest.mark.asyncio
    async def test_module_level_one():
        assert not await SHARED.wait_for(["k"], lambda: False, 0.001)


    @pytest.mark.asyncio
    async def test_module_level_two():
        await SHARED.wait_for(["k"], lambda: False, 0.001)
"""


def test_manual_clock_marker_options_looptime_and_a_module_level_purgatory(
    pytester: pytest.Pytester,
) -> None:
    result = run(pytester, FEATURES)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        [
            "FAILED*test_module_level_two*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*purgatory 'shared' is used from another event loop, but it is*bound to the"
            " event loop it was first used on (now closed)*create it inside that loop*"
            "`purgatory` fixture*not at module level*"
        ]
    )


LOOPTIME_ONLY = """
    import asyncio

    import pytest


    @pytest.mark.asyncio
    @pytest.mark.looptime
    async def test_an_hour(purgatory):
        async with asyncio.timeout(2):  # without looptime, what stops the real hour
            await asyncio.sleep(3600)
"""


def test_a_looptime_test_without_looptime_fails_at_once(pytester: pytest.Pytester) -> None:
    # looptime is installed here: disabling its plugin is what a machine without it sees.
    started = time.monotonic()
    result = run(pytester, LOOPTIME_ONLY, "-p", "no:looptime_plugin", "-W", "ignore")
    result.assert_outcomes(errors=1)  # at set-up: the test body never starts
    result.stdout.fnmatch_lines(["*looptime needs the looptime plugin*real time*"])
    assert time.monotonic() - started < 30  # not the hour


def test_readme_examples_pass(pytester: pytest.Pytester) -> None:
    # The testing guide's pytest section (it was the README's): its two test modules.
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md").read_text()
    section = guide[guide.index("## The pytest plugin") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 2
    for i, block in enumerate(blocks):
        pytester.makepyfile(**{f"test_readme_{i}": block})
    result = pytester.runpytest_inprocess(*ARGS, *QUIET)
    result.assert_outcomes(passed=3)


PARKING = """
    import asyncio

    import pytest

    from aiopurgatory.testing import parked


    def handler(purgatory):
        async def handle():
            for _ in range(5):  # hops through framework code before it waits
                await asyncio.sleep(0)
            return await purgatory.wait_for(["topic"], lambda: False, 30)

        return handle()


    {mark}
    async def test_advance_lets_the_handler_park_first(purgatory, manual_clock):
        poll = asyncio.ensure_future(handler(purgatory))
        await manual_clock.advance(30)
        assert poll.done() and poll.result() is False


    {mark}
    async def test_parked(purgatory, manual_clock):
        polls = [asyncio.ensure_future(handler(purgatory)) for _ in range(3)]
        await parked(purgatory, 3)
        await manual_clock.advance(29.999)
        assert not any(poll.done() for poll in polls)
        await manual_clock.advance(0.001)
        assert [poll.result() for poll in polls] == [False] * 3
"""


@pytest.mark.parametrize(
    ("mark", "args"),
    [
        pytest.param("@pytest.mark.asyncio", ("-o", "asyncio_mode=strict"), id="asyncio-strict"),
        pytest.param("@pytest.mark.anyio", (), id="anyio"),
    ],
)
def test_manual_clock_advance_waits_for_code_started_before_it_to_park(
    pytester: pytest.Pytester, mark: str, args: tuple[str, ...]
) -> None:
    """Issue 30 item 3: ensure_future(request) then advance(30) used to move time
    before the handler parked, so its wait was registered at t = 30 and never fired."""
    result = run_marked(pytester, PARKING, mark, *args)
    result.assert_outcomes(passed=2)


DEPRECATIONS = """
    import asyncio
    import signal

    import pytest
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from aiopurgatory.asgi import CancelOnDisconnect, PurgatoryLifespan

    lifespan = PurgatoryLifespan("poll", close_on_signals=True)


    async def poll(request):
        ready = await request.state.purgatory.wait_for(["k"], lambda: False, 0.01)
        return PlainTextResponse(str(ready))


    app = CancelOnDisconnect(Starlette(routes=[Route("/poll", poll)], lifespan=lifespan))


    @pytest.mark.asyncio
    async def test_fixtures(purgatory, manual_clock):
        waiting = asyncio.ensure_future(purgatory.wait_for(["k"], lambda: False, 30))
        await manual_clock.advance(30)
        assert waiting.result() is False
        sleeping = asyncio.ensure_future(purgatory.sleep(0.5, "slept"))
        async with purgatory.timeout(1):
            await manual_clock.advance(0.5)
        assert await sleeping == "slept"


    @pytest.mark.anyio
    async def test_fixture_on_anyio(purgatory):
        assert not await purgatory.wait_for(["k"], lambda: False, 0.001)


    @pytest.fixture
    def anyio_backend():
        return "asyncio"


    def test_lifespan_in_a_thread():
        with TestClient(app) as client:  # no signal handlers off the main thread
            assert client.get("/poll").text == "False"


    @pytest.mark.asyncio
    async def test_lifespan_in_the_main_thread_with_its_signal_handlers():
        before = signal.getsignal(signal.SIGTERM)
        inbox, sent = asyncio.Queue(), []

        async def send(message):
            sent.append(message["type"])

        inbox.put_nowait({"type": "lifespan.startup"})
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        server = asyncio.ensure_future(app(scope, inbox.get, send))
        while not sent:
            await asyncio.sleep(0)
        assert sent == ["lifespan.startup.complete"]
        assert signal.getsignal(signal.SIGTERM) is not before
        inbox.put_nowait({"type": "lifespan.shutdown"})
        await server
        assert sent[-1] == "lifespan.shutdown.complete"
        assert signal.getsignal(signal.SIGTERM) is before
"""


def test_the_plugin_fixtures_and_asgi_lifespan_warn_of_no_deprecation(
    pytester: pytest.Pytester,
) -> None:
    # Each version deprecates some of asyncio (3.12 get_event_loop() without a loop and
    # the child watchers, 3.14 the event loop policies): make test runs this on every
    # supported interpreter, and none of it may warn.
    result = run(
        pytester,
        DEPRECATIONS,
        "-o", "asyncio_mode=strict",
        "-W", "error::DeprecationWarning",
        "-W", "error::PendingDeprecationWarning",
    )  # fmt: skip
    result.assert_outcomes(passed=4)


ROOT = Path(__file__).resolve().parents[2]


def test_the_purgatory_plugin_imports_nothing_of_the_kafka_package() -> None:
    # The Kafka fixtures are a plugin of their own (aiopurgatory.kafka.pytest_plugin):
    # the generic one must load where only the purgatory is wanted.
    code = (
        "import sys, aiopurgatory.pytest_plugin;"
        " print(sorted(m for m in sys.modules if m.startswith('aiopurgatory.kafka')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_the_two_plugins_are_two_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {
        "aiopurgatory": "aiopurgatory.pytest_plugin",
        "aiopurgatory_kafka": "aiopurgatory.kafka.pytest_plugin",
    }
