"""Broker time a test moves: ``advance(seconds)`` on the Kafka broker, and the clock under it.

Each deadline the broker keeps (a member's session, the initial rebalance delay, a
transaction's timeout, retention by time) is shown to act when the broker's clock is
moved past it, in well under a second of wall time, and not before; what a client waits
for in real time (a fetch's max_wait) keeps its real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError as AioKafkaError
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.sync_group.v3 import request as sync_v3
from kio.schema.sync_group.v3.response import SyncGroupResponse
from kio.schema.types import GroupId

import aiopurgatory as ap
from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.testing import OffsetClock

from ..support.helpers import Flag
from ..support.kafka_broker import join_v5_request
from ..support.kafka_wire import Wire, name

WATCHDOG = 10.0
"""Seconds any one test waits at most for what it expects."""

QUICK = 1.0
"""Wall seconds an advance over a deadline of a minute or so may take at most (it takes
a few milliseconds; the bound is loose for a loaded machine)."""


# -- the clock ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_clock_follows_the_loop_until_moved_and_never_goes_back() -> None:
    loop = asyncio.get_running_loop()
    clock = OffsetClock()
    assert abs(clock.time() - loop.time()) < 0.05
    assert abs(clock.wall() - time.time()) < 0.05
    await clock.advance(100.0)
    assert clock.offset == pytest.approx(100.0, abs=0.05)
    assert clock.time() - loop.time() == pytest.approx(100.0, abs=0.05)
    assert clock.wall() - time.time() == pytest.approx(100.0, abs=0.05)
    await clock.advance(0)
    assert clock.offset == pytest.approx(100.0, abs=0.05)


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
async def test_the_clock_refuses_a_step_back_or_not_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="seconds"):
        await OffsetClock().advance(bad)


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["1", True, None])
async def test_the_clock_refuses_what_is_not_a_number(bad: object) -> None:
    with pytest.raises(TypeError, match="seconds"):
        await OffsetClock().advance(bad)  # type: ignore[arg-type]


def test_the_clock_checks_its_passes() -> None:
    with pytest.raises(ValueError, match="max_passes"):
        OffsetClock(max_passes=1)
    with pytest.raises(TypeError, match="max_passes"):
        OffsetClock(max_passes=2.5)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_wake_ups_run_in_order_each_at_its_instant_and_chained_ones_too() -> None:
    clock = OffsetClock()
    start = clock.time()
    seen: list[tuple[str, float]] = []

    def wake(label: str) -> None:
        seen.append((label, clock.time() - start))
        if label == "a":  # arms one more, due before the target: it runs too
            clock.call_at(clock.time() + 10.0, lambda: wake("chained"))

    clock.call_at(start + 30.0, lambda: wake("b"))
    clock.call_at(start + 10.0, lambda: wake("a"))
    late = clock.call_at(start + 100.0, lambda: wake("late"))
    cancelled = clock.call_at(start + 5.0, lambda: wake("cancelled"))
    cancelled.cancel()
    began = time.monotonic()
    await clock.advance(50.0)
    assert time.monotonic() - began < QUICK
    assert [label for label, _ in seen] == ["a", "chained", "b"]
    at = dict(seen)
    assert at["a"] == pytest.approx(10.0, abs=0.05)
    assert at["chained"] == pytest.approx(20.0, abs=0.05)
    assert at["b"] == pytest.approx(30.0, abs=0.05)
    assert clock.pending_wakeups() == 1  # "late" only
    late.cancel()
    assert clock.pending_wakeups() == 0


@pytest.mark.anyio
async def test_without_advance_a_wake_up_comes_in_real_time() -> None:
    clock = OffsetClock()
    woke = asyncio.Event()
    clock.call_at(clock.time() + 0.05, woke.set)
    await asyncio.wait_for(woke.wait(), WATCHDOG)


@pytest.mark.anyio
async def test_a_purgatory_on_the_clock_expires_a_minute_long_operation_at_once() -> None:
    clock = OffsetClock()
    async with ap.Purgatory("minute", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(60.0, lambda: False), ["k"])
        await clock.advance(59.0)
        assert not op.done()
        began = time.monotonic()
        await clock.advance(1.5)
        assert op.done()
        assert time.monotonic() - began < QUICK


# -- the broker's deadlines ------------------------------------------------------------------


def joined_and_synced(wire: Wire, group: str, session_ms: int) -> str:
    """One member in ``group`` (joined and its assignment synced); its id."""
    joined = wire.call(join_v5_request(group, session_ms=session_ms), JoinGroupResponse)
    assert joined.error_code is ErrorCode.none
    synced = wire.call(
        sync_v3.SyncGroupRequest(
            group_id=GroupId(group),
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id=None,
            assignments=(),
        ),
        SyncGroupResponse,
    )
    assert synced.error_code is ErrorCode.none
    return str(joined.member_id)


@contextlib.contextmanager
def on_the_wire(**options: Any) -> Iterator[tuple[BrokerThread, Wire]]:
    """A broker in a thread started with ``options``, and a raw connection to it."""
    thread = BrokerThread(**options)
    with thread as address:
        wire = Wire(address)
        wire.sock.settimeout(WATCHDOG)  # a watchdog on every answer
        try:
            yield thread, wire
        finally:
            wire.sock.close()


def test_a_silent_member_expires_at_its_45_s_session_in_well_under_a_second() -> None:
    with on_the_wire(group_initial_rebalance_delay_ms=0) as (thread, wire):
        member = joined_and_synced(wire, "g", session_ms=45_000)
        assert thread.group("g").members == (member,)
        thread.advance(44.0)  # not yet: the session has a second left
        assert thread.group("g").members == (member,)
        began = time.monotonic()
        thread.advance(2.0)
        took = time.monotonic() - began
        # Its only member gone and no offsets committed: the group is gone too.
        assert "g" not in thread.list_groups()
        assert took < QUICK


def test_the_initial_rebalance_delay_passes_with_advance() -> None:
    with on_the_wire(group_initial_rebalance_delay_ms=60_000) as (thread, wire):
        began = time.monotonic()
        wire.send(join_v5_request("g"))  # the first member of a new group waits
        deadline = time.monotonic() + WATCHDOG
        while "g" not in thread.list_groups():
            assert time.monotonic() < deadline, "the JoinGroup never arrived"
            time.sleep(0.01)
        assert thread.group("g").state == "PreparingRebalance"
        thread.advance(61.0)
        joined = wire.receive(JoinGroupResponse)
        assert (joined.error_code, joined.generation_id) == (ErrorCode.none, 1)
        assert time.monotonic() - began < WATCHDOG / 2


@pytest.mark.anyio
async def test_a_transaction_past_its_minute_is_aborted_and_the_lso_released() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, tid = name("t"), name("tx")
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            transactional_id=tid,
            transaction_timeout_ms=60_000,
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"never committed")
            epoch = broker.transaction(tid).producer_epoch
            await broker.advance(59.0)
            assert broker.transaction(tid).state == "Ongoing"
            assert broker.last_stable_offset(topic) == 0
            began = time.monotonic()
            await broker.advance(2.0)
            assert time.monotonic() - began < QUICK
            info = broker.transaction(tid)
            assert (info.state, info.producer_epoch) == ("CompleteAbort", epoch + 1)
            assert broker.last_stable_offset(topic) == broker.offsets(topic)[0].high_watermark
            with pytest.raises(AioKafkaError):
                await producer.commit_transaction()
        finally:
            await producer.stop()


@pytest.mark.anyio
async def test_retention_by_time_deletes_what_the_advance_made_old() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = name("t")
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(topic, 1, 1, topic_configs={"retention.ms": "60000"})]
            )
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, b"old %d" % i)
        finally:
            await producer.stop()
        await broker.advance(30.0)
        assert broker.offsets(topic)[0].log_start == 0  # half the retention: kept
        await broker.advance(31.0)
        offsets = broker.offsets(topic)[0]
        assert offsets.log_start == offsets.high_watermark == 3


@pytest.mark.anyio
async def test_a_fetch_keeps_its_real_max_wait_across_an_advance() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = name("t")
        broker.create_topic(topic)
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=2_000,
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            fetching = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0.3)  # the consumer's fetch is parked on the broker
            await broker.advance(3600.0)
            assert not fetching.done()  # an hour of broker time answers no fetch
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"now")
            finally:
                await producer.stop()
            record = await fetching
            assert record.value == b"now"
        finally:
            await consumer.stop()
