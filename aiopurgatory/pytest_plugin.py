"""aiopurgatory's pytest plugin (registered as the ``pytest11`` entry point ``aiopurgatory``).

pytest loads it wherever aiopurgatory is installed beside it; nothing imports it
otherwise. The Kafka broker's fixtures (``kafka_bootstrap``, ``kafka_broker``...) are a
second plugin, :mod:`aiopurgatory.kafka.pytest_plugin` (entry point
``aiopurgatory_kafka``), so that this one imports nothing of :mod:`aiopurgatory.kafka`.
It offers:

* ``manual_clock``: a fresh :class:`~aiopurgatory.ManualClock` (at 0.0) per test.
  ``await manual_clock.advance(s)`` first lets what the test started (a request in
  ``asyncio.ensure_future``) run until the loop is idle, so its waits are registered
  before time moves; over real sockets, ``await aiopurgatory.testing.parked(purgatory,
  n)`` waits until ``n`` operations are pending. An app whose purgatory its lifespan
  makes (:class:`aiopurgatory.asgi.PurgatoryLifespan`) runs on the test's clock with
  ``lifespan.override(clock=manual_clock)``.
* ``purgatory``: a fresh :class:`~aiopurgatory.Purgatory` per test, named after the
  test. It binds to the test's event loop on first use and is closed after the test.
  If the test also asks for ``manual_clock``, the purgatory runs on that clock.
* the marker ``@pytest.mark.purgatory(check_pending=True, **options)``: the options
  (``name``, ``tick``, ``max_pending``, ``clock``...) go to the ``Purgatory``
  constructor; with ``check_pending=True`` the test fails if it ends (without failing
  otherwise) with operations still pending in the purgatory, or timeouts, sleeps or
  ``call_later`` callbacks still waiting on its wheel. The ini option
  ``purgatory_check_pending = true`` turns that check on for every test.
* a guard for ``@pytest.mark.looptime`` (the testing guide's way to make the loop's
  own time virtual): when the looptime plugin is not loaded, such a test fails at once saying
  so, instead of running its virtual hours in real time.

The fixtures are plain (synchronous) fixtures, so they work the same under
pytest-asyncio (strict or auto mode) and under anyio's plugin: the purgatory binds
lazily to whichever loop the test runs on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from .purgatory import Purgatory
from .testing import ManualClock, pending_report

__all__ = ["manual_clock", "purgatory"]

_PURGATORY = pytest.StashKey[tuple[Purgatory, bool]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "purgatory_check_pending",
        type="bool",
        default=False,
        help="aiopurgatory: fail a test that leaves work pending in its `purgatory` fixture",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "purgatory(check_pending=False, **options): options of the `purgatory` fixture"
        " (Purgatory keyword arguments, and name); check_pending fails a test that"
        " leaves operations or timers pending in it",
    )


LOOPTIME_PLUGINS: Final = ("looptime_plugin", "looptime")
"""Names the looptime plugin registers under (its entry point; an explicit ``-p``)."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Without looptime the marker is only a name: pytest warns of an unknown mark (or,
    # with --strict-markers, refuses it) and a test written for an hour of loop time
    # would sleep for that hour. Fail it before it starts.
    if item.get_closest_marker("looptime") is None:
        return
    manager = item.config.pluginmanager
    if not any(manager.hasplugin(name) for name in LOOPTIME_PLUGINS):
        pytest.fail(
            "@pytest.mark.looptime needs the looptime plugin, which is not loaded"
            " (pip install looptime): without it this test would run in real time",
            pytrace=False,
        )


@pytest.fixture
def manual_clock() -> ManualClock:
    """A :class:`~aiopurgatory.ManualClock` at 0.0; the ``purgatory`` fixture uses it."""
    return ManualClock()


@pytest.fixture
def purgatory(request: pytest.FixtureRequest) -> Iterator[Purgatory]:
    """A fresh purgatory on the test's loop, closed after the test.

    Named after the test. It binds to the loop the test runs on at its first use (so
    it works under pytest-asyncio and anyio alike) and runs on ``manual_clock`` when
    the test asks for that fixture too. ``@pytest.mark.purgatory(**options)`` passes
    ``options`` to :class:`~aiopurgatory.Purgatory` (``name``, ``tick``, ``clock``,
    ``max_pending``...); ``check_pending=True`` there (or the ini option
    ``purgatory_check_pending = true``) fails a test that ends with anything still
    pending (see :func:`aiopurgatory.testing.assert_idle`).

    Raises:
        TypeError: the marker was given positional arguments.
    """
    marker = request.node.get_closest_marker("purgatory")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise TypeError("@pytest.mark.purgatory takes keyword arguments only")
    check = bool(options.pop("check_pending", request.config.getini("purgatory_check_pending")))
    name = str(options.pop("name", request.node.name))
    if "clock" not in options and "manual_clock" in request.fixturenames:
        options["clock"] = request.getfixturevalue("manual_clock")
    instance = Purgatory(name, **options)
    request.node.stash[_PURGATORY] = (instance, check)
    yield instance
    _close(instance)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # Checked right after the test body returns: before any fixture teardown, since
    # the end of the loop (a teardown) closes the purgatory and hides what was left.
    result = yield
    entry = item.stash.get(_PURGATORY, None)
    if entry is not None and entry[1]:
        report = pending_report(entry[0])
        if report:
            pytest.fail(report, pytrace=False)
    return result


def _close(instance: Purgatory) -> None:
    """Close on the purgatory's own loop when it is still usable, else as is."""
    loop = instance.loop
    if loop is not None and not loop.is_closed() and not loop.is_running():
        # Lets the timer task end, so the loop's own teardown finds nothing running.
        loop.run_until_complete(instance.aclose())
    else:
        instance.close()
