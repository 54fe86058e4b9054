"""BrokerThread: the broker on its own event loop in a thread, for blocking clients.

Ground rules: everything the broker does happens on its thread's loop; the calling
thread only starts it, asks it things through :meth:`BrokerThread.call` (which runs on
that loop and hands the answer back), and stops it. The methods that mirror
:class:`~aiopurgatory.kafka.KafkaBroker`'s API all go through ``call``; they are the
verbs of :class:`~.control.BrokerControl`, and mypy holds the two surfaces together
through :class:`~.control.BrokerVerbs` (checked at the end of this module): a verb
added there and not here, or here with other parameters, fails the type check.

The two verbs that :class:`~aiopurgatory.kafka.KafkaBroker` has async
(``stop_node``, ``start_node``) return :class:`Done` here: they have finished when they
return, as every verb here, and the object may be awaited, so that an async test
written in the broker's spelling (``await kafka_broker.stop_node(n)``) works on the
fixture's thread too, under any async framework (awaiting it never suspends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final, Self, TypeVar, overload

from kio.schema.errors import ErrorCode

from .broker import KafkaBroker
from .control import BrokerVerbs
from .log import TopicPartition
from .views import GroupInfo, PartitionOffsets, TransactionInfo

__all__ = ["BrokerThread", "Done"]

T = TypeVar("T")

START_TIMEOUT = 30.0
"""Seconds ``__enter__`` waits for the broker to listen, and ``call`` for an answer."""


class Done:
    """What :meth:`BrokerThread.stop_node` and :meth:`BrokerThread.start_node` return:
    the verb has finished. Awaiting it gives None at once (it never suspends, so any
    event loop, asyncio's, uvloop's or trio's through anyio, can await it): the async
    spelling of :class:`~aiopurgatory.kafka.KafkaBroker`, ``await broker.stop_node(n)``,
    works on a :class:`BrokerThread` as well.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        # A generator that yields nothing: the await returns at once, with None.
        return
        yield  # pragma: no cover  (makes this a generator function)

    def __bool__(self) -> bool:
        return False  # as the None these verbs returned before

    def __repr__(self) -> str:
        return "<Done>"


DONE: Final = Done()
"""The one :class:`Done` (it holds nothing)."""


class BrokerThread:
    """A :class:`KafkaBroker` on its own event loop in a background thread.

    For tests whose clients block (kafka-python, confluent-kafka) or that run no loop of
    their own; asyncio clients can use it too. ``with BrokerThread() as bootstrap:``
    starts the broker on 127.0.0.1 and a free port and gives ``"127.0.0.1:PORT"``;
    leaving the block stops it. :meth:`start` and :meth:`stop` do the same without a
    block. The methods below run on the broker's loop and wait for it.

    Args:
        host: The address to listen on.
        port: The port; 0 picks a free one.
        **options: Any keyword argument of :class:`KafkaBroker` (``partitions``,
            ``replicas``, ``group_initial_rebalance_delay_ms``, ``ssl_context``, ``sasl_users``,
            ``sasl_mechanisms``, a :class:`Limits` field...).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.host = host
        self.port = port
        self.options = options
        self.broker: KafkaBroker | None = None
        """The broker, once started. Read it from this thread only between requests;
        change it only through :meth:`call`."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._address = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kafka-broker", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> str:
        """Start the broker's thread and wait until it listens.

        Returns:
            The bootstrap address, ``"host:port"``.

        Raises:
            TimeoutError: It did not listen within 30 s.
            OSError: The address cannot be listened on (and what else the broker's
                constructor raises: ValueError, TypeError for a bad option).
            RuntimeError: Started before (a thread runs once: make a new object).
        """
        if self._thread.ident is not None:
            # threading's own "threads can only be started once" names no broker; and
            # ``with thread.started():`` is an easy slip (``started`` returns the object).
            raise RuntimeError(
                "this BrokerThread was started before: use `with BrokerThread(...) as"
                " bootstrap`, or start() / started() once and stop() at the end"
            )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError(f"the broker did not start within {START_TIMEOUT:g} s")
        if self._error is not None:
            raise self._error
        return self._address

    def stop(self) -> None:
        """Stop the broker and wait for its thread (idempotent)."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.is_alive():
            self._thread.join(START_TIMEOUT)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str:
        """``"host:port"`` for the clients' ``bootstrap_servers`` (once started)."""
        if not self._address:
            raise RuntimeError("the broker thread is not started")
        return self._address

    @property
    def security_protocol(self) -> str:
        """:attr:`KafkaBroker.security_protocol` (once started)."""
        if self.broker is None:
            raise RuntimeError("the broker thread is not started")
        return self.broker.security_protocol  # fixed at construction: no call needed

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the thread that waits in start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        broker = self.broker = KafkaBroker(host=self.host, port=self.port, **self.options)
        await broker.start()
        self._address = broker.bootstrap  # every node's address, comma-separated
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await broker.aclose()

    # -- the broker's API, from any thread ----------------------------------------------

    @overload
    def call(
        self, function: Callable[[KafkaBroker], Awaitable[T]], timeout: float = START_TIMEOUT
    ) -> T: ...

    @overload
    def call(self, function: Callable[[KafkaBroker], T], timeout: float = START_TIMEOUT) -> T: ...

    def call(self, function: Callable[[KafkaBroker], Any], timeout: float = START_TIMEOUT) -> Any:
        """Run ``function(broker)`` on the broker's loop and return what it returns
        (awaited, if it returns an awaitable).

        Raises:
            RuntimeError: The broker is not running.
            TimeoutError: No answer within ``timeout`` seconds.
            Exception: What ``function`` raised.
        """
        loop, broker = self._loop, self.broker
        if loop is None or broker is None or loop.is_closed() or not self._thread.is_alive():
            raise RuntimeError("the broker thread is not running")

        async def invoke() -> Any:
            result: Any = function(broker)
            if inspect.isawaitable(result):
                result = await result
            return result

        future = asyncio.run_coroutine_threadsafe(invoke(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the broker did not answer within {timeout:g} s") from None

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """:meth:`KafkaBroker.create_topic` on the broker's loop."""
        self.call(lambda broker: broker.create_topic(name, partitions))

    def delete_topic(self, name: str) -> None:
        """:meth:`KafkaBroker.delete_topic` on the broker's loop."""
        self.call(lambda broker: broker.delete_topic(name))

    @property
    def topics(self) -> dict[str, int]:
        """:attr:`KafkaBroker.topics`."""
        return self.call(lambda broker: broker.topics)

    def offsets(self, topic: str) -> list[PartitionOffsets]:
        """:meth:`KafkaBroker.offsets`."""
        return self.call(lambda broker: broker.offsets(topic))

    def list_groups(self) -> list[str]:
        """:meth:`KafkaBroker.list_groups`."""
        return self.call(lambda broker: broker.list_groups())

    def group(self, group_id: str) -> GroupInfo:
        """:meth:`KafkaBroker.group`."""
        return self.call(lambda broker: broker.group(group_id))

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """:meth:`KafkaBroker.committed`."""
        return self.call(lambda broker: broker.committed(group_id))

    def transaction(self, transactional_id: str) -> TransactionInfo:
        """:meth:`KafkaBroker.transaction`."""
        return self.call(lambda broker: broker.transaction(transactional_id))

    def last_stable_offset(self, topic: str, partition: int = 0) -> int:
        """:meth:`KafkaBroker.last_stable_offset`."""
        return self.call(lambda broker: broker.last_stable_offset(topic, partition))

    # -- the nodes, and faults on demand (see KafkaBroker's methods of these names) ----

    @property
    def node_count(self) -> int:
        """:attr:`KafkaBroker.node_count`."""
        return self.call(lambda broker: broker.node_count)

    def node_address(self, node: int) -> str:
        """:meth:`KafkaBroker.node_address`."""
        return self.call(lambda broker: broker.node_address(node))

    def leader(self, topic: str, partition: int = 0) -> int:
        """:meth:`KafkaBroker.leader`."""
        return self.call(lambda broker: broker.leader(topic, partition))

    def isr(self, topic: str, partition: int = 0) -> tuple[int, ...]:
        """:meth:`KafkaBroker.isr`."""
        return self.call(lambda broker: broker.isr(topic, partition))

    def replicas_of(self, topic: str, partition: int = 0) -> tuple[int, ...]:
        """:meth:`KafkaBroker.replicas_of`."""
        return self.call(lambda broker: broker.replicas_of(topic, partition))

    def leader_epoch(self, topic: str, partition: int = 0) -> int:
        """:meth:`KafkaBroker.leader_epoch`."""
        return self.call(lambda broker: broker.leader_epoch(topic, partition))

    def coordinator(self, key: str) -> int:
        """:meth:`KafkaBroker.coordinator`."""
        return self.call(lambda broker: broker.coordinator(key))

    def node_state(self, node: int) -> str:
        """:meth:`KafkaBroker.node_state`."""
        return self.call(lambda broker: broker.node_state(node))

    def advance(self, seconds: float) -> Done:
        """:meth:`KafkaBroker.advance`, waited for: what fell due has run when this
        returns; awaitable as :meth:`stop_node`."""
        self.call(lambda broker: broker.advance(seconds))
        return DONE

    def stop_node(self, node: int) -> Done:
        """:meth:`KafkaBroker.stop_node`, waited for: the node has stopped when this
        returns. In an async test ``await kafka_broker.stop_node(node)`` works too (the
        result, :class:`Done`, is awaitable); the test's loop is held meanwhile, a few
        milliseconds."""
        self.call(lambda broker: broker.stop_node(node))
        return DONE

    def start_node(self, node: int) -> Done:
        """:meth:`KafkaBroker.start_node`, waited for; awaitable as :meth:`stop_node`."""
        self.call(lambda broker: broker.start_node(node))
        return DONE

    def isolate(self, node: int) -> None:
        """:meth:`KafkaBroker.isolate`."""
        self.call(lambda broker: broker.isolate(node))

    def heal(self, node: int) -> None:
        """:meth:`KafkaBroker.heal`."""
        self.call(lambda broker: broker.heal(node))

    def inject(
        self, api: int | str, error: ErrorCode | int | str, count: int = 1, node: int | None = None
    ) -> None:
        """:meth:`KafkaBroker.inject`."""
        self.call(lambda broker: broker.inject(api, error, count, node))

    def delay(self, ms: float, *, api: int | str | None = None, node: int | None = None) -> None:
        """:meth:`KafkaBroker.delay`."""
        self.call(lambda broker: broker.delay(ms, api=api, node=node))

    def clear_faults(self) -> None:
        """:meth:`KafkaBroker.clear_faults`."""
        self.call(lambda broker: broker.clear_faults())

    @property
    def fault_lines(self) -> list[str]:
        """:attr:`KafkaBroker.fault_lines`: the latest faults and effects logged."""
        return self.call(lambda broker: broker.fault_lines)

    def __repr__(self) -> str:
        return f"<BrokerThread {self._address or 'not started'}>"

    # ``with BrokerThread(...) as bootstrap`` is the common form; a proxy form for
    # fixtures that hand the object itself out:
    def started(self) -> Self:
        """Start (as :meth:`start`) and return this object."""
        self.start()
        return self


_FROM_A_THREAD: type[BrokerVerbs[Done]] = BrokerThread
"""mypy checks here that :class:`BrokerThread` offers every verb of
:class:`~.control.BrokerVerbs`, with the same parameters (the verbs that wait return
once done, a :class:`Done`)."""
