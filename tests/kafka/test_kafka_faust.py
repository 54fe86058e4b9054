"""A Faust app (faust-streaming) against the broker (issue 48): a Table's changelog topic
created compacted, counts right, a restarted worker recovering the table from the
changelog once the cleaner has compacted it.

The app is tests/support/faust_app.py; its worker runs in a process of its own (Faust
installs signal handlers and owns its loop) and appends what it counted, and what it
recovered, to a file this test reads.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry
from confluent_kafka.admin._config import ConfigResource as ConfluentConfigResource

from aiopurgatory.kafka import BrokerThread

from ..support.faust_app import APP_ID, CHANGELOG, EVENTS, LEADER_TOPIC, PARTITIONS
from ..support.servers import ROOT

WATCHDOG = 20.0
"""Seconds any one wait may take (a worker starting, counting, stopping)."""


@pytest.fixture
def thread() -> Iterator[BrokerThread]:
    # A broker of the test's own: the app's group, topics and changelog start empty.
    broker = BrokerThread()
    with broker:
        yield broker


class Worker:
    """``python -m tests.support.faust_app`` in a process, and the facts it wrote."""

    def __init__(self, bootstrap: str, datadir: Path, facts: Path) -> None:
        self.facts = facts
        # Its log (warnings and up) to a file: a pipe nobody drains could fill and
        # block the worker.
        self.log = facts.with_suffix(".log")
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.faust_app", bootstrap, datadir, facts],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,  # Faust's banner
                stderr=log,
            )

    def lines(self) -> list[dict[str, Any]]:
        """Every fact written so far."""
        if not self.facts.exists():
            return []
        text = self.facts.read_text("utf-8")
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def wait_for(self, what: str, done: Any) -> list[dict[str, Any]]:
        """Poll the facts until ``done(facts)``; fail with the worker's stderr after
        WATCHDOG seconds or when it exits."""
        deadline = time.monotonic() + WATCHDOG
        while time.monotonic() < deadline:
            facts = self.lines()
            if done(facts):
                return facts
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"the worker never {what}: {self.log.read_text('utf-8')[-3000:]}")

    def stop(self) -> int:
        """SIGTERM (Faust's graceful stop), then wait; kill past WATCHDOG."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(WATCHDOG)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def counted(facts: list[dict[str, Any]]) -> dict[str, int]:
    """The latest count of each key the worker reported."""
    return {fact["key"]: fact["count"] for fact in facts if "key" in fact}


def recovered(facts: list[dict[str, Any]]) -> list[dict[str, int]]:
    return [fact["recovered"] for fact in facts if "recovered" in fact]


async def create_events_topic(bootstrap: str) -> None:
    # The source topic is the app's input, not Faust's to create (it declares only its
    # own: the changelog and the assignor's leader topic).
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(EVENTS, PARTITIONS, 1)])
    finally:
        await admin.close()


async def produce(bootstrap: str, keys: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(EVENTS, b"event", key=key.encode()) for key in keys]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """DescribeConfigs of ``topic`` through aiokafka's admin client."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)]
        )
    finally:
        await admin.close()
    return {entry[0]: entry[1] for entry in described.resources[0][4]}


async def read_changelog(thread: BrokerThread) -> list[tuple[int, int, str, int]]:
    """(partition, offset, key, count) of every record in the changelog, read from the
    beginning (Faust writes keys and values as JSON)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=thread.bootstrap, enable_auto_commit=False)
    await consumer.start()
    read: list[tuple[int, int, str, int]] = []
    try:
        ends = {o.partition: o.log_end for o in thread.offsets(CHANGELOG)}
        parts = [AioTopicPartition(CHANGELOG, p) for p in ends]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        async with asyncio.timeout(WATCHDOG):
            while [tp for tp in parts if await consumer.position(tp) < ends[tp.partition]]:
                batches = await consumer.getmany(timeout_ms=200)
                read += [
                    (m.partition, m.offset, json.loads(m.key or b""), json.loads(m.value or b""))
                    for messages in batches.values()
                    for m in messages
                ]
    finally:
        await consumer.stop()
    return sorted(read)


def alter_segment_ms(bootstrap: str, topic: str, ms: int) -> None:
    """IncrementalAlterConfigs (confluent-kafka's admin): set segment.ms alone, Faust's
    other topic configs kept."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("segment.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    resource = ConfluentConfigResource("topic", topic, incremental_configs=[entry])
    assert admin.incremental_alter_configs([resource])[resource].result(WATCHDOG) is None


def wait_committed(thread: BrokerThread) -> None:
    """Until the app's group has committed every event (so that a restart reprocesses
    none and the counts stay exact: Faust is at-least-once)."""
    deadline = time.monotonic() + WATCHDOG
    ends = {o.partition: o.log_end for o in thread.offsets(EVENTS)}
    while time.monotonic() < deadline:
        committed = {tp.partition: n for tp, n in thread.committed(APP_ID).items()}
        if all(committed.get(p, 0) >= end for p, end in ends.items()):
            return
        time.sleep(0.02)
    pytest.fail(f"the app's commits stopped short: {thread.committed(APP_ID)} of {ends}")


# About 8 s: two Faust workers started and stopped, each with 2 s of Faust's own fixed
# waits (1 s for the tables to register at start, 1 s gathering futures at stop).
@pytest.mark.slow
def test_a_faust_table_counts_and_recovers_from_its_compacted_changelog(
    thread: BrokerThread, tmp_path: Path
) -> None:
    bootstrap = thread.bootstrap
    asyncio.run(create_events_topic(bootstrap))
    first_keys = [f"k{i % 7}" for i in range(200)]
    expected = dict(Counter(first_keys))

    worker = Worker(bootstrap, tmp_path / "data", tmp_path / "run1.jsonl")
    try:
        # The first rebalance's recovery finds an empty changelog.
        assert recovered(worker.wait_for("recovered", recovered))[0] == {}
        asyncio.run(produce(bootstrap, first_keys))
        worker.wait_for("counted", lambda facts: counted(facts) == expected)
        wait_committed(thread)
        # Faust declared its own topics: the changelog compacted, as Faust asks.
        topics = thread.topics
        assert topics[CHANGELOG] == PARTITIONS
        assert topics[LEADER_TOPIC] == 1
        configs = asyncio.run(topic_configs(bootstrap, CHANGELOG))
        assert configs["cleanup.policy"] == "compact"
        group = thread.group(APP_ID)
        assert (group.state, group.protocol, len(group.members)) == ("Stable", "faust", 1)
    finally:
        assert worker.stop() == 0

    # Every update went to the changelog: the latest per key is the count.
    log = asyncio.run(read_changelog(thread))
    assert len(log) == len(first_keys)
    assert {key: count for _, _, key, count in log} == expected
    # The segment rolls on the broker's clock and the cleaner keeps the latest record
    # per key at its offset. segment.ms is cut to a minute first: an advance past
    # Kafka's default (7 days) would also pass offsets.retention.minutes (7 days), and
    # the empty group's commits would go, the restart then counting everything again.
    alter_segment_ms(bootstrap, CHANGELOG, 60_000)
    thread.advance(61)
    compacted = asyncio.run(read_changelog(thread))
    assert {key: count for _, _, key, count in compacted} == expected
    assert set(compacted) <= set(log)  # offsets kept: gaps where the older counts were
    assert len(compacted) < len(log)
    for partition in range(PARTITIONS):
        # What stays besides the latest per key is the partition's newest batch, which
        # the broker keeps whole (docs/guides/kafka-broker.md, "Compacted topics"): from
        # the first older count kept to the log's end, no gap.
        kept = {offset: key for part, offset, key, _ in compacted if part == partition}
        latest = {key: offset for offset, key in sorted(kept.items())}
        older = [offset for offset, key in kept.items() if latest[key] != offset]
        if older:
            assert set(range(min(older), max(kept) + 1)) <= set(kept), (partition, kept)

    # A new worker (memory store: nothing on disk) recovers the table from the changelog.
    worker = Worker(bootstrap, tmp_path / "data", tmp_path / "run2.jsonl")
    try:
        assert recovered(worker.wait_for("recovered", recovered))[0] == expected
        more = [f"k{i % 9}" for i in range(45)]  # two keys the table never saw
        asyncio.run(produce(bootstrap, more))
        expected = dict(Counter(first_keys) + Counter(more))
        facts = worker.wait_for("counted on", lambda facts: counted(facts) == expected)
        assert len([fact for fact in facts if "key" in fact]) == len(more)  # none reprocessed
    finally:
        assert worker.stop() == 0
