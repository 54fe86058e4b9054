"""A follower isolated until it leaves the ISR, then healed, as each real client sees it
(issue 37): aiokafka, kafka-python and confluent-kafka.

A three-node cluster (``kafka_wire.cluster_thread``: rf 3, ``replica_lag`` 0.5 s) and
one partition. An idempotent acks=all producer sends; one follower of the partition is
isolated (``isolate``: it answers nothing and stops fetching, its sockets stay open):

- the next send is acknowledged only once the leader has dropped that follower from the
  ISR, after ``replica_lag`` and not before (acks=all waits for the ISR);
- sends go on with the smaller ISR, at once;
- after ``heal`` the follower fetches what it missed and is back in the ISR (the fault
  log says at which offset);
- every acknowledged record is read back by the same client once, in order.

``-s`` shows the figures: how long the first acks=all send waited while the follower was
isolated, and how long the follower took to come back into the ISR after ``heal``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

from aiopurgatory.kafka import BrokerThread

from ..support.helpers import watchdog
from ..support.kafka_wire import REPLICA_LAG, cluster_thread, running

HARD_TIMEOUT = 60.0
"""Seconds a test may run at all (SIGALRM: the suite has no pytest-timeout)."""
WAIT = 15.0
"""Seconds any one wait of a test may take."""
BATCH = 20
"""Records sent in each phase, one at a time (each waits for its acknowledgement)."""


class Client(Protocol):
    """One client's producer and reader, synchronous (the test drives it)."""

    def send(self, values: list[bytes]) -> None:
        """Send ``values`` to partition 0 in order, each acknowledged before the next."""

    def read(self, end: int) -> list[tuple[int, bytes]]:
        """Every (offset, value) of partition 0 from the start up to ``end``."""

    def close(self) -> None: ...


class AiokafkaClient:
    """aiokafka on a loop of its own, run by this thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from aiokafka import AIOKafkaProducer

        self.bootstrap = bootstrap
        self.topic = topic
        self.loop = asyncio.new_event_loop()

        async def started() -> AIOKafkaProducer:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                request_timeout_ms=10000,
                retry_backoff_ms=20,
            )
            await producer.start()
            return producer

        self.producer: AIOKafkaProducer = self._run(started())

    def _run(self, awaitable: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(WAIT):
                return await awaitable

        return self.loop.run_until_complete(bounded())

    def send(self, values: list[bytes]) -> None:
        for value in values:
            self._run(self.producer.send_and_wait(self.topic, value, partition=0))

    def read(self, end: int) -> list[tuple[int, bytes]]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def read_all() -> list[tuple[int, bytes]]:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            await consumer.start()
            try:
                tp = TopicPartition(self.topic, 0)
                consumer.assign([tp])
                read: list[tuple[int, bytes]] = []
                while await consumer.position(tp) < end:
                    batches = await consumer.getmany(tp, timeout_ms=200)
                    read += [(r.offset, r.value or b"") for r in batches.get(tp, [])]
                return read
            finally:
                await consumer.stop()

        result: list[tuple[int, bytes]] = self._run(read_all())
        return result

    def close(self) -> None:
        try:
            self._run(self.producer.stop())
        finally:
            self.loop.close()


KAFKA_PYTHON = {
    "request_timeout_ms": 5000,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
    "metadata_max_age_ms": 5000,
}
"""kafka-python's timeouts, shortened: a metadata request to the isolated node is not
answered, and its defaults (30 s) would outlast the test."""


class KafkaPythonClient:
    def __init__(self, bootstrap: str, topic: str) -> None:
        import kafka

        self.bootstrap = bootstrap
        self.topic = topic
        self.producer = kafka.KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **KAFKA_PYTHON
        )

    def send(self, values: list[bytes]) -> None:
        for value in values:
            self.producer.send(self.topic, value, partition=0).get(timeout=WAIT)

    def read(self, end: int) -> list[tuple[int, bytes]]:
        import kafka

        consumer = kafka.KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **KAFKA_PYTHON,
        )
        try:
            tp = kafka.TopicPartition(self.topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            read: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + WAIT
            while consumer.position(tp) < end:
                assert time.monotonic() < deadline, "kafka-python did not read to the end"
                for records in consumer.poll(timeout_ms=200).values():
                    read += [(r.offset, r.value) for r in records]
            return read
        finally:
            consumer.close()

    def close(self) -> None:
        self.producer.close(timeout=5)


class ConfluentClient:
    def __init__(self, bootstrap: str, topic: str) -> None:
        import confluent_kafka

        self.bootstrap = bootstrap
        self.topic = topic
        self.producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "retry.backoff.ms": 20,
                "socket.timeout.ms": 5000,
            }
        )

    def send(self, values: list[bytes]) -> None:
        for value in values:
            self.outcome: list[Any] = []
            self.producer.produce(self.topic, value, partition=0, on_delivery=self._delivered)
            assert self.producer.flush(WAIT) == 0, "not acknowledged in time"
            assert self.outcome == [None], self.outcome

    def _delivered(self, error: Any, message: Any) -> None:
        self.outcome.append(error)

    def read(self, end: int) -> list[tuple[int, bytes]]:
        import confluent_kafka

        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "socket.timeout.ms": 5000,
            }
        )
        try:
            consumer.assign(
                [confluent_kafka.TopicPartition(self.topic, 0, confluent_kafka.OFFSET_BEGINNING)]
            )
            read: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + WAIT
            while not read or read[-1][0] < end - 1:
                assert time.monotonic() < deadline, "confluent-kafka did not read to the end"
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    read.append((message.offset() or 0, message.value() or b""))
            return read
        finally:
            consumer.close()

    def close(self) -> None:
        self.producer.flush(5)


CLIENTS: dict[str, Callable[[str, str], Client]] = {
    "aiokafka": AiokafkaClient,
    "kafka-python": KafkaPythonClient,
    "confluent-kafka": ConfluentClient,
}


@pytest.fixture
def cluster() -> Iterator[BrokerThread]:
    with watchdog(HARD_TIMEOUT), running(cluster_thread()) as thread:
        yield thread


def wait_for(predicate: Callable[[], bool], what: str) -> float:
    """Seconds until ``predicate()``, polled every 10 ms; fails after WAIT."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < WAIT, f"timed out waiting for {what}"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.parametrize("client_name", list(CLIENTS))
def test_a_follower_isolated_leaves_the_isr_and_heals_back(
    cluster: BrokerThread, client_name: str
) -> None:
    topic = f"isolated-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(topic, 1)
    leader = cluster.leader(topic)
    follower = next(n for n in cluster.replicas_of(topic) if n != leader)
    client = CLIENTS[client_name](cluster.bootstrap, topic)
    try:
        client.send([b"before-%d" % i for i in range(BATCH)])
        assert set(cluster.isr(topic)) == {0, 1, 2}

        cluster.isolate(follower)
        started = time.monotonic()
        client.send([b"isolated-0"])  # acks=all: waits until the ISR drops the follower
        first_ack = time.monotonic() - started
        assert follower not in cluster.isr(topic)
        assert first_ack >= REPLICA_LAG * 0.8, first_ack  # the lag bound, not at once
        assert cluster.leader(topic) == leader  # the leader did not move
        started = time.monotonic()
        client.send([b"isolated-%d" % i for i in range(1, BATCH)])
        rest = time.monotonic() - started
        assert len(cluster.isr(topic)) == 2

        cluster.heal(follower)
        back = wait_for(lambda: follower in cluster.isr(topic), "the follower back in the ISR")
        # Back once it had fetched what was appended while it was away.
        assert f"effect: isr_expand {topic}-0: node {follower} back in sync at {2 * BATCH}" in (
            cluster.fault_lines
        )
        client.send([b"after-%d" % i for i in range(BATCH)])
        assert set(cluster.isr(topic)) == {0, 1, 2}

        (offsets,) = cluster.offsets(topic)
        assert offsets.high_watermark == offsets.log_end == 3 * BATCH
        read = client.read(offsets.high_watermark)
    finally:
        client.close()
    expected = (
        [b"before-%d" % i for i in range(BATCH)]
        + [b"isolated-%d" % i for i in range(BATCH)]
        + [b"after-%d" % i for i in range(BATCH)]
    )
    assert read == list(enumerate(expected))  # each once, in order, nothing lost
    print(
        f"\nFIGURES isolation {client_name}: first acks=all send with follower {follower}"
        f" isolated {first_ack * 1000:.0f} ms; the next {BATCH - 1} in {rest * 1000:.0f} ms;"
        f" back in the ISR {back * 1000:.1f} ms after heal"
    )
