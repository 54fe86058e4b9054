"""aiopurgatory's pytest plugin (registered as a ``pytest11`` entry point).

pytest loads it wherever aiopurgatory is installed beside it; nothing imports it
otherwise. It offers:

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
* ``kafka_bootstrap`` (session scope): ``"127.0.0.1:PORT"`` of a Kafka-protocol broker
  (:class:`aiopurgatory.kafka.BrokerThread`) on a free loopback port, with a single-node
  Kafka's defaults, started the first time a test asks for it and shared by the whole
  session: topics, records and groups persist from test to test (use a fresh topic
  name per test, or a dedicated broker).
* ``kafka_broker``: that session broker's :class:`~aiopurgatory.kafka.BrokerThread`
  (``bootstrap``, ``create_topic``, ``offsets``, ``group``...). With the marker
  ``@pytest.mark.kafka_broker(**options)`` the test gets a broker of its own instead,
  started with those :class:`~aiopurgatory.kafka.KafkaBroker` options
  (``partitions=3``, ``initial_rebalance_delay=3.0``, ``max_topics=10``...) and stopped
  after it.
* ``kafka_broker_factory``: ``kafka_broker_factory(**options)`` starts a dedicated
  broker (as many as the test wants), each stopped after the test.
* ``kafka_tls`` (session scope): a throwaway CA and a server certificate for
  127.0.0.1 and localhost (:class:`aiopurgatory.kafka.tls.TlsFiles`: ``ca_file``,
  ``server_context()``, ``client_context()``), made with trustme. The option
  ``tls=True`` of the marker and the factory listens with it (``ssl_context=`` takes
  a context of the test's own); ``sasl_users={"alice": "secret"}`` and
  ``sasl_mechanisms=`` make the listener take SASL.

  The Kafka fixtures need the ``kafka`` extra; without it they fail the test with
  ``pip install 'aiopurgatory[kafka]'`` (this plugin itself never imports kio).
* a guard for ``@pytest.mark.looptime`` (the testing guide's way to make the loop's
  own time virtual): when the looptime plugin is not loaded, such a test fails at once saying
  so, instead of running its virtual hours in real time.

The fixtures are plain (synchronous) fixtures, so they work the same under
pytest-asyncio (strict or auto mode) and under anyio's plugin: the purgatory binds
lazily to whichever loop the test runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import pytest

from .purgatory import Purgatory
from .testing import ManualClock, pending_report

if TYPE_CHECKING:
    from .kafka import BrokerThread
    from .kafka.tls import TlsFiles

__all__ = [
    "kafka_bootstrap",
    "kafka_broker",
    "kafka_broker_factory",
    "kafka_tls",
    "manual_clock",
    "purgatory",
]

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
    config.addinivalue_line(
        "markers",
        "kafka_broker(**options): the `kafka_broker` fixture is a broker of this test's own,"
        " started with these KafkaBroker options (partitions=3, initial_rebalance_delay=3.0,"
        " a Limits field, tls=True, sasl_users={...}...), instead of the session's",
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


# -- the Kafka-protocol broker ----------------------------------------------------------


def _start_kafka_broker(options: dict[str, Any]) -> BrokerThread:
    """A started BrokerThread; the test fails with the install hint when kio is missing."""
    from .kafka._extra import KAFKA_EXTRA_HINT

    try:
        from .kafka import BrokerThread
    except ImportError as exc:
        # Outside the except block: the report is the one line, not a chain of tracebacks.
        missing = str(exc) if KAFKA_EXTRA_HINT in str(exc) else f"{KAFKA_EXTRA_HINT} ({exc})"
    else:
        return BrokerThread(**options).started()
    pytest.fail(missing, pytrace=False)


@pytest.fixture(scope="session")
def _kafka_session_broker() -> Iterator[BrokerThread]:
    thread = _start_kafka_broker({})
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_session_broker: BrokerThread) -> str:
    """``"127.0.0.1:PORT"`` of the session's Kafka-protocol broker, for the clients'
    ``bootstrap_servers``.

    Started on a free loopback port the first time a test asks for it, stopped at the
    end of the session; topics and groups persist across the session's tests. Kafka's
    single-node development defaults: auto-created topics get 1 partition, replication
    factor 1, no initial rebalance delay.
    """
    return _kafka_session_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA and a certificate it signed for 127.0.0.1 and localhost (trustme),
    for a TLS listener (``tls=True``) and the clients that trust it (``ca_file``)."""
    from .kafka.tls import throwaway_certificates

    try:
        return throwaway_certificates(tmp_path_factory.mktemp("kafka-tls"))
    except ImportError as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


@pytest.fixture
def kafka_broker_factory(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., BrokerThread]]:
    """``kafka_broker_factory(**options)``: a broker of the test's own, started with
    :class:`~aiopurgatory.kafka.KafkaBroker` options (``partitions``, ``replicas``,
    ``nodes`` for a cluster with faults on demand, ``initial_rebalance_delay``,
    ``sasl_users``, a :class:`~aiopurgatory.kafka.Limits` field...) on free loopback
    ports; every broker it started stops after the test.
    ``tls=True`` listens with TLS, with the ``kafka_tls`` certificate.

    Raises:
        ValueError: ``tls=True`` and ``ssl_context`` both.
    """
    started: list[BrokerThread] = []

    def factory(**options: Any) -> BrokerThread:
        if options.pop("tls", False):
            if options.get("ssl_context") is not None:
                raise ValueError("tls=True and ssl_context: one or the other")
            files: TlsFiles = request.getfixturevalue("kafka_tls")
            options["ssl_context"] = files.server_context()
        thread = _start_kafka_broker(options)
        started.append(thread)
        return thread

    yield factory
    for thread in reversed(started):
        thread.stop()


@pytest.fixture
def kafka_broker(
    request: pytest.FixtureRequest, kafka_broker_factory: Callable[..., BrokerThread]
) -> BrokerThread:
    """The Kafka-protocol broker, as a :class:`~aiopurgatory.kafka.BrokerThread`:
    ``bootstrap``, ``create_topic``, ``delete_topic``, ``topics``, ``offsets``,
    ``group``, ``committed``, and on a cluster (``nodes=3``) the faults (``stop_node``,
    ``isolate``, ``inject``...), callable from the test whatever loop it runs on.

    The session's broker (the one behind ``kafka_bootstrap``), unless the test is marked
    ``@pytest.mark.kafka_broker(**options)``: then a broker of its own, started with
    those options and stopped after the test.

    Raises:
        TypeError: the marker was given positional arguments.
    """
    marker = request.node.get_closest_marker("kafka_broker")
    if marker is None:
        session: BrokerThread = request.getfixturevalue("_kafka_session_broker")
        return session
    if marker.args:
        raise TypeError("@pytest.mark.kafka_broker takes keyword arguments only")
    return kafka_broker_factory(**marker.kwargs)
