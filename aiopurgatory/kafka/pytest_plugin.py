"""The Kafka broker's pytest plugin (the ``pytest11`` entry point ``aiopurgatory_kafka``).

pytest loads it wherever aiopurgatory is installed beside it, next to the purgatory's
own plugin (:mod:`aiopurgatory.pytest_plugin`, which imports nothing of this package);
nothing imports it otherwise. It offers:

* ``kafka_bootstrap``: ``"127.0.0.1:PORT"`` of a Kafka-protocol broker
  (:class:`aiopurgatory.kafka.BrokerThread`) on a free loopback port, with a single-node
  Kafka's defaults, started the first time a test asks for it and shared by the whole
  session: topics, records and groups persist from test to test (use a fresh topic
  name per test, or a dedicated broker).
* ``kafka_broker``: that session broker's :class:`~aiopurgatory.kafka.BrokerThread`
  (``bootstrap``, ``create_topic``, ``offsets``, ``group``...). With the marker
  ``@pytest.mark.kafka_broker(**options)`` the test gets a broker of its own instead,
  started with those :class:`~aiopurgatory.kafka.KafkaBroker` options
  (``partitions=3``, ``group_initial_rebalance_delay_ms=3000``, ``max_topics=10``...)
  and stopped after it; ``kafka_bootstrap`` is then that broker's address. Both are
  test-scoped (the session's broker behind them lives for the session).
* ``kafka_broker_factory``: ``kafka_broker_factory(**options)`` starts a dedicated
  broker (as many as the test wants), each stopped after the test.
* ``kafka_tls`` (session scope): a throwaway CA and a server certificate for
  127.0.0.1 and localhost (:class:`aiopurgatory.kafka.tls.TlsFiles`: ``ca_file``,
  ``server_context()``, ``client_context()``), made with trustme. The option
  ``tls=True`` of the marker and the factory listens with it (``ssl_context=`` takes
  a context of the test's own); ``sasl_users={"alice": "secret"}`` and
  ``sasl_mechanisms=`` make the listener take SASL.


Ground rules: importing this plugin imports no kio, so that every pytest run where
aiopurgatory is installed loads it, with the ``kafka`` extra or without. The broker
(:mod:`.thread`, and through it kio) is imported by the first test that asks for a
broker; without the extra that test fails with the one line
``pip install 'aiopurgatory[kafka]'``, and the other tests run as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ._extra import KAFKA_EXTRA_HINT

if TYPE_CHECKING:
    from .thread import BrokerThread
    from .tls import TlsFiles

__all__ = ["kafka_bootstrap", "kafka_broker", "kafka_broker_factory", "kafka_tls"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kafka_broker(**options): the `kafka_broker` and `kafka_bootstrap` fixtures are a broker"
        " of this test's own, started with these KafkaBroker options (partitions=3,"
        " group_initial_rebalance_delay_ms=3000, a Limits field, tls=True, sasl_users={...}...),"
        " instead of the session's",
    )


def _start_kafka_broker(options: dict[str, Any]) -> BrokerThread:
    """A started BrokerThread; the test fails with the install hint when kio is missing."""
    try:
        # The package's lazy name, not .thread itself: a missing kio is then the
        # ImportError that names the extra.
        from . import BrokerThread as thread_class
    except ImportError as exc:
        # Outside the except block: the report is the one line, not a chain of tracebacks.
        missing = str(exc) if KAFKA_EXTRA_HINT in str(exc) else f"{KAFKA_EXTRA_HINT} ({exc})"
    else:
        return thread_class(**options).started()
    pytest.fail(missing, pytrace=False)


@pytest.fixture(scope="session")
def _kafka_session_broker() -> Iterator[BrokerThread]:
    thread = _start_kafka_broker({})
    yield thread
    thread.stop()


@pytest.fixture
def kafka_bootstrap(kafka_broker: BrokerThread) -> str:
    """``"127.0.0.1:PORT"`` of the test's Kafka-protocol broker (``kafka_broker``'s),
    for the clients' ``bootstrap_servers``.

    The session's broker, started on a free loopback port the first time a test asks
    for it and stopped at the end of the session (topics and groups persist across the
    session's tests), with a single-node Kafka's development defaults: auto-created
    topics get 1 partition, replication factor 1, no initial rebalance delay. A test
    marked ``@pytest.mark.kafka_broker(**options)`` gets its own broker's address.
    """
    # Test scope, and through kafka_broker, so that the marker is followed: a session
    # fixture cannot see a test's marker, and a marked test asking for the address alone
    # was handed the shared broker and passed on the wrong configuration (issue 49).
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA and a certificate it signed for 127.0.0.1 and localhost (trustme),
    for a TLS listener (``tls=True``) and the clients that trust it (``ca_file``)."""
    from .tls import throwaway_certificates

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
    ``nodes`` for a cluster with faults on demand, ``group_initial_rebalance_delay_ms``,
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
