"""Groups as Kafka keeps them (issue 35): static membership (KIP-345), the session-timeout
bounds, and what a group may make the coordinator hold. The coordinator on virtual time
first, then raw frames over loopback, then the three clients' static members restarting
within their sessions."""

from __future__ import annotations

import asyncio
import datetime
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.heartbeat.v3.response import HeartbeatResponse
from kio.schema.join_group.v5 import request as join_v5
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.leave_group.v3 import request as leave_v3
from kio.schema.leave_group.v3.response import LeaveGroupResponse
from kio.schema.offset_commit.v7 import request as commit_v7
from kio.schema.offset_commit.v7.response import OffsetCommitResponse
from kio.schema.sync_group.v3 import request as sync_v3
from kio.schema.sync_group.v3.response import SyncGroupResponse
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i32Timedelta, i64

import aiopurgatory as ap
from aiopurgatory.kafka import BrokerThread, KafkaBroker, Limits
from aiopurgatory.kafka.groups import GroupCoordinator, GroupError, GroupState, JoinResult

from ..support.kafka_broker import kafka_cli_help, wire_broker, wire_topic
from ..support.kafka_wire import bounded as bounded_call

pytestmark = pytest.mark.anyio

TICK = 0.001
PROTOCOLS = [("range", b"r")]


# -- the coordinator on virtual time ------------------------------------------------------


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[GroupCoordinator, ap.ManualClock]]:
    clock = ap.ManualClock()
    groups = GroupCoordinator(initial_rebalance_delay=0.0, clock=clock)
    yield groups, clock
    groups.close()


def bounded(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Any]:
    """A watchdog: the test fails after 5 s instead of hanging (on virtual time, a
    request the coordinator never answers would wait forever)."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        async with asyncio.timeout(5):
            await test(*args, **kwargs)

    return run


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def advance(clock: ap.ManualClock, seconds: float) -> None:
    async with asyncio.timeout(5):
        await clock.advance(seconds)


def join(
    groups: GroupCoordinator,
    instance: str | None,
    member_id: str = "",
    *,
    group: str = "g",
    session: float = 10.0,
    protocols: list[tuple[str, bytes]] | None = None,
) -> asyncio.Task[JoinResult]:
    return asyncio.ensure_future(
        groups.join(
            group,
            member_id,
            group_instance_id=instance,
            client_id="c",
            session_timeout=session,
            rebalance_timeout=30.0,
            protocol_type="consumer",
            protocols=PROTOCOLS if protocols is None else protocols,
        )
    )


async def stable_pair(
    groups: GroupCoordinator, clock: ap.ManualClock, session: float = 10.0
) -> tuple[str, str]:
    """Static members ``a`` (the leader) and ``b`` in generation 1, assigned b"A" and b"B"."""
    a = join(groups, "a", session=session)
    await settle()
    first = await a  # a group of one at once (no initial delay)
    b = join(groups, "b", session=session)
    await settle()
    again = join(groups, "a", first.member_id, session=session)
    async with asyncio.timeout(5):
        led, second = await again, await b
    assert led.generation == second.generation == 2
    assert led.leader == first.member_id
    sync_b = asyncio.ensure_future(groups.sync("g", 2, second.member_id, {}))
    await settle()
    assignments = {first.member_id: b"A", second.member_id: b"B"}
    assert (await groups.sync("g", 2, first.member_id, assignments)).assignment == b"A"
    assert (await sync_b).assignment == b"B"
    assert groups.groups["g"].state is GroupState.STABLE
    return first.member_id, second.member_id


@bounded
async def test_a_static_member_back_within_its_session_keeps_its_assignment(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, old_b = await stable_pair(groups, clock)
    group = groups.groups["g"]
    joins = groups.join_purgatory.stats.completed
    back = await join(groups, "b")  # restarted: no member id, the same instance id
    assert back.error is GroupError.NONE
    assert back.member_id != old_b
    # The same generation, no rebalance: a keeps going undisturbed.
    assert (back.generation, back.leader, back.members) == (2, a, ())
    assert (group.state, group.generation) == (GroupState.STABLE, 2)
    assert groups.join_purgatory.stats.completed == joins
    assert list(group.members) == [a, back.member_id]
    assert group.static == {"a": a, "b": back.member_id}
    synced = await groups.sync("g", 2, back.member_id, {}, group_instance_id="b")
    assert (synced.error, synced.assignment) == (GroupError.NONE, b"B")
    assert groups.heartbeat("g", 2, a, group_instance_id="a") is GroupError.NONE
    # The replaced member id is fenced wherever it names its instance...
    fenced = GroupError.FENCED_INSTANCE_ID
    assert groups.heartbeat("g", 2, old_b, group_instance_id="b") is fenced
    assert (await groups.sync("g", 2, old_b, {}, group_instance_id="b")).error is fenced
    assert groups.commit("g", 2, old_b, {("t", 0): (1, "")}, group_instance_id="b") is fenced
    assert (await join(groups, "b", old_b)).error is fenced
    # ...and unknown where it does not (Kafka's answer to a member id it does not hold).
    assert groups.heartbeat("g", 2, old_b) is GroupError.UNKNOWN_MEMBER_ID
    assert group.offsets == {}
    assert (group.state, group.generation) == (GroupState.STABLE, 2)


@bounded
async def test_the_leader_back_is_told_the_leader_it_replaced_and_gets_its_assignment(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    """As Kafka answers JoinGroup before v9 (no KIP-814 skip_assignment): the returning
    leader is told the old leader id, so it syncs as a follower; it leads from then on."""
    groups, clock = coordinator
    old_a, b = await stable_pair(groups, clock)
    back = await join(groups, "a")
    assert (back.error, back.generation, back.leader, back.members) == (
        GroupError.NONE,
        2,
        old_a,
        (),
    )
    group = groups.groups["g"]
    assert group.leader == back.member_id
    assert (await groups.sync("g", 2, back.member_id, {})).assignment == b"A"
    # The next rebalance is led by the new member id, with every member's metadata.
    third = join(groups, None)
    await settle()
    rejoin_b = join(groups, "b", b)
    led = await join(groups, "a", back.member_id)
    assert led.leader == back.member_id
    assert {m[0] for m in led.members} == {back.member_id, b, (await third).member_id}
    assert ((await rejoin_b).generation, led.generation) == (3, 3)


@bounded
async def test_a_static_member_back_with_other_protocols_rebalances(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, old_b = await stable_pair(groups, clock)
    back = join(groups, "b", protocols=[("range", b"other topics")])
    await settle()
    group = groups.groups["g"]
    assert group.state is GroupState.PREPARING_REBALANCE
    assert old_b not in group.members
    led = await join(groups, "a", a)
    assert (await back).generation == led.generation == 3


@bounded
async def test_a_parked_request_of_the_replaced_member_is_answered_fenced(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, _ = coordinator
    a = await join(groups, "a")
    b = join(groups, "b")
    await settle()
    led = await join(groups, "a", a.member_id)
    first_b = await b
    # b waits for the leader's assignment; meanwhile a new process takes its instance.
    parked = asyncio.ensure_future(groups.sync("g", led.generation, first_b.member_id, {}))
    await settle()
    back = join(groups, "b")
    await settle()
    assert (await parked).error is GroupError.FENCED_INSTANCE_ID
    # Not stable: the replacement joins a rebalance, which a's rejoin completes.
    async with asyncio.timeout(5):
        again = await join(groups, "a", a.member_id)
        assert (await back).generation == again.generation == led.generation + 1


@bounded
async def test_a_static_members_session_expiry_removes_it_and_rebalances(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, b = await stable_pair(groups, clock, session=6.0)
    group = groups.groups["g"]
    for _ in range(3):  # a heartbeats, b is silent
        await advance(clock, 2.5)
        groups.heartbeat("g", 2, a, group_instance_id="a")
    assert b not in group.members
    assert group.static == {"a": a}
    assert group.state is GroupState.PREPARING_REBALANCE
    led = await join(groups, "a", a)
    assert (led.generation, [m[0] for m in led.members]) == (3, [a])
    # b back after its session: a new member, which takes a rebalance.
    back = join(groups, "b", session=6.0)
    await settle()
    assert group.state is GroupState.PREPARING_REBALANCE
    again = await join(groups, "a", a, session=6.0)
    assert (await back).generation == again.generation == 4


@bounded
async def test_leave_group_by_instance_id(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, old_b = await stable_pair(groups, clock)
    back = await join(groups, "b")
    results = groups.leave_members(
        "g",
        [
            ("", "nobody"),  # no such instance
            (old_b, "b"),  # the replaced member id: fenced
            (a, "b"),  # a member id that does not hold this instance
            ("", "b"),  # an admin removing the static member by instance id
        ],
    )
    assert [error for _, error in results] == [
        GroupError.UNKNOWN_MEMBER_ID,
        GroupError.FENCED_INSTANCE_ID,
        GroupError.FENCED_INSTANCE_ID,
        GroupError.NONE,
    ]
    group = groups.groups["g"]
    assert back.member_id not in group.members
    assert group.static == {"a": a}
    assert group.state is GroupState.PREPARING_REBALANCE
    assert groups.leave_members("g", [(a, "a")]) == [((a, "a"), GroupError.NONE)]
    assert groups.groups == {}  # no members, no offsets: gone
    assert groups.held_bytes == 0
    assert groups.leave_members("g", [("", "a")]) == [(("", "a"), GroupError.UNKNOWN_MEMBER_ID)]


@bounded
async def test_session_timeouts_outside_kafkas_bounds_are_refused(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, _ = coordinator
    assert (groups.min_session_timeout, groups.max_session_timeout) == (6.0, 1800.0)
    for bad in (5.999, 1800.001, 0.0):
        refused = await join(groups, None, session=bad)
        assert refused.error is GroupError.INVALID_SESSION_TIMEOUT, bad
    assert groups.groups == {}
    for good in (6.0, 1800.0):
        assert (await join(groups, None, group=f"g{good}", session=good)).error is GroupError.NONE


@bounded
async def test_ids_metadata_and_assignments_are_bounded(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, _ = coordinator
    groups.max_member_bytes = 1000
    long_id = "x" * 256
    assert (await join(groups, None, group=long_id)).error is GroupError.INVALID_GROUP_ID
    assert (await join(groups, None, group="")).error is GroupError.INVALID_GROUP_ID
    assert (await join(groups, long_id)).error is GroupError.INVALID_REQUEST
    assert (await join(groups, None, long_id)).error is GroupError.INVALID_REQUEST
    too_much = [("range", b"m" * 996)]  # 5 + 996 bytes
    assert (await join(groups, None, protocols=too_much)).error is GroupError.INVALID_REQUEST
    assert groups.commit(long_id, -1, "", {("t", 0): (1, "")}) is GroupError.INVALID_GROUP_ID
    assert (groups.groups, groups.held_bytes) == ({}, 0)
    # At the limits: accepted.
    first = await join(groups, "i" * 255, protocols=[("range", b"m" * 995)])
    assert first.error is GroupError.NONE
    held = groups.held_bytes
    assert held == len(first.member_id) + 255 + len("c") + len("consumer") + 1000
    # The leader's assignment beyond the member limit: refused, the generation waits.
    big = {first.member_id: b"a" * 1001}
    refused = await groups.sync("g", 1, first.member_id, big)
    assert refused.error is GroupError.INVALID_REQUEST
    group = groups.groups["g"]
    assert (group.state, group.members[first.member_id].assignment) == (
        GroupState.COMPLETING_REBALANCE,
        b"",
    )
    # All the coordinator holds, over every group: the budget.
    groups.max_held_bytes = held + 500
    synced = await groups.sync("g", 1, first.member_id, {first.member_id: b"a" * 501})
    assert synced.error is GroupError.COORDINATOR_NOT_AVAILABLE
    assert (await groups.sync("g", 1, first.member_id, {first.member_id: b"a" * 400})).error is (
        GroupError.NONE
    )
    assert groups.held_bytes == held + 400
    other = await join(groups, None, group="other", protocols=[("range", b"m" * 200)])
    assert other.error is GroupError.COORDINATOR_NOT_AVAILABLE
    assert "other" not in groups.groups
    groups.leave("g", [first.member_id])
    assert (groups.groups, groups.held_bytes) == ({}, 0)
    assert (await join(groups, None, group="other")).error is GroupError.NONE


@bounded
async def test_offsets_go_with_their_deleted_topic(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, _ = coordinator
    assert groups.commit("only-t", -1, "", {("t", 0): (5, "")}) is GroupError.NONE
    assert groups.commit("both", -1, "", {("t", 1): (6, ""), ("u", 0): (7, "")}) is (
        GroupError.NONE
    )
    groups.forget_topic("t")
    assert list(groups.groups) == ["both"]  # empty and without offsets: gone
    assert groups.committed("both", None) == {("u", 0): (7, "")}


# -- raw frames over loopback -------------------------------------------------------------


def ms_delta(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


def static_join(
    group: str, instance: str | None, member_id: str = "", session_ms: int = 10_000
) -> join_v5.JoinGroupRequest:
    return join_v5.JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=ms_delta(session_ms),
        rebalance_timeout=ms_delta(30_000),
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=(join_v5.JoinGroupRequestProtocol(name="range", metadata=b"r"),),
    )


def static_sync(
    group: str, generation: int, member_id: str, instance: str, assignment: bytes | None
) -> sync_v3.SyncGroupRequest:
    assignments: tuple[sync_v3.SyncGroupRequestAssignment, ...] = ()
    if assignment is not None:
        assignments = (
            sync_v3.SyncGroupRequestAssignment(member_id=member_id, assignment=assignment),
        )
    return sync_v3.SyncGroupRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=instance,
        assignments=assignments,
    )


def static_commit(group: str, generation: int, member_id: str, instance: str) -> Any:
    return commit_v7.OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(generation),
        member_id=member_id,
        group_instance_id=instance,
        topics=(
            commit_v7.OffsetCommitRequestTopic(
                name=TopicName("t"),
                partitions=(
                    commit_v7.OffsetCommitRequestPartition(
                        partition_index=i32(0), committed_offset=i64(3), committed_metadata=""
                    ),
                ),
            ),
        ),
    )


def test_the_replaced_member_is_fenced_and_leave_group_names_instances_on_the_wire() -> None:
    with wire_broker() as (broker, wire):
        wire_topic(wire, "t")
        first = wire.call(static_join("g", "i"), JoinGroupResponse)
        assert (first.error_code, first.generation_id) == (ErrorCode.none, 1)
        old = first.member_id
        synced = wire.call(static_sync("g", 1, old, "i", b"mine"), SyncGroupResponse)
        assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"mine")
        # The instance restarts: an empty member id, the same instance id.
        back = wire.call(static_join("g", "i"), JoinGroupResponse)
        assert (back.error_code, back.generation_id, back.leader) == (ErrorCode.none, 1, old)
        new = back.member_id
        assert new != old
        again = wire.call(static_sync("g", 1, new, "i", None), SyncGroupResponse)
        assert (again.error_code, again.assignment) == (ErrorCode.none, b"mine")
        fenced = ErrorCode.fenced_instance_id
        heartbeat = HeartbeatRequest(
            group_id=GroupId("g"), generation_id=i32(1), member_id=old, group_instance_id="i"
        )
        assert wire.call(heartbeat, HeartbeatResponse).error_code is fenced
        assert wire.call(static_sync("g", 1, old, "i", None), SyncGroupResponse).error_code is (
            fenced
        )
        committed = wire.call(static_commit("g", 1, old, "i"), OffsetCommitResponse)
        assert committed.topics[0].partitions[0].error_code is fenced
        assert wire.call(static_join("g", "i", old), JoinGroupResponse).error_code is fenced
        assert broker.groups.groups["g"].offsets == {}
        committed = wire.call(static_commit("g", 1, new, "i"), OffsetCommitResponse)
        assert committed.topics[0].partitions[0].error_code is ErrorCode.none
        left = wire.call(
            leave_v3.LeaveGroupRequest(
                group_id=GroupId("g"),
                members=(
                    leave_v3.MemberIdentity(member_id="", group_instance_id="nobody"),
                    leave_v3.MemberIdentity(member_id=old, group_instance_id="i"),
                    leave_v3.MemberIdentity(member_id="", group_instance_id="i"),
                ),
            ),
            LeaveGroupResponse,
        )
        assert left.error_code is ErrorCode.none
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in left.members] == [
            ("", "nobody", ErrorCode.unknown_member_id),
            (old, "i", fenced),
            ("", "i", ErrorCode.none),
        ]
        group = broker.groups.groups["g"]  # its offsets keep it
        assert (group.state, group.members, group.static) == (GroupState.EMPTY, {}, {})


def test_session_timeout_bounds_on_the_wire() -> None:
    with wire_broker() as (broker, wire):
        for bad in (5999, 1_800_001):
            refused = wire.call(static_join("g", None, session_ms=bad), JoinGroupResponse)
            assert refused.error_code is ErrorCode.invalid_session_timeout, bad
        assert broker.groups.groups == {}
        for good in (6000, 1_800_000):
            joined = wire.call(static_join(f"g{good}", None, session_ms=good), JoinGroupResponse)
            assert joined.error_code is ErrorCode.none, good
    # The bounds are options: short sessions for tests that want members to die fast.
    with wire_broker(group_min_session_timeout_ms=1000, group_max_session_timeout_ms=2000) as (
        broker,
        wire,
    ):
        assert (broker.groups.min_session_timeout, broker.groups.max_session_timeout) == (1.0, 2.0)
        codes = [
            wire.call(static_join(f"h{ms}", None, session_ms=ms), JoinGroupResponse).error_code
            for ms in (999, 1000, 2000, 2001)
        ]
        assert codes == [
            ErrorCode.invalid_session_timeout,
            ErrorCode.none,
            ErrorCode.none,
            ErrorCode.invalid_session_timeout,
        ]


def test_the_group_limits_are_options() -> None:
    defaults = Limits()
    assert (defaults.group_min_session_timeout_ms, defaults.group_max_session_timeout_ms) == (
        6000,
        1_800_000,
    )
    with pytest.raises(ValueError, match="group_min_session_timeout_ms"):
        Limits(group_min_session_timeout_ms=10_000, group_max_session_timeout_ms=9_000)
    with pytest.raises(ValueError, match="max_member_metadata_bytes"):
        Limits(max_member_metadata_bytes=10, max_group_bytes=9)
    cli_help = kafka_cli_help()
    for option in (
        "--group-min-session-timeout-ms",
        "--group-max-session-timeout-ms",
        "--max-group-id-chars",
        "--max-member-metadata-bytes",
        "--max-group-bytes",
    ):
        assert option in cli_help, option
    with wire_broker(max_group_id_chars=8, max_member_metadata_bytes=100) as (broker, wire):
        assert wire.call(static_join("g" * 9, None), JoinGroupResponse).error_code is (
            ErrorCode.invalid_group_id
        )
        assert wire.call(static_join("g", "i" * 9), JoinGroupResponse).error_code is (
            ErrorCode.invalid_request
        )
        joined = wire.call(static_join("g" * 8, "i" * 8), JoinGroupResponse)
        assert joined.error_code is ErrorCode.none
        too_big = wire.call(
            static_sync("g" * 8, 1, joined.member_id, "i" * 8, b"x" * 101), SyncGroupResponse
        )
        assert too_big.error_code is ErrorCode.invalid_request
        assert broker.groups.max_held_bytes == Limits().max_group_bytes


async def test_offsets_committed_for_a_deleted_topic_go_with_it() -> None:
    async with asyncio.timeout(10), KafkaBroker() as broker:
        broker.create_topic("t")
        broker.create_topic("u")
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="g")
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition("t", 0), AioTopicPartition("u", 0)])
            await consumer.commit({AioTopicPartition("t", 0): 5, AioTopicPartition("u", 0): 6})
            assert broker.committed("g") == {("t", 0): 5, ("u", 0): 6}
            broker.delete_topic("t")
            assert broker.committed("g") == {("u", 0): 6}
            broker.create_topic("t")  # the same name again: a new topic, nothing committed
            assert await consumer.committed(AioTopicPartition("t", 0)) is None
            broker.delete_topic("u")
            assert broker.list_groups() == []  # empty, without offsets: gone
        finally:
            await consumer.stop()


# -- the clients' static members restarting within their sessions ------------------------


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def test_an_aiokafka_static_member_restarts_without_a_rebalance() -> None:
    """aiokafka sends its group_instance_id in JoinGroup v5 and SyncGroup v3 and no
    LeaveGroup when it stops: restarted within its session (10 s, its default) it gets
    its partitions back at the same generation, and the other member never rebalances."""
    topic, group_id = name("t"), name("g")
    async with asyncio.timeout(30), KafkaBroker() as broker:
        broker.create_topic(topic, 4)

        def consumer(instance: str) -> AIOKafkaConsumer:
            return AIOKafkaConsumer(
                topic,
                bootstrap_servers=broker.bootstrap,
                group_id=group_id,
                group_instance_id=instance,
            )

        a, b = consumer("static-a"), consumer("static-b")
        await a.start()
        await b.start()
        try:
            group = broker.groups.groups[group_id]

            def settled() -> bool:
                return (
                    group.state is GroupState.STABLE
                    and len(group.members) == 2
                    and len(a.assignment()) + len(b.assignment()) == 4
                )

            while not settled():
                await asyncio.gather(a.getmany(timeout_ms=50), b.getmany(timeout_ms=50))
            generation, joins = group.generation, broker.groups.join_purgatory.stats.completed
            mine, theirs = b.assignment(), a.assignment()
            await b.stop()  # no LeaveGroup: the instance keeps its place
            assert len(group.members) == 2
            b = consumer("static-b")
            await b.start()
            while b.assignment() != mine:
                await asyncio.gather(a.getmany(timeout_ms=50), b.getmany(timeout_ms=50))
            assert (group.generation, group.state) == (generation, GroupState.STABLE)
            assert broker.groups.join_purgatory.stats.completed == joins
            assert a.assignment() == theirs
            assert sorted(group.static) == ["static-a", "static-b"]
        finally:
            await asyncio.gather(a.stop(), b.stop())


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_other_clients_static_members_restart_without_a_rebalance(client: str) -> None:
    """confluent-kafka (``group.instance.id``, JoinGroup v5, Heartbeat and OffsetCommit
    with it) and kafka-python (``group_instance_id``): a static member closed and started
    again under the same instance id within its session (their defaults: 45 s, 10 s) is
    back at the same generation with the same partitions."""
    topic, group_id = name("t"), name("g")
    broker_thread = BrokerThread()
    with broker_thread as bootstrap_address:
        broker_thread.create_topic(topic, 2)

        def make() -> Any:
            if client == "confluent-kafka":
                consumer = confluent_kafka.Consumer(
                    {
                        "bootstrap.servers": bootstrap_address,
                        "group.id": group_id,
                        "group.instance.id": "static-1",
                        "auto.offset.reset": "earliest",
                    }
                )
                consumer.subscribe([topic])
                return consumer
            consumer = kafka.KafkaConsumer(
                bootstrap_servers=bootstrap_address,
                group_id=group_id,
                group_instance_id="static-1",
            )
            # kafka-python joins with the metadata it has: asked first, the topic's
            # partitions are in it (else its leader assigns nothing and never retries).
            assert consumer.partitions_for_topic(topic) == {0, 1}
            consumer.subscribe([topic])
            return consumer

        def assigned(consumer: Any) -> set[tuple[str, int]]:
            if client == "confluent-kafka":
                consumer.poll(0.05)
                return {(tp.topic, tp.partition) for tp in consumer.assignment()}
            consumer.poll(timeout_ms=50)
            return {(tp.topic, tp.partition) for tp in consumer.assignment()}

        def scenario() -> None:
            first = make()
            try:
                deadline = time.monotonic() + 15
                while assigned(first) != {(topic, 0), (topic, 1)}:
                    assert time.monotonic() < deadline, "never assigned"
            finally:
                first.close()
            info = broker_thread.group(group_id)
            generation, (old,) = info.generation, info.members  # closed, not left
            second = make()
            try:
                deadline = time.monotonic() + 15
                while assigned(second) != {(topic, 0), (topic, 1)}:
                    assert time.monotonic() < deadline, "never assigned again"
                info = broker_thread.group(group_id)
                assert (info.generation, info.state) == (generation, "Stable")
                (new,) = info.members
                assert new != old  # the instance's new member id replaced the old one
            finally:
                second.close()

        bounded_call(scenario, timeout=40)
        negotiated = broker_thread.call(lambda broker: dict(broker.negotiated))
    # Static membership needs JoinGroup v5+ and SyncGroup v3+ (the instance id's fields).
    versions = {(api, version) for (_, api, version) in negotiated}
    print(client, sorted(v for v in versions if v[0] in (8, 11, 12, 13, 14)))
    assert max(v for api, v in versions if api == 11) >= 5
    assert max(v for api, v in versions if api == 14) >= 3
