"""Consumer groups on the Kafka-protocol broker (aiopurgatory.kafka): the coordinator
on virtual time (aiopurgatory.kafka.groups), then the three clients subscribing in groups
over loopback, a member killed with SIGKILL, and committed offsets surviving a restart."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2 import request as find_v2
from kio.schema.find_coordinator.v2.response import (
    FindCoordinatorResponse as FindCoordinatorResponseV2,
)
from kio.schema.find_coordinator.v4 import request as find_v4
from kio.schema.find_coordinator.v4.response import (
    FindCoordinatorResponse as FindCoordinatorResponseV4,
)
from kio.schema.heartbeat.v1.request import HeartbeatRequest
from kio.schema.heartbeat.v1.response import HeartbeatResponse
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.leave_group.v1.request import LeaveGroupRequest
from kio.schema.leave_group.v1.response import LeaveGroupResponse
from kio.schema.offset_commit.v3.response import OffsetCommitResponse
from kio.schema.offset_fetch.v3.request import OffsetFetchRequest
from kio.schema.offset_fetch.v3.response import OffsetFetchResponse
from kio.schema.types import GroupId
from kio.static.primitive import i8, i32

import aiopurgatory as ap
from aiopurgatory.kafka import BrokerThread, KafkaBroker, Limits, protocol
from aiopurgatory.kafka.groups import GroupCoordinator, GroupError, GroupState

from ..support.kafka_broker import (
    assert_unknown_server_error_at_every_version,
    commit_v3_request,
    join_v5_request,
    kafka_cli_help,
    start_broker_process,
    start_traced_broker,
    wire_broker,
    wire_topic,
)
from ..support.kafka_wire import FlexibleWire, Wire
from ..support.servers import ROOT, stop_server

pytestmark = pytest.mark.anyio

TICK = 0.001
REBALANCE_DELAY_MS = 200
PROTOCOLS = [("range", b"r"), ("roundrobin", b"rr")]


# -- the coordinator on virtual time ------------------------------------------------------


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[GroupCoordinator, ap.ManualClock]]:
    clock = ap.ManualClock()
    # Sessions of 1 s, below Kafka's group.min.session.timeout.ms (6 s): allowed here.
    groups = GroupCoordinator(initial_rebalance_delay=0.5, min_session_timeout=1.0, clock=clock)
    yield groups, clock
    groups.close()


async def advance(clock: ap.ManualClock, seconds: float) -> None:
    async with asyncio.timeout(5):
        await clock.advance(seconds)


def join(
    groups: GroupCoordinator,
    member_id: str = "",
    *,
    session: float = 10.0,
    rebalance: float = 30.0,
    protocols: list[tuple[str, bytes]] | None = None,
) -> asyncio.Task[Any]:
    return asyncio.ensure_future(
        groups.join(
            "g",
            member_id,
            group_instance_id=None,
            client_id="c",
            session_timeout=session,
            rebalance_timeout=rebalance,
            protocol_type="consumer",
            protocols=PROTOCOLS if protocols is None else protocols,
        )
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_first_generation_waits_the_initial_delay_and_gathers_everyone(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a = join(groups)
    await advance(clock, 0.2)
    b = join(groups, protocols=[("roundrobin", b"x"), ("range", b"y")])
    await advance(clock, 0.3 - TICK)
    assert not a.done()
    assert not b.done()
    await advance(clock, 2 * TICK)
    await settle()
    first, second = a.result(), b.result()
    assert first.error is second.error is GroupError.NONE
    assert first.generation == second.generation == 1
    assert first.leader == second.leader == first.member_id
    assert [m[0] for m in first.members] == [first.member_id, second.member_id]
    assert second.members == ()  # only the leader gets the members
    # One vote each; a tie goes to the leader's preference.
    assert first.protocol_name == "range"


async def test_a_silent_member_expires_at_its_session_timeout_and_the_group_rebalances(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, b = join(groups, session=1.0, rebalance=5.0), join(groups, session=1.0, rebalance=5.0)
    await advance(clock, 0.5 + TICK)
    await settle()
    first, second = a.result(), b.result()
    sync_b = asyncio.ensure_future(groups.sync("g", 1, second.member_id, {}))
    await settle()
    assignments = {first.member_id: b"A", second.member_id: b"B"}
    assert (await groups.sync("g", 1, first.member_id, assignments)).assignment == b"A"
    assert (await sync_b).assignment == b"B"
    # a keeps heartbeating, b falls silent after its SyncGroup (at 0.501).
    group = groups.groups["g"]
    for _ in range(2):
        await advance(clock, 0.4)
        assert groups.heartbeat("g", 1, first.member_id) is GroupError.NONE
    await advance(clock, 1.501 - clock.time() - TICK)
    assert second.member_id in group.members  # not early
    await advance(clock, 2 * TICK)
    assert second.member_id not in group.members  # expired after 1 s of silence
    assert first.member_id in group.members
    assert group.state is GroupState.PREPARING_REBALANCE
    assert groups.heartbeat("g", 1, first.member_id) is GroupError.REBALANCE_IN_PROGRESS
    # a rejoins: it is every known member, so the rebalance completes at once.
    rejoined = await join(groups, first.member_id, session=1.0, rebalance=5.0)
    assert (rejoined.generation, [m[0] for m in rejoined.members]) == (2, [first.member_id])


async def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, b = join(groups, session=30.0, rebalance=2.0), join(groups, session=30.0, rebalance=2.0)
    await advance(clock, 0.5 + TICK)
    await settle()
    first = a.result()
    c = join(groups, session=30.0, rebalance=2.0)  # a third member: a rebalance
    await settle()
    again = join(groups, first.member_id, session=30.0, rebalance=2.0)
    await advance(clock, 2.0 - TICK)
    assert not again.done()  # b has not rejoined
    await advance(clock, 2 * TICK)
    await settle()
    assert again.result().generation == c.result().generation == 2
    assert {m[0] for m in again.result().members} == {first.member_id, c.result().member_id}
    assert b.result().member_id not in groups.groups["g"].members


async def test_the_leader_rejoining_a_stable_group_starts_a_rebalance(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    """As Kafka's coordinator: a leader's JoinGroup in a Stable group rebalances even with
    its metadata unchanged (it rejoins when what its assignment depends on changed, say a
    topic's partitions it had no metadata for), a follower's is answered at once."""
    groups, clock = coordinator
    a, b = join(groups), join(groups)
    await advance(clock, 0.5 + TICK)
    await settle()
    first, second = a.result(), b.result()
    sync_b = asyncio.ensure_future(groups.sync("g", 1, second.member_id, {}))
    await settle()
    await groups.sync("g", 1, first.member_id, {first.member_id: b"", second.member_id: b""})
    await sync_b
    group = groups.groups["g"]
    assert group.state.value == "Stable"  # (not narrowed: the state changes below)
    again = await join(groups, second.member_id)  # the follower: the same generation
    assert (again.error, again.generation) == (GroupError.NONE, 1)
    leader = join(groups, first.member_id)
    await settle()
    assert group.state is GroupState.PREPARING_REBALANCE
    follower = join(groups, second.member_id)
    rejoined, followed = await leader, await follower
    assert rejoined.generation == followed.generation == 2
    assert [m[0] for m in rejoined.members] == [first.member_id, second.member_id]


async def test_leave_hands_over_and_offsets_survive(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    a, b = join(groups), join(groups)
    await advance(clock, 0.5 + TICK)
    await settle()
    first, second = a.result(), b.result()
    # Not while the generation is being handed out (CompletingRebalance)...
    assert groups.commit("g", 1, first.member_id, {("t", 0): (6, "")}) is (
        GroupError.REBALANCE_IN_PROGRESS
    )
    await groups.sync("g", 1, first.member_id, {})
    assert groups.commit("g", 1, first.member_id, {("t", 0): (7, "m")}) is GroupError.NONE
    assert groups.commit("g", 0, first.member_id, {("t", 0): (8, "")}) is (
        GroupError.ILLEGAL_GENERATION
    )
    assert groups.leave("g", [second.member_id]) == [(second.member_id, GroupError.NONE)]
    rejoined = await join(groups, first.member_id)
    assert rejoined.generation == 2
    assert groups.committed("g", [("t", 0), ("t", 1)]) == {("t", 0): (7, "m"), ("t", 1): (-1, "")}
    assert groups.join_purgatory.num_delayed() == 0


# -- the group table: refused requests create nothing, empty groups go ------------------

RETENTION = 7 * 24 * 3600.0  # Kafka's offsets.retention.minutes, 10080


@pytest.fixture
async def small() -> AsyncIterator[tuple[GroupCoordinator, ap.ManualClock]]:
    """A coordinator with room for one group: a group left behind would block the next."""
    clock = ap.ManualClock()
    groups = GroupCoordinator(initial_rebalance_delay=0.5, max_groups=1, clock=clock)
    yield groups, clock
    groups.close()


async def formed(groups: GroupCoordinator, clock: ap.ManualClock, group_id: str = "g") -> str:
    """One member in a stable generation of ``group_id``: its member id."""
    task = asyncio.ensure_future(
        groups.join(
            group_id,
            "",
            group_instance_id=None,
            client_id="c",
            session_timeout=10.0,
            rebalance_timeout=30.0,
            protocol_type="consumer",
            protocols=PROTOCOLS,
        )
    )
    await advance(clock, 0.5 + TICK)
    await settle()
    result = task.result()
    assert result.error is GroupError.NONE
    sync = await groups.sync(group_id, result.generation, result.member_id, {})
    assert sync.error is GroupError.NONE
    return str(result.member_id)


async def test_a_refused_join_or_commit_creates_no_group(
    small: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = small
    for i in range(50):
        refused = await groups.join(
            f"g{i}",
            "made-up-member",
            group_instance_id=None,
            client_id="c",
            session_timeout=10.0,
            rebalance_timeout=30.0,
            protocol_type="consumer",
            protocols=PROTOCOLS,
        )
        assert refused.error is GroupError.UNKNOWN_MEMBER_ID
        assert groups.commit(f"h{i}", 3, "made-up-member", {("t", 0): (1, "")}) is (
            GroupError.UNKNOWN_MEMBER_ID
        )
    bad_session = join(groups, session=1e9)
    assert (await bad_session).error is GroupError.INVALID_SESSION_TIMEOUT
    assert groups.groups == {}
    # The one place in the table is still free for a real group.
    await formed(groups, clock)
    assert list(groups.groups) == ["g"]


async def test_an_empty_group_without_offsets_goes_at_once(
    small: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = small
    member = await formed(groups, clock, "a")
    old = groups.groups["a"]
    assert groups.leave("a", [member]) == [(member, GroupError.NONE)]
    assert groups.groups == {}
    assert old.state is GroupState.DEAD
    await formed(groups, clock, "b")  # room for another
    # A member whose session expires empties its group too.
    await advance(clock, 10.0 + TICK)
    assert groups.groups == {}
    assert groups.heartbeat_purgatory.num_delayed() == 0


async def test_an_empty_groups_offsets_expire_after_the_retention(
    small: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = small
    member = await formed(groups, clock)
    assert groups.commit("g", 1, member, {("t", 0): (7, "m")}) is GroupError.NONE
    groups.leave("g", [member])
    group = groups.groups["g"]
    assert groups.groups["g"].state is GroupState.EMPTY  # (not narrowing group.state)
    await advance(clock, RETENTION - TICK)
    assert groups.committed("g", [("t", 0)]) == {("t", 0): (7, "m")}  # not early
    # A member joining stops the clock; leaving again starts it afresh.
    member = await formed(groups, clock)
    groups.leave("g", [member])
    await advance(clock, RETENTION - TICK)
    assert "g" in groups.groups
    # So does a standalone commit (generation -1, no member id) to the empty group.
    assert groups.commit("g", -1, "", {("t", 1): (3, "")}) is GroupError.NONE
    await advance(clock, RETENTION - TICK)
    assert groups.committed("g", None) == {("t", 0): (7, "m"), ("t", 1): (3, "")}
    await advance(clock, 2 * TICK)
    await settle()
    assert groups.groups == {}
    assert group.state is GroupState.DEAD
    assert groups.committed("g", [("t", 0)]) == {("t", 0): (-1, "")}
    # The table has room again: a standalone consumer's commit creates a group.
    assert groups.commit("other", -1, "", {("t", 0): (1, "")}) is GroupError.NONE
    assert groups.commit("third", -1, "", {("t", 0): (1, "")}) is (
        GroupError.COORDINATOR_NOT_AVAILABLE
    )
    assert groups.commit("third", -1, "", {}) is GroupError.NONE  # nothing to keep
    assert list(groups.groups) == ["other"]


async def test_the_coordinator_refuses_a_commit_with_metadata_beyond_its_limit(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, _ = coordinator
    offsets = {("t", 0): (1, "m" * 4096), ("t", 1): (2, "m" * 4097)}
    assert groups.commit("g", -1, "", offsets) is GroupError.OFFSET_METADATA_TOO_LARGE
    assert groups.groups == {}
    assert groups.commit("g", -1, "", {("t", 0): (1, "m" * 4096)}) is GroupError.NONE


# -- a bad timeout, a failing step: nothing half-changed ----------------------------------


async def test_a_negative_rebalance_timeout_is_refused_before_anything_changes(
    coordinator: tuple[GroupCoordinator, ap.ManualClock],
) -> None:
    groups, clock = coordinator
    for bad in (-0.001, -30.0, float("nan")):
        async with asyncio.timeout(5):  # a watchdog: accepted, it would wait for the clock
            refused = await join(groups, rebalance=bad)
        assert refused.error is GroupError.INVALID_SESSION_TIMEOUT
    assert groups.groups == {}
    first = await formed(groups, clock)
    # A known member too: refused, and the group keeps its generation.
    again = await join(groups, first, rebalance=-1.0)
    assert again.error is GroupError.INVALID_SESSION_TIMEOUT
    group = groups.groups["g"]
    assert (group.state, group.members[first].rebalance_timeout) == (GroupState.STABLE, 30.0)
    # The group still rebalances: a second member and the first rejoining end it.
    second = join(groups)
    await settle()
    async with asyncio.timeout(5):
        rejoined = await join(groups, first)
        assert rejoined.generation == (await second).generation == 2


class FailingJoins:
    """The join purgatory, refusing to register while ``failing`` (an injected bug)."""

    def __init__(self, real: ap.Purgatory) -> None:
        self.real = real
        self.failing = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def try_complete_else_watch(self, op: Any, keys: Any) -> Any:
        if self.failing:
            raise RuntimeError("injected")
        return self.real.try_complete_else_watch(op, keys)


async def test_a_join_that_fails_midway_leaves_the_group_as_it_was(
    coordinator: tuple[GroupCoordinator, ap.ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    groups, clock = coordinator
    first = await formed(groups, clock)
    failing = FailingJoins(groups.join_purgatory)
    monkeypatch.setattr(groups, "join_purgatory", failing)
    with pytest.raises(RuntimeError, match="injected"):
        await join(groups)  # a new member: its rebalance cannot be registered
    group = groups.groups["g"]
    assert (group.state, list(group.members), group.join_op) == (GroupState.STABLE, [first], None)
    assert groups.heartbeat_purgatory.num_delayed() == 1  # its session went with it
    with pytest.raises(RuntimeError, match="injected"):  # the first member of a new group
        await groups.join(
            "new",
            "",
            group_instance_id=None,
            client_id="c",
            session_timeout=10.0,
            rebalance_timeout=30.0,
            protocol_type="consumer",
            protocols=PROTOCOLS,
        )
    assert list(groups.groups) == ["g"]  # no group left without members
    failing.failing = False
    # Not wedged: the next member starts a rebalance that the first one's rejoin ends.
    second = join(groups)
    await settle()
    assert group.state is GroupState.PREPARING_REBALANCE
    async with asyncio.timeout(5):  # a watchdog: a wedged group would park these forever
        rejoined = await join(groups, first)
        assert rejoined.generation == (await second).generation == 2


# -- raw requests over loopback, to a broker in a thread -----------------------------------


def test_refused_joins_and_commits_leave_no_group_on_the_wire() -> None:
    """A broker with room for 3 groups: 30 JoinGroups and OffsetCommits of made-up members
    are refused (UNKNOWN_MEMBER_ID) and leave nothing; real groups then fit, and one that
    its last member leaves (no offsets) frees its place."""
    with wire_broker(max_groups=3) as (broker, wire):
        wire_topic(wire, "t")
        for i in range(30):
            refused = wire.call(join_v5_request(f"g{i}", "made-up-member"), JoinGroupResponse)
            assert refused.error_code is ErrorCode.unknown_member_id
            committed = wire.call(
                commit_v3_request(f"h{i}", {("t", 0): (1, "")}, generation=5),
                OffsetCommitResponse,
            )
            assert committed.topics[0].partitions[0].error_code is ErrorCode.unknown_member_id
        assert len(broker.groups.groups) == 0
        for round_ in range(3):  # more groups in turn than the table holds
            members = []
            for i in range(3):
                joined = wire.call(join_v5_request(f"r{round_}-{i}"), JoinGroupResponse)
                assert joined.error_code is ErrorCode.none, (round_, i)
                members.append((f"r{round_}-{i}", joined.member_id))
            full = wire.call(join_v5_request("one-more"), JoinGroupResponse)
            assert full.error_code is ErrorCode.coordinator_not_available
            for group, member_id in members:
                left = wire.call(
                    LeaveGroupRequest(group_id=GroupId(group), member_id=member_id),
                    LeaveGroupResponse,
                )
                assert left.error_code is ErrorCode.none
            assert len(broker.groups.groups) == 0


def test_a_negative_rebalance_timeout_is_refused_on_the_wire() -> None:
    with wire_broker() as (broker, wire):
        refused = wire.call(join_v5_request("g", rebalance_ms=-1), JoinGroupResponse)
        assert refused.error_code is ErrorCode.invalid_session_timeout
        assert len(broker.groups.groups) == 0
        joined = wire.call(join_v5_request("g"), JoinGroupResponse)
        assert (joined.error_code, joined.generation_id) == (ErrorCode.none, 1)
        # The member's rejoin with a negative timeout is refused too; the group serves on.
        again = wire.call(
            join_v5_request("g", joined.member_id, rebalance_ms=-5000), JoinGroupResponse
        )
        assert again.error_code is ErrorCode.invalid_session_timeout
        second = Wire(f"127.0.0.1:{broker.advertised_port}")
        try:
            second.send(join_v5_request("g"))  # a new member: a rebalance, generation 2
            group = broker.groups.groups["g"]
            wait_for(lambda: group.state is GroupState.PREPARING_REBALANCE, 5, "rebalancing")
            rejoined = wire.call(join_v5_request("g", joined.member_id), JoinGroupResponse)
            other = second.receive(JoinGroupResponse)
        finally:
            second.sock.close()
        assert (rejoined.error_code, rejoined.generation_id) == (ErrorCode.none, 2)
        assert (other.error_code, other.generation_id) == (ErrorCode.none, 2)


def test_a_failing_handler_answers_unknown_server_error_and_the_connection_serves_on() -> None:
    with wire_broker() as (broker, wire):
        joined = wire.call(join_v5_request("g"), JoinGroupResponse)
        assert joined.error_code is ErrorCode.none

        def broken(*args: object) -> None:
            raise RuntimeError("an injected bug")

        heartbeat = HeartbeatRequest(
            group_id=GroupId("g"), generation_id=i32(1), member_id=joined.member_id
        )
        broker.groups.heartbeat = broken  # an instance attribute, read on the broker's loop
        try:
            answer = wire.call(heartbeat, HeartbeatResponse)
        finally:
            del broker.groups.heartbeat
        assert answer.error_code is ErrorCode.unknown_server_error
        assert wire.call(heartbeat, HeartbeatResponse).error_code is ErrorCode.none


def test_offset_commits_are_kept_only_for_existing_partitions_with_bounded_metadata() -> None:
    """Kafka's answers per partition: UNKNOWN_TOPIC_OR_PARTITION for a topic or partition
    that does not exist, OFFSET_METADATA_TOO_LARGE beyond offset.metadata.max.bytes;
    the other partitions of the same request are committed."""
    with wire_broker() as (broker, wire):
        wire_topic(wire, "t")  # partitions 0, 1, 2
        # What the finding sent: 30 kB topic names and 30 kB metadata, refused and not kept.
        for i in range(20):
            refused = wire.call(
                commit_v3_request(f"g{i}", {(f"{i:02d}" * 15_000, 0): (1, "m" * 30_000)}),
                OffsetCommitResponse,
            )
            assert refused.topics[0].partitions[0].error_code is (
                ErrorCode.unknown_topic_or_partition
            )
        too_large = wire.call(
            commit_v3_request("lonely", {("t", 1): (1, "m" * 30_000)}), OffsetCommitResponse
        )
        assert too_large.topics[0].partitions[0].error_code is ErrorCode.offset_metadata_too_large
        assert len(broker.groups.groups) == 0
        answer = wire.call(
            commit_v3_request(
                "g",
                {
                    ("t", 0): (10, "m" * 4096),  # at the limit: kept
                    ("t", 1): (11, "m" * 4097),
                    ("t", 2): (12, ""),
                    ("t", 3): (13, ""),  # no partition 3
                    ("absent", 0): (14, ""),
                },
            ),
            OffsetCommitResponse,
        )
        errors = {
            (topic.name, part.partition_index): part.error_code
            for topic in answer.topics
            for part in topic.partitions
        }
        assert errors == {
            ("t", 0): ErrorCode.none,
            ("t", 1): ErrorCode.offset_metadata_too_large,
            ("t", 2): ErrorCode.none,
            ("t", 3): ErrorCode.unknown_topic_or_partition,
            ("absent", 0): ErrorCode.unknown_topic_or_partition,
        }
        fetched = wire.call(
            OffsetFetchRequest(group_id=GroupId("g"), topics=None), OffsetFetchResponse
        )
        kept = {
            (topic.name, part.partition_index): (part.committed_offset, len(part.metadata or ""))
            for topic in fetched.topics
            for part in topic.partitions
        }
        assert kept == {("t", 0): (10, 4096), ("t", 2): (12, 0)}
        assert list(broker.groups.groups) == ["g"]


async def test_aiokafka_commit_with_metadata_beyond_the_limit_is_refused(broker: str) -> None:
    from aiokafka.errors import OffsetMetadataTooLargeError
    from aiokafka.structs import OffsetAndMetadata

    topic, group = name("t"), name("g")
    async with asyncio.timeout(20):
        await create_topic(broker, topic)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            with pytest.raises(OffsetMetadataTooLargeError):
                await consumer.commit({tp: OffsetAndMetadata(5, "x" * 4097)})
            await consumer.commit({tp: OffsetAndMetadata(6, "x" * 4096)})
            assert await consumer.committed(tp) == 6
        finally:
            await consumer.stop()


def test_offset_metadata_max_bytes_is_an_option() -> None:
    assert Limits().offset_metadata_max_bytes == 4096  # Kafka's default
    assert "--offset-metadata-max-bytes" in kafka_cli_help()
    with wire_broker(offset_metadata_max_bytes=10) as (broker, wire):
        wire_topic(wire, "t")
        answer = wire.call(
            commit_v3_request("g", {("t", 0): (1, "x" * 11), ("t", 1): (1, "x" * 10)}),
            OffsetCommitResponse,
        )
        assert [p.error_code for p in answer.topics[0].partitions] == [
            ErrorCode.offset_metadata_too_large,
            ErrorCode.none,
        ]
        # The coordinator itself refuses such a commit whole (for callers of its API).
        assert broker.groups.max_metadata_bytes == 10


def test_every_group_api_has_an_error_answer_at_every_version_served() -> None:
    """What a failing handler answers: UNKNOWN_SERVER_ERROR, encodable and readable back
    at each version the broker serves (its partitions too, for the offset APIs)."""
    broker = KafkaBroker()
    try:
        partition = SimpleNamespace(partition_index=3)
        topics = (SimpleNamespace(name="t", partitions=(partition,), partition_indexes=(3,)),)
        request = SimpleNamespace(
            member_id="m",
            topics=topics,
            coordinator_keys=("g1", "g2"),
            groups=(SimpleNamespace(group_id="g", topics=topics),),  # OffsetFetch v8+
        )
        apis = [
            protocol.JOIN_GROUP,
            protocol.SYNC_GROUP,
            protocol.HEARTBEAT,
            protocol.LEAVE_GROUP,
            protocol.FIND_COORDINATOR,
            protocol.OFFSET_COMMIT,
            protocol.OFFSET_FETCH,
        ]
        for api_key in apis:
            # FindCoordinator v4+: each key answered on its own.
            assert_unknown_server_error_at_every_version(broker, api_key, request)
        assert broker._error_response(protocol.PRODUCE, 8, request) is None  # not a group API
    finally:
        broker.groups.close()
        broker.core.close()


def test_find_coordinator_v4_answers_each_key_and_v2_one() -> None:
    """KIP-699: FindCoordinator v4 batches keys (``coordinator_keys``), each answered on
    its own, in order; v0-v3 keep the single key."""
    with BrokerThread() as bootstrap:
        host, port = bootstrap.rsplit(":", 1)
        wire = FlexibleWire(bootstrap)
        try:
            for key_type, error, node in (
                (0, ErrorCode.none, 0),
                (1, ErrorCode.none, 0),
                (2, ErrorCode.coordinator_not_available, -1),
            ):
                answer = wire.call(
                    find_v4.FindCoordinatorRequest(
                        key_type=i8(key_type), coordinator_keys=("g1", "g2", "g1")
                    ),
                    FindCoordinatorResponseV4,
                )
                assert [c.key for c in answer.coordinators] == ["g1", "g2", "g1"]
                for coordinator in answer.coordinators:
                    assert (coordinator.error_code, coordinator.node_id) == (error, node)
                    if node == 0:
                        assert (coordinator.host, coordinator.port) == (host, int(port))
            empty = wire.call(
                find_v4.FindCoordinatorRequest(key_type=i8(0), coordinator_keys=()),
                FindCoordinatorResponseV4,
            )
            assert empty.coordinators == ()
        finally:
            wire.sock.close()
        plain = Wire(bootstrap)
        try:
            single = plain.call(
                find_v2.FindCoordinatorRequest(key="g", key_type=i8(0)), FindCoordinatorResponseV2
            )
            assert (single.error_code, single.node_id, single.port) == (
                ErrorCode.none,
                0,
                int(port),
            )
        finally:
            plain.sock.close()


def test_kafka_python_finds_its_coordinator_with_v4() -> None:
    """kafka-python 3 negotiates FindCoordinator v4 (aiokafka stays at v1, librdkafka
    2.16 at v2) and commits through the coordinator it found."""
    thread = BrokerThread()
    with thread as bootstrap:
        topic, group = f"t-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:10]}"
        thread.create_topic(topic)
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, client_id="kp-v4"
        )
        try:
            tp = kafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.commit({tp: kafka.structs.OffsetAndMetadata(7, "", -1)})
            assert consumer.committed(tp) == 7
        finally:
            consumer.close()
        negotiated = thread.call(lambda broker: dict(broker.negotiated))
        assert ("kp-v4", protocol.FIND_COORDINATOR, 4) in negotiated
        assert thread.committed(group) == {(topic, 0): 7}


def test_offsets_retention_is_an_option() -> None:
    assert Limits().offsets_retention_minutes == 10080  # Kafka's default
    assert "--offsets-retention-minutes" in kafka_cli_help()
    broker = KafkaBroker(limits=Limits(offsets_retention_minutes=2))
    assert broker.groups.offsets_retention == 120.0
    broker.groups.close()
    broker.core.close()
    with pytest.raises(ValueError, match="offsets_retention_minutes"):
        Limits(offsets_retention_minutes=0)


# -- the clients, over loopback -----------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    process, address = start_broker_process(
        "--group-initial-rebalance-delay-ms",
        str(REBALANCE_DELAY_MS),
        # The members killed with SIGKILL have 1.5 s sessions, so that the tests last
        # seconds: below Kafka's group.min.session.timeout.ms (6 s), allowed explicitly.
        "--group-min-session-timeout-ms",
        "1000",
    )
    yield address
    assert stop_server(process) == 0


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def create_topic(broker: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker)
    await producer.start()
    try:
        await producer.partitions_for(topic)  # its Metadata request creates the topic
    finally:
        await producer.stop()


async def produce(broker: str, topic: str, count: int, start: int = 0, acks: int | str = 1) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks=acks)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, key=f"k{i % 17}".encode(), value=str(i).encode())
            for i in range(start, start + count)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def test_aiokafka_group_splits_hands_over_and_resumes(broker: str) -> None:
    topic, group = name("t"), name("g")
    async with asyncio.timeout(30):
        await produce(broker, topic, 300)
        settings: dict[str, Any] = {
            "bootstrap_servers": broker,
            "group_id": group,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": False,
        }
        a = AIOKafkaConsumer(topic, **settings)
        b = AIOKafkaConsumer(topic, **settings)
        await asyncio.gather(a.start(), b.start())  # one generation for both
        seen: list[int] = []
        try:
            while len(seen) < 300:
                for consumer in (a, b):
                    for records in (await consumer.getmany(timeout_ms=100)).values():
                        seen += [int(r.value) for r in records]
            assert sorted(seen) == list(range(300))
            assert len(a.assignment()) + len(b.assignment()) == 3
            assert a.assignment().isdisjoint(b.assignment())
            await a.commit()
            await b.commit()
        finally:
            await b.stop()  # LeaveGroup: a takes b's partitions
        started = time.monotonic()
        while len(a.assignment()) < 3:
            await a.getmany(timeout_ms=100)
        handed_over = time.monotonic() - started
        await a.stop()
        await produce(broker, topic, 30, start=300)
        # A restarted member resumes from the committed offsets: only the new records.
        c = AIOKafkaConsumer(topic, **settings)
        await c.start()
        later: list[int] = []
        try:
            while len(later) < 30:
                for records in (await c.getmany(timeout_ms=200)).values():
                    later += [int(r.value) for r in records]
            committed = [await c.committed(AioTopicPartition(topic, p)) for p in range(3)]
        finally:
            await c.stop()
    assert sorted(later) == list(range(300, 330))
    assert sum(o for o in committed if o is not None) == 300
    print(f"aiokafka: handed over after LeaveGroup in {handed_over * 1e3:.0f} ms")


VICTIMS = {
    "aiokafka": """
import asyncio, sys
from aiokafka import AIOKafkaConsumer

async def main(broker, topic, group):
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=broker, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, session_timeout_ms=1500, heartbeat_interval_ms=300,
    )
    await consumer.start()
    while True:
        batches = await consumer.getmany(timeout_ms=100)
        for tp, records in batches.items():
            for r in records:
                print("got", r.value.decode(), flush=True)
            await consumer.commit({tp: records[-1].offset + 1})
        print("assigned", len(consumer.assignment()), flush=True)

asyncio.run(main(*sys.argv[1:]))
""",
    "kafka-python": """
import sys
from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata

broker, topic, group = sys.argv[1:]
consumer = KafkaConsumer(
    topic, bootstrap_servers=broker, group_id=group, auto_offset_reset="earliest",
    enable_auto_commit=False, session_timeout_ms=1500, heartbeat_interval_ms=300,
)
while True:
    for tp, records in consumer.poll(timeout_ms=100).items():
        for r in records:
            print("got", r.value.decode(), flush=True)
        consumer.commit({tp: OffsetAndMetadata(records[-1].offset + 1, None, -1)})
    print("assigned", len(consumer.assignment()), flush=True)
""",
    "confluent-kafka": """
import sys
from confluent_kafka import Consumer

broker, topic, group = sys.argv[1:]
consumer = Consumer({
    "bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest",
    "enable.auto.commit": False, "session.timeout.ms": 1500, "heartbeat.interval.ms": 300,
})
consumer.subscribe([topic])
while True:
    messages = [m for m in consumer.consume(100, 0.1) if m.error() is None]
    for m in messages:
        print("got", m.value().decode(), flush=True)
    if messages:
        consumer.commit(asynchronous=False)
    print("assigned", len(consumer.assignment()), flush=True)
""",
}
"""A group member, run in its own process to be killed: it prints each record it gets
(after committing the batch it came in: at most one batch is seen and not committed)
and its share of the partitions."""


async def test_a_member_killed_with_sigkill_loses_its_partitions(broker: str) -> None:
    await sigkill_scenario(broker, "aiokafka")


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_other_clients_killed_with_sigkill_lose_their_partitions(broker: str, client: str) -> None:
    asyncio.run(sigkill_scenario(broker, client))


async def sigkill_scenario(broker: str, client: str) -> None:
    """An aiokafka member survives ``client``'s SIGKILL: it has all 3 partitions within
    the session timeout (1.5 s) and resumes the victim's at its committed offsets."""
    topic, group = name("t"), name("g")
    await produce(broker, topic, 90)
    victim = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        VICTIMS[client],
        broker,
        topic,
        group,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    survivor = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=1500,
        heartbeat_interval_ms=300,
    )
    seen: list[int] = []
    victim_seen: list[int] = []
    victim_assigned: list[int] = []
    assert victim.stdout is not None
    out = victim.stdout

    async def read_victim() -> None:
        async for raw in out:
            line = raw.decode()
            if line.startswith("got "):
                victim_seen.append(int(line.split()[1]))
            elif line.startswith("assigned "):
                victim_assigned.append(int(line.split()[1]))

    reader = asyncio.create_task(read_victim())

    async def poll_survivor() -> None:
        for tp, records in (await survivor.getmany(timeout_ms=100)).items():
            seen.extend(int(r.value) for r in records)
            await survivor.commit({tp: records[-1].offset + 1})

    try:
        async with asyncio.timeout(40):
            await survivor.start()
            # Until both hold a share and everything is consumed (and committed).
            while not (
                victim_assigned
                and victim_assigned[-1]
                and len(survivor.assignment()) == 3 - victim_assigned[-1]
                and len(seen) + len(victim_seen) >= 90
            ):
                await poll_survivor()
            await asyncio.sleep(0.3)  # its last commit
            victim.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            after: list[int] = []  # everything it gets from now on
            while len(survivor.assignment()) < 3:
                for records in (await survivor.getmany(timeout_ms=100)).values():
                    after += [int(r.value) for r in records]
            taken_over = time.monotonic() - killed
            await produce(broker, topic, 30, start=90)
            while len(after) < 30:
                for records in (await survivor.getmany(timeout_ms=100)).values():
                    after += [int(r.value) for r in records]
    finally:
        if victim.returncode is None:
            victim.kill()
        await asyncio.wait_for(victim.wait(), 10)
        await asyncio.wait_for(reader, 10)
        await survivor.stop()
    assert sorted(seen + victim_seen) == list(range(90))
    # The survivor resumed the victim's partitions at its committed offsets: nothing
    # of the first 90 again.
    assert sorted(after) == list(range(90, 120))
    assert taken_over < 1.5 + 1.0, f"taken over {taken_over:.2f} s after the SIGKILL"
    print(f"{client} killed: taken over in {taken_over * 1e3:.0f} ms (session 1500 ms)")


def test_kafka_python_group_round_trip_and_commit(broker: str) -> None:
    topic, group = name("t"), name("g")
    asyncio.run(produce(broker, topic, 200))

    def consume(count: int) -> tuple[list[int], int]:
        """The values a new member of ``group`` reads (``count``, or what it has after
        20 s), committed; and how many partitions it was assigned."""
        consumer = kafka.KafkaConsumer(
            topic, bootstrap_servers=broker, group_id=group, auto_offset_reset="earliest"
        )
        seen: list[int] = []
        try:
            deadline = time.monotonic() + 20
            while len(seen) < count and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    seen += [int(r.value) for r in records]
            consumer.commit()
            return seen, len(consumer.assignment())
        finally:
            consumer.close()

    seen, assigned = consume(200)
    assert assigned == 3
    assert sorted(seen) == list(range(200))
    asyncio.run(produce(broker, topic, 10, start=200))
    later, _ = consume(10)
    assert sorted(later) == list(range(200, 210))


def test_confluent_group_round_trip_and_commit(broker: str) -> None:
    topic, group = name("t"), name("g")
    asyncio.run(produce(broker, topic, 200))

    def consume(count: int) -> list[int]:
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest"}
        )
        seen: list[int] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 20
            while len(seen) < count and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=100, timeout=0.5):
                    assert message.error() is None, message.error()
                    value = message.value()
                    assert isinstance(value, bytes)
                    seen.append(int(value))
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return seen

    assert sorted(consume(200)) == list(range(200))
    asyncio.run(produce(broker, topic, 10, start=200))
    assert sorted(consume(10)) == list(range(200, 210))


def test_trace_records_every_kind_of_delayed_operation(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    trace = tmp_path / "trace"
    process, address = start_traced_broker(trace)
    try:
        topic, group = name("t"), name("g")
        asyncio.run(produce(address, topic, 20, acks="all"))  # DelayedProduce
        consumer = kafka.KafkaConsumer(
            topic, bootstrap_servers=address, group_id=group, auto_offset_reset="earliest"
        )
        try:
            seen = 0
            deadline = time.monotonic() + 20
            while seen < 20 and time.monotonic() < deadline:
                seen += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
        finally:
            consumer.close()
        assert seen == 20
    finally:
        assert stop_server(process) == 0
    rows = pq.read_table(trace).to_pydict()
    kinds = dict(zip(rows["purgatory"], rows["kind"], strict=True))
    assert set(kinds) == {"produce", "fetch", "join", "heartbeat"}
    print("traced:", {p: rows["purgatory"].count(p) for p in kinds})


def test_the_three_clients_share_one_group(broker: str) -> None:
    """aiokafka, kafka-python and confluent-kafka in one group: one partition each (the
    protocol chosen is one all three offer), every record delivered once."""
    topic, group = name("t"), name("g")
    asyncio.run(create_topic(broker, topic))
    got: dict[str, list[int]] = {"aiokafka": [], "kafka-python": [], "confluent": []}
    assigned: dict[str, list[int]] = {}
    stop = threading.Event()

    def kafka_python() -> None:
        consumer = kafka.KafkaConsumer(
            topic, bootstrap_servers=broker, group_id=group, auto_offset_reset="earliest"
        )
        try:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=100).values():
                    got["kafka-python"] += [int(r.value) for r in records]
                assigned["kafka-python"] = sorted(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()

    def confluent() -> None:
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest"}
        )
        try:
            consumer.subscribe([topic])
            while not stop.is_set():
                for message in consumer.consume(num_messages=100, timeout=0.1):
                    value = message.value()
                    assert message.error() is None
                    assert isinstance(value, bytes)
                    got["confluent"].append(int(value))
                assigned["confluent"] = sorted(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()

    async def aiokafka_member() -> float:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=broker, group_id=group, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            started = time.monotonic()
            while not (len(assigned) == 3 and all(len(p) == 1 for p in assigned.values())):
                assert time.monotonic() - started < 20, assigned
                await consumer.getmany(timeout_ms=100)
                assigned["aiokafka"] = sorted(tp.partition for tp in consumer.assignment())
            formed = time.monotonic() - started
            await produce(broker, topic, 90)
            while sum(map(len, got.values())) < 90 and time.monotonic() - started < 30:
                for records in (await consumer.getmany(timeout_ms=100)).values():
                    got["aiokafka"] += [int(r.value) for r in records]
            return formed
        finally:
            await consumer.stop()

    threads = [threading.Thread(target=kafka_python), threading.Thread(target=confluent)]
    for thread in threads:
        thread.start()
    try:
        formed = asyncio.run(aiokafka_member())
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert sorted(p for partitions in assigned.values() for p in partitions) == [0, 1, 2]
    assert sorted(v for values in got.values() for v in values) == list(range(90))
    assert all(got.values())
    print(f"three clients in one group: formed in {formed * 1e3:.0f} ms")


# -- kafka-python and confluent-kafka as the members that stay ----------------------------

SESSION = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 300}


class SyncMember:
    """A kafka-python or confluent-kafka group member (auto commit off), one interface."""

    def __init__(self, client: str, broker: str, topic: str, group: str, session: bool) -> None:
        self.client = client
        self.kafka: kafka.KafkaConsumer | None = None
        self.confluent: confluent_kafka.Consumer | None = None
        if client == "kafka-python":
            self.kafka = kafka.KafkaConsumer(
                topic,
                bootstrap_servers=broker,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                **(SESSION if session else {}),
            )
        else:
            config: dict[str, Any] = {
                "bootstrap.servers": broker,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
            if session:
                config |= {"session.timeout.ms": 1500, "heartbeat.interval.ms": 300}
            self.confluent = confluent_kafka.Consumer(config)
            self.confluent.subscribe([topic])

    def poll(self) -> list[int]:
        """What one poll (100 ms at most) brings, after committing it."""
        if self.kafka is not None:
            batches = self.kafka.poll(timeout_ms=100)
            values = [int(r.value) for records in batches.values() for r in records]
            if values:
                self.kafka.commit()
            return values
        assert self.confluent is not None
        messages = self.confluent.consume(num_messages=100, timeout=0.1)
        values = []
        for message in messages:
            assert message.error() is None, message.error()
            value = message.value()
            assert isinstance(value, bytes)
            values.append(int(value))
        if values:
            self.confluent.commit(asynchronous=False)
        return values

    def assigned(self) -> int:
        if self.kafka is not None:
            return len(self.kafka.assignment())
        assert self.confluent is not None
        return len(self.confluent.assignment())

    def close(self) -> None:  # LeaveGroup
        if self.kafka is not None:
            self.kafka.close()
        elif self.confluent is not None:
            self.confluent.close()


class MemberThread(threading.Thread):
    """A member polling in its own thread until ``stop()``; it closes (LeaveGroup) then.
    ``seen`` gets each record after its batch is committed."""

    def __init__(self, client: str, broker: str, topic: str, group: str, session: bool) -> None:
        super().__init__(daemon=True)
        self.args = (client, broker, topic, group, session)
        self.seen: list[int] = []
        self.assignment = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            member = SyncMember(*self.args)
            try:
                while not self.stopping.is_set():
                    self.seen += member.poll()
                    self.assignment = member.assigned()
            finally:
                member.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        assert not self.is_alive(), f"{self.args[0]} did not close"


def wait_for(condition: Any, seconds: float, what: str, *members: MemberThread) -> float:
    """Seconds until ``condition()`` holds; fails after ``seconds`` or on a member's error."""
    started = time.monotonic()
    while not condition():
        for member in members:
            assert member.error is None, member.error
        assert time.monotonic() - started < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_leave_hands_over_and_a_restart_resumes(broker: str, client: str) -> None:
    """Two members of ``client`` split 3 partitions; one closes (LeaveGroup) and the other
    takes its partitions at its committed offsets; a member started later resumes there."""
    topic, group = name("t"), name("g")
    asyncio.run(create_topic(broker, topic))
    a = MemberThread(client, broker, topic, group, session=False)
    b = MemberThread(client, broker, topic, group, session=False)
    c: MemberThread | None = None
    a.start()
    b.start()
    try:
        wait_for(lambda: a.assignment and b.assignment, 20, "both assigned", a, b)
        assert a.assignment + b.assignment == 3
        asyncio.run(produce(broker, topic, 300))
        wait_for(lambda: len(a.seen) + len(b.seen) >= 300, 20, "300 consumed", a, b)
        b.stop()  # LeaveGroup
        handed_over = wait_for(lambda: a.assignment == 3, 10, "a has all 3", a)
        time.sleep(0.3)  # a would get b's last records again now, were they not committed
        assert sorted(a.seen + b.seen) == list(range(300))
        a.stop()
        asyncio.run(produce(broker, topic, 30, start=300))
        c = MemberThread(client, broker, topic, group, session=False)
        c.start()
        wait_for(lambda: len(c.seen) >= 30, 20, "c resumed", c)
        time.sleep(0.3)
        assert sorted(c.seen) == list(range(300, 330))  # only the new ones
    finally:
        for member in (a, b, c):
            if member is not None and member.is_alive():
                member.stop()
    print(f"{client}: handed over after LeaveGroup in {handed_over * 1e3:.0f} ms")


@pytest.mark.parametrize(
    ("survivor_client", "victim_client"),
    [("kafka-python", "confluent-kafka"), ("confluent-kafka", "kafka-python")],
)
def test_other_clients_survive_a_member_killed_with_sigkill(
    broker: str, survivor_client: str, victim_client: str
) -> None:
    """``survivor_client`` stays: it has all 3 partitions within the session timeout
    (1.5 s) of ``victim_client``'s SIGKILL and resumes them at the committed offsets."""
    topic, group = name("t"), name("g")
    asyncio.run(create_topic(broker, topic))
    survivor = MemberThread(survivor_client, broker, topic, group, session=True)
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIMS[victim_client], broker, topic, group],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    victim_seen: list[int] = []
    victim_assigned: list[int] = []

    def read_victim() -> None:
        assert victim.stdout is not None
        for line in victim.stdout:
            if line.startswith("got "):
                victim_seen.append(int(line.split()[1]))
            elif line.startswith("assigned "):
                victim_assigned.append(int(line.split()[1]))

    reader = threading.Thread(target=read_victim, daemon=True)
    reader.start()
    survivor.start()
    try:

        def both_hold_a_share() -> bool:
            theirs = victim_assigned[-1] if victim_assigned else 0
            return bool(theirs and survivor.assignment == 3 - theirs)

        wait_for(both_hold_a_share, 30, "both assigned", survivor)
        asyncio.run(produce(broker, topic, 90))  # produced once the group is formed
        wait_for(lambda: len(survivor.seen) + len(victim_seen) >= 90, 20, "90", survivor)
        time.sleep(0.3)  # the victim's last commit
        before = len(survivor.seen)
        victim.kill()
        taken_over = wait_for(lambda: survivor.assignment == 3, 10, "taken over", survivor)
        asyncio.run(produce(broker, topic, 30, start=90))
        wait_for(lambda: len(survivor.seen) - before >= 30, 20, "30 more", survivor)
        time.sleep(0.3)
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait(timeout=10)
        reader.join(timeout=10)
        if victim.stdout is not None:
            victim.stdout.close()
        survivor.stop()
    assert sorted(survivor.seen[:before] + victim_seen) == list(range(90))
    # Nothing of the first 90 again: the victim's partitions resumed at its commits.
    assert sorted(survivor.seen[before:]) == list(range(90, 120))
    assert taken_over < 1.5 + 1.0, f"taken over {taken_over:.2f} s after the SIGKILL"
    print(
        f"{survivor_client} survived {victim_client}'s SIGKILL: "
        f"taken over in {taken_over * 1e3:.0f} ms (session 1500 ms)"
    )
