"""Kafka 4's consumer group protocol (KIP-848) against the broker: topic ids in
Metadata, the consumer-group coordinator on virtual time, the wire APIs
(ConsumerGroupHeartbeat, ConsumerGroupDescribe, OffsetCommit with member epochs) and
confluent-kafka with ``group.protocol=consumer``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.cimpl import NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12
from kio.schema.types import TopicName
from kio.static.primitive import i32

from aiopurgatory.kafka import BrokerThread
from aiopurgatory.kafka.assignors import range_assign, uniform
from aiopurgatory.kafka.consumer_groups import (
    ConsumerError,
    ConsumerGroupCoordinator,
    HeartbeatResult,
)
from aiopurgatory.kafka.groups import GroupCoordinator, GroupError, JoinResult
from aiopurgatory.testing import OffsetClock
from tests.support.kafka_wire import FlexibleWire, name

ZERO_ID = uuid.UUID(int=0)


def _metadata_v12(
    wire: FlexibleWire, names: list[str] | None = None, ids: list[uuid.UUID] | None = None
) -> Any:
    topics = [
        metadata_v12.MetadataRequestTopic(topic_id=ZERO_ID, name=TopicName(n)) for n in names or ()
    ]
    topics += [metadata_v12.MetadataRequestTopic(topic_id=i, name=None) for i in ids or ()]
    request = metadata_v12.MetadataRequest(
        topics=tuple(topics) if names is not None or ids is not None else None,
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    return wire.call(request, MetadataResponseV12)


def test_metadata_v12_topic_ids_by_name_and_by_id_new_on_recreate() -> None:
    topic = name("ids")
    with BrokerThread() as address, FlexibleWire(address) as wire:
        (listed,) = _metadata_v12(wire, [topic]).topics
        assert listed.error_code is ErrorCode.none
        assert listed.topic_id != ZERO_ID
        first = listed.topic_id
        assert first is not None
        assert _metadata_v12(wire, [topic]).topics[0].topic_id == first  # kept
        (by_id,) = _metadata_v12(wire, ids=[first]).topics
        assert (by_id.error_code, by_id.name, len(by_id.partitions)) == (ErrorCode.none, topic, 1)
        everything: dict[Any, Any] = {t.name: t.topic_id for t in _metadata_v12(wire).topics}
        assert everything[topic] == first
        assert everything["__consumer_offsets"] != ZERO_ID
        unknown = uuid.uuid4()
        (missing,) = _metadata_v12(wire, ids=[unknown]).topics
        assert (missing.error_code, missing.name) == (ErrorCode.unknown_topic_id, None)
        # Deleted and created again: a new id; the old one is unknown.
        assert wire_delete(address, topic)
        (again,) = _metadata_v12(wire, [topic]).topics
        assert again.topic_id not in (first, ZERO_ID)
        assert _metadata_v12(wire, ids=[first]).topics[0].error_code is ErrorCode.unknown_topic_id


def test_heartbeat_and_describe_on_the_wire() -> None:
    """ConsumerGroupHeartbeat v1 and ConsumerGroupDescribe v1 as raw frames: a join
    answered with epoch 1, the broker's interval and the partitions by topic id; the
    errors with Kafka's codes and messages; a classic or unknown group not described."""
    from kio.schema.consumer_group_describe.v1 import request as describe_v1
    from kio.schema.consumer_group_describe.v1.response import ConsumerGroupDescribeResponse
    from kio.schema.consumer_group_heartbeat.v1 import request as heartbeat_v1
    from kio.schema.consumer_group_heartbeat.v1.response import ConsumerGroupHeartbeatResponse
    from kio.schema.describe_groups.v5 import request as describe_groups_v5
    from kio.schema.describe_groups.v5.response import DescribeGroupsResponse
    from kio.schema.list_groups.v5 import request as list_v5
    from kio.schema.list_groups.v5.response import ListGroupsResponse
    from kio.schema.types import GroupId

    def beat(wire: FlexibleWire, member: str, epoch: int, **fields: Any) -> Any:
        request = heartbeat_v1.ConsumerGroupHeartbeatRequest(
            group_id=GroupId(group),
            member_id=member,
            member_epoch=i32(epoch),
            topic_partitions=fields.pop("topic_partitions", () if epoch == 0 else None),
            **fields,
        )
        return wire.call(request, ConsumerGroupHeartbeatResponse)

    topic, group = name("wire"), name("g")
    with BrokerThread(partitions=3) as address, FlexibleWire(address) as wire:
        (listed,) = _metadata_v12(wire, [topic]).topics
        joined = beat(wire, "m1", 0, subscribed_topic_names=(TopicName(topic),))
        assert (joined.error_code, joined.member_id, joined.member_epoch) == (
            ErrorCode.none,
            "m1",
            1,
        )
        assert joined.heartbeat_interval.total_seconds() == 5.0
        assert joined.assignment is not None
        (assigned,) = joined.assignment.topic_partitions
        assert (assigned.topic_id, sorted(assigned.partitions)) == (listed.topic_id, [0, 1, 2])
        fenced = beat(wire, "m1", 7)
        assert fenced.error_code is ErrorCode.fenced_member_epoch
        assert fenced.error_message is not None
        odd = beat(
            wire, "m2", 0, subscribed_topic_names=(TopicName(topic),), server_assignor="sticky"
        )
        assert odd.error_code is ErrorCode.unsupported_assignor
        described = wire.call(
            describe_v1.ConsumerGroupDescribeRequest(
                group_ids=(GroupId(group), GroupId("nobody")), include_authorized_operations=False
            ),
            ConsumerGroupDescribeResponse,
        )
        mine, nobody = described.groups
        assert (mine.error_code, mine.group_state, mine.group_epoch) == (
            ErrorCode.none,
            "Stable",
            1,
        )
        (member,) = mine.members
        assert (member.member_id, member.member_epoch, member.subscribed_topic_names) == (
            "m1",
            1,
            (topic,),
        )
        assert nobody.error_code is ErrorCode.group_id_not_found
        # The classic APIs: ListGroups v5 with its type and state; DescribeGroups v5
        # answers it Dead, no error, as Kafka does below v6.
        listed_groups = wire.call(
            list_v5.ListGroupsRequest(states_filter=("stable",), types_filter=("consumer",)),
            ListGroupsResponse,
        )
        assert [
            (g.group_id, g.group_type, g.group_state, g.protocol_type) for g in listed_groups.groups
        ] == [(group, "consumer", "Stable", "consumer")]
        classic_only = wire.call(
            list_v5.ListGroupsRequest(states_filter=(), types_filter=("classic",)),
            ListGroupsResponse,
        )
        assert group not in {g.group_id for g in classic_only.groups}
        (old_style,) = wire.call(
            describe_groups_v5.DescribeGroupsRequest(
                groups=(GroupId(group),), include_authorized_operations=False
            ),
            DescribeGroupsResponse,
        ).groups
        assert (old_style.error_code, old_style.group_state, old_style.members) == (
            ErrorCode.none,
            "Dead",
            (),
        )
        left = beat(wire, "m1", -1)
        assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)


def _heartbeat(wire: FlexibleWire, group: str, member: str, epoch: int, **fields: Any) -> Any:
    """One ConsumerGroupHeartbeat v1 as a raw frame (a join sends no partitions owned)."""
    from kio.schema.consumer_group_heartbeat.v1 import request as heartbeat_v1
    from kio.schema.consumer_group_heartbeat.v1.response import ConsumerGroupHeartbeatResponse
    from kio.schema.types import GroupId

    request = heartbeat_v1.ConsumerGroupHeartbeatRequest(
        group_id=GroupId(group),
        member_id=member,
        member_epoch=i32(epoch),
        topic_partitions=() if epoch == 0 else None,
        **fields,
    )
    return wire.call(request, ConsumerGroupHeartbeatResponse)


def test_a_member_id_taken_over_after_a_static_leave_leaves_nothing_behind() -> None:
    """A static member leaves with -2 (its place kept for its session) and a client
    joins under the same member id without the instance id, then leaves: one member
    per id, as Kafka keeps. Before, the joining member replaced the left one in the
    table without removing it: its bytes stayed counted in max_group_bytes for ever
    (its session's expiry no longer found it), so a client repeating that filled the
    budget every group shares and locked out an honest member of another group."""
    # 20 names of 200 characters: about 4.3 kB counted per member, 40 kB of budget.
    names = tuple(TopicName(f"{i:03}" + "n" * 197) for i in range(20))
    thread = BrokerThread(max_group_bytes=40_000, max_member_metadata_bytes=20_000)
    with thread as address, FlexibleWire(address) as wire:
        group = name("taken")
        for _ in range(30):
            joined = _heartbeat(wire, group, "m", 0, instance_id="i", subscribed_topic_names=names)
            assert joined.error_code is ErrorCode.none
            gone = _heartbeat(wire, group, "m", -2, instance_id="i")
            assert (gone.error_code, gone.member_epoch) == (ErrorCode.none, -2)
            taken = _heartbeat(wire, group, "m", 0, subscribed_topic_names=names)
            assert taken.error_code is ErrorCode.none
            left = _heartbeat(wire, group, "m", -1)
            assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)
        assert thread.call(lambda broker: broker.groups.held_bytes) == 0
        assert thread.call(lambda broker: group not in broker.consumer_groups.table)
        honest = _heartbeat(wire, name("honest"), "h", 0, subscribed_topic_names=names)
        assert honest.error_code is ErrorCode.none
        # The instance is free again: a member of it joins, nothing dangles.
        back = _heartbeat(wire, group, "m2", 0, instance_id="i", subscribed_topic_names=names)
        assert back.error_code is ErrorCode.none


def test_what_a_consumer_group_s_assignment_holds_is_counted_in_max_group_bytes() -> None:
    """A member subscribing to 20 topics of 64 partitions makes the coordinator hold an
    assignment of 1,280 partitions (its group's target, its own assignment, the owners'
    map) from a request of a few hundred bytes. Before, only its ids and names were
    counted in max_group_bytes, so a client joining one member to each of max_groups
    groups, each subscribed to every topic, made the broker hold 64,000 partitions per
    group (gigabytes) within the budget. Now each partition of a subscribed topic is
    counted (TARGET_ENTRY_BYTES): past the budget a member of a new group is refused
    COORDINATOR_NOT_AVAILABLE (the clients retry), and the bytes come back as the
    groups go."""
    from aiopurgatory.kafka.consumer_groups import TARGET_ENTRY_BYTES

    budget = 1_000_000
    topics = [name("wide") for _ in range(20)]
    subscribed = tuple(TopicName(topic) for topic in topics)
    thread = BrokerThread(max_group_bytes=budget, max_member_metadata_bytes=budget // 2)
    with thread as address, FlexibleWire(address) as wire:
        for topic in topics:
            thread.create_topic(topic, 64)
        joined = []
        for _ in range(20):
            group = name("wide")
            answer = _heartbeat(wire, group, "m", 0, subscribed_topic_names=subscribed)
            if answer.error_code is ErrorCode.coordinator_not_available:
                break
            assert answer.error_code is ErrorCode.none
            assert answer.assignment is not None
            assert sum(len(t.partitions) for t in answer.assignment.topic_partitions) == 1280
            joined.append(group)
        held = thread.call(lambda broker: broker.groups.held_bytes)
        assert len(joined) == budget // (1280 * TARGET_ENTRY_BYTES)
        assert len(joined) * 1280 * TARGET_ENTRY_BYTES <= held <= budget
        for group in joined:
            left = _heartbeat(wire, group, "m", -1)
            assert left.error_code is ErrorCode.none
        assert thread.call(lambda broker: broker.groups.held_bytes) == 0


def wire_delete(address: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address})
    admin.delete_topics([topic])[topic].result(10)
    return True


# -- the coordinator on virtual time -----------------------------------------------------

SESSION = 45.0


class Cluster:
    """A consumer-group coordinator over topics held in plain dicts, on a clock a test
    moves; each member remembers what it was last told (its epoch and assignment) and
    reports what it owns, as a client does."""

    def __init__(self, **options: Any) -> None:
        self.clock = OffsetClock()
        self.partitions: dict[str, int] = {}
        self.ids: dict[str, uuid.UUID] = {}
        self.classic = GroupCoordinator(clock=self.clock, initial_rebalance_delay=0.0)
        self.coordinator = ConsumerGroupCoordinator(
            self.classic,
            self.partitions,
            self.ids,
            session_timeout=SESSION,
            clock=self.clock,
            **options,
        )
        self.epochs: dict[str, int] = {}
        self.owned: dict[str, frozenset[tuple[str, int]]] = {}

    def topic(self, name: str, count: int) -> None:
        self.partitions[name] = count
        self.ids[name] = uuid.uuid4()

    def beat(
        self,
        member: str,
        *,
        epoch: int | None = None,
        topics: Iterable[str] | None = None,
        group: str = "g",
        **extra: Any,
    ) -> HeartbeatResult:
        """One heartbeat of ``member``: it joins (epoch 0) the first time, subscribing to
        ``topics`` (default "t"), then sends its epoch and what it owns; it takes the
        assignment it is given as what it owns (revoking what is no longer in it)."""
        joining = member not in self.epochs
        if epoch is None:
            epoch = 0 if joining else self.epochs[member]
        if joining and topics is None:
            topics = ["t"]
        result = self.coordinator.heartbeat(
            group,
            member,
            epoch,
            subscribed=None if topics is None else list(topics),
            owned=None if epoch == 0 else self.owned.get(member, frozenset()),
            **extra,
        )
        if result.error is ConsumerError.NONE and result.epoch >= 0:
            self.epochs[member] = result.epoch
            if result.assignment is not None:
                self.owned[member] = result.assignment
        elif result.epoch < 0 or result.error is not ConsumerError.NONE:
            self.epochs.pop(member, None)
            self.owned.pop(member, None)
        self.check_exclusive(group)
        return result

    def check_exclusive(self, group: str = "g") -> None:
        """No partition held by two members, by the coordinator's account or by what
        the members were told."""
        seen: dict[tuple[str, int], str] = {}
        table = self.coordinator.table.get(group)
        for member in table.members.values() if table is not None else ():
            for tp in member.assigned | member.revoking:
                assert tp not in seen, f"{tp} held by {seen[tp]} and {member.member_id}"
                seen[tp] = member.member_id

    def assignment(self, member: str) -> list[int]:
        return sorted(index for _, index in self.owned.get(member, ()))


async def classic_join(cluster: Cluster, group: str) -> JoinResult:
    """A classic JoinGroup of a new dynamic member to ``group``."""
    return await cluster.classic.join(
        group,
        "",
        group_instance_id=None,
        client_id="x",
        session_timeout=10.0,
        rebalance_timeout=10.0,
        protocol_type="consumer",
        protocols=[("range", b"")],
    )


def _cluster_test(test: Any) -> Any:
    """Run ``test(cluster)`` on a fresh loop (the purgatories want one running)."""

    def run() -> None:
        async def main() -> None:
            cluster = Cluster()
            cluster.topic("t", 4)
            try:
                await test(cluster)
            finally:
                cluster.coordinator.close()
                cluster.classic.close()

        asyncio.run(main())

    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


@_cluster_test
async def test_join_epochs_and_the_incremental_handover(cluster: Cluster) -> None:
    """A joins alone (all four partitions, epoch 1); B joins (group epoch 2): B gets
    nothing until A, told to revoke two, has sent a heartbeat without them."""
    a = cluster.beat("a")
    assert (a.error, a.epoch, cluster.assignment("a")) == (ConsumerError.NONE, 1, [0, 1, 2, 3])
    b = cluster.beat("b")
    assert (b.epoch, cluster.assignment("b")) == (2, [])  # all still held by A
    group = cluster.coordinator.table["g"]
    assert (group.epoch, group.assignment_epoch, group.state()) == (2, 2, "Reconciling")
    a = cluster.beat("a")  # told to revoke: keeps epoch 1, two partitions
    assert a.epoch == 1
    assert cluster.assignment("a") == [0, 1] or cluster.assignment("a") == [2, 3]
    assert cluster.beat("b").assignment is None  # A has not let go yet
    assert cluster.assignment("b") == []
    a = cluster.beat("a")  # its heartbeat no longer lists them: epoch 2
    assert a.epoch == 2
    b = cluster.beat("b")
    assert len(cluster.assignment("b")) == 2
    assert set(cluster.assignment("a")) | set(cluster.assignment("b")) == {0, 1, 2, 3}
    assert group.state() == "Stable"


@_cluster_test
async def test_leave_hands_the_partitions_to_the_others(cluster: Cluster) -> None:
    for _ in range(3):
        cluster.beat("a")
        cluster.beat("b")
    left = cluster.beat("b", epoch=-1)
    assert (left.error, left.epoch) == (ConsumerError.NONE, -1)
    a = cluster.beat("a")
    assert cluster.assignment("a") == [0, 1, 2, 3]
    assert a.epoch == cluster.coordinator.table["g"].epoch
    assert cluster.beat("b", epoch=-1).error is ConsumerError.UNKNOWN_MEMBER_ID
    cluster.beat("a", epoch=-1)
    assert "g" not in cluster.coordinator.table  # empty: only its entry is left
    assert cluster.classic.groups.get("g") is None  # and no offsets: gone


@_cluster_test
async def test_fenced_and_unknown_members_as_kafka_answers(cluster: Cluster) -> None:
    cluster.beat("a")
    cluster.beat("b")
    cluster.beat("a")
    cluster.beat("a")  # epoch 2 now
    assert cluster.epochs["a"] == 2
    assert cluster.beat("a", epoch=5).error is ConsumerError.FENCED_MEMBER_EPOCH
    cluster.epochs["a"] = 2
    cluster.owned["a"] = cluster.coordinator.table["g"].members["a"].assigned
    # One epoch behind, with what it was given: the answer it lost, sent again.
    assert cluster.beat("a", epoch=1).error is ConsumerError.NONE
    assert cluster.beat("nobody", epoch=3).error is ConsumerError.UNKNOWN_MEMBER_ID
    # Fenced, a member joins again under its id: it holds nothing, the epochs go on.
    group_epoch = cluster.coordinator.table["g"].epoch
    cluster.owned["a"] = frozenset()
    again = cluster.beat("a", epoch=0, topics=["t"])
    assert again.error is ConsumerError.NONE
    assert again.epoch > group_epoch
    refused = cluster.coordinator.heartbeat("g", "", 0, subscribed=["t"])
    assert refused.error is ConsumerError.INVALID_REQUEST  # v1: the client names itself
    refused = cluster.coordinator.heartbeat("g", "c", 0, subscribed=["t"], assignor="sticky")
    assert refused.error is ConsumerError.UNSUPPORTED_ASSIGNOR
    refused = cluster.coordinator.heartbeat("g", "c", 0, subscribed=None)
    assert refused.error is ConsumerError.INVALID_REQUEST


@_cluster_test
async def test_session_expiry_on_the_broker_clock(cluster: Cluster) -> None:
    """A crashed member (no heartbeat) goes at its session timeout on the broker's
    clock: advance() past it and the survivor gets everything at its next heartbeat."""
    for _ in range(3):
        cluster.beat("a")
        cluster.beat("b")
    assert len(cluster.assignment("a")) == 2
    await cluster.clock.advance(SESSION - 1)
    cluster.beat("a")  # a is alive, b silent
    assert "b" in cluster.coordinator.table["g"].members
    await cluster.clock.advance(2)
    assert "b" not in cluster.coordinator.table["g"].members
    cluster.beat("a")
    assert cluster.assignment("a") == [0, 1, 2, 3]


@_cluster_test
async def test_a_static_member_gets_its_partitions_back(cluster: Cluster) -> None:
    for _ in range(3):
        cluster.beat("a", instance_id="ia") if "a" not in cluster.epochs else cluster.beat("a")
        cluster.beat("b")
    mine = cluster.assignment("a")
    epoch = cluster.epochs["a"]
    assert len(mine) == 2
    gone = cluster.beat("a", epoch=-2, instance_id="ia")
    assert gone.epoch == -2
    cluster.beat("b")
    assert len(cluster.assignment("b")) == 2  # a's partitions wait for it
    # Another member with the instance while it is held: refused.
    taken = cluster.coordinator.heartbeat("g", "b2", 0, subscribed=["t"], instance_id="ib")
    assert taken.error is ConsumerError.NONE
    cluster.epochs["b2"] = taken.epoch
    # The same instance back under a new member id: its partitions and epoch.
    back = cluster.beat("a2", instance_id="ia")
    assert (back.epoch, cluster.assignment("a2")) == (epoch + 1, mine) or back.epoch >= epoch
    assert set(mine) <= set(cluster.assignment("a2")) or cluster.assignment("a2") == mine
    again = cluster.coordinator.heartbeat("g", "a3", 0, subscribed=["t"], instance_id="ia")
    assert again.error is ConsumerError.UNRELEASED_INSTANCE_ID


@_cluster_test
async def test_a_static_member_not_back_in_its_session_goes(cluster: Cluster) -> None:
    for _ in range(3):
        cluster.beat("a", instance_id="ia") if "a" not in cluster.epochs else cluster.beat("a")
        cluster.beat("b")
    cluster.beat("a", epoch=-2, instance_id="ia")
    await cluster.clock.advance(SESSION / 2)
    cluster.beat("b")
    await cluster.clock.advance(SESSION / 2 + 1)
    cluster.beat("b")
    cluster.beat("b")
    assert cluster.assignment("b") == [0, 1, 2, 3]


@_cluster_test
async def test_a_member_not_revoking_within_its_rebalance_timeout_goes(cluster: Cluster) -> None:
    cluster.beat("a", rebalance_timeout=30.0)
    cluster.beat("b")
    cluster.beat("a")  # told to revoke two
    assert cluster.coordinator.table["g"].members["a"].revoking
    await cluster.clock.advance(20)
    cluster.beat("b")
    assert cluster.assignment("b") == []  # still held by a, which never lets go
    await cluster.clock.advance(11)
    assert "a" not in cluster.coordinator.table["g"].members
    cluster.beat("b")
    cluster.beat("b")
    assert cluster.assignment("b") == [0, 1, 2, 3]


@_cluster_test
async def test_topics_created_later_are_picked_up(cluster: Cluster) -> None:
    cluster.beat("a", topics=["t", "later"])
    assert cluster.assignment("a") == [0, 1, 2, 3]
    cluster.topic("later", 2)
    cluster.beat("a")
    assert sorted(cluster.owned["a"]) == [
        *(("later", i) for i in range(2)),
        *(("t", i) for i in range(4)),
    ]


@_cluster_test
async def test_a_group_keeps_its_type(cluster: Cluster) -> None:
    cluster.beat("a")
    joined = await classic_join(cluster, "g")
    assert joined.error is GroupError.INCONSISTENT_GROUP_PROTOCOL
    # Commits: the member at its epoch, a stale one refused, an admin while it has members.
    coordinator = cluster.coordinator
    assert coordinator.check_commit("g", "a", cluster.epochs["a"]) is ConsumerError.NONE
    assert coordinator.check_commit("g", "a", 0) is ConsumerError.STALE_MEMBER_EPOCH
    assert coordinator.check_commit("g", "", -1) is ConsumerError.UNKNOWN_MEMBER_ID
    # A classic group with members is no consumer group.
    classic = asyncio.ensure_future(classic_join(cluster, "c"))
    await asyncio.sleep(0.01)
    refused = cluster.coordinator.heartbeat("c", "m", 0, subscribed=["t"])
    assert refused.error is ConsumerError.GROUP_ID_NOT_FOUND
    classic.cancel()
    # Empty, with offsets: a consumer group becomes classic with them, and back.
    assert cluster.classic.commit_transactional("g", {("t", 0): (5, "")}) is GroupError.NONE
    cluster.beat("a", epoch=-1)
    entry = cluster.classic.groups["g"]
    assert (entry.kind, entry.state.value, entry.offsets) == (
        "consumer",
        "Empty",
        {("t", 0): (5, "")},
    )
    rejoined = await classic_join(cluster, "g")
    assert rejoined.error is GroupError.NONE
    assert (entry.kind, cluster.classic.committed("g", [("t", 0)])) == (
        "classic",
        {("t", 0): (5, "")},
    )


@_cluster_test
async def test_commits_of_a_static_member_gone_and_of_nobody_as_kafka_checks_them(
    cluster: Cluster,
) -> None:
    """A static member that left with -2 keeps its place for its session, not its right
    to commit: Kafka gives it epoch -2 until it is back, so a commit at its old epoch is
    STALE_MEMBER_EPOCH (before, a zombie's commit was taken, and pushed its session
    back). Once the group has no members, a commit without an epoch (-1) is taken
    whatever member id it names, as Kafka takes it (before: UNKNOWN_MEMBER_ID)."""
    coordinator = cluster.coordinator
    cluster.beat("a", instance_id="ia")
    epoch = cluster.epochs["a"]
    assert coordinator.check_commit("g", "a", epoch) is ConsumerError.NONE
    cluster.beat("a", epoch=-2, instance_id="ia")
    assert coordinator.check_commit("g", "a", epoch) is ConsumerError.STALE_MEMBER_EPOCH
    await cluster.clock.advance(SESSION + 1)  # its session ends: the group is empty
    assert "g" not in coordinator.table
    assert coordinator.check_commit("g", "a", -1) is ConsumerError.NONE
    assert coordinator.check_commit("g", "a", 3) is ConsumerError.UNKNOWN_MEMBER_ID


@_cluster_test
async def test_bounds_members_names_and_ids(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    coordinator.max_members = 2
    cluster.beat("a")
    cluster.beat("b")
    assert cluster.beat("c").error is ConsumerError.GROUP_MAX_SIZE_REACHED
    too_many = coordinator.heartbeat("h", "x", 0, subscribed=[f"n{i}" for i in range(1001)])
    assert too_many.error is ConsumerError.INVALID_REQUEST
    long_name = coordinator.heartbeat("h", "x", 0, subscribed=["n" * 250])
    assert long_name.error is ConsumerError.INVALID_REQUEST
    long_id = coordinator.heartbeat("h", "x" * 256, 0, subscribed=["t"])
    assert long_id.error is ConsumerError.INVALID_REQUEST
    long_assignor = coordinator.heartbeat("h", "x", 0, subscribed=["t"], assignor="u" * 256)
    assert long_assignor.error is ConsumerError.INVALID_REQUEST
    assert "h" not in coordinator.table  # a refused request leaves nothing behind


def test_assignors_split_evenly_and_range_by_index() -> None:
    subs = {"a": ["t", "u"], "b": ["t", "u"], "c": ["t"]}
    counts = {"t": 5, "u": 2}
    split = uniform(subs, counts, {})
    assert sorted(len(v) for v in split.values()) in ([2, 2, 3], [1, 3, 3], [2, 2, 3])
    assert set().union(*split.values()) == {("t", i) for i in range(5)} | {("u", 0), ("u", 1)}
    ranged = range_assign({"a": ["t"], "b": ["t"]}, {"t": 5}, {})
    assert ranged == {
        "a": frozenset(("t", i) for i in range(3)),
        "b": frozenset({("t", 3), ("t", 4)}),
    }
    # Sticky: a third member moves as few partitions as it may.
    two = uniform({"a": ["t"], "b": ["t"]}, {"t": 6}, {})
    three = uniform({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 6}, two)
    assert len(three["a"] & two["a"]) == 2
    assert len(three["b"] & two["b"]) == 2


# -- the model: reconciliation never shares a partition, and converges -----------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["beat", "beat", "beat", "leave", "crash", "grow"]),
            st.sampled_from(["m0", "m1", "m2", "m3"]),
        ),
        max_size=40,
    ),
    st.sampled_from(["uniform", "range"]),
)
def test_model_no_partition_owned_twice_and_all_owned_once_all_heartbeat(
    ops: list[tuple[str, str]], assignor: str
) -> None:
    async def main() -> None:
        cluster = Cluster()
        cluster.topic("t", 3)
        try:
            for op, member in ops:
                if op == "beat":
                    joining = member not in cluster.epochs
                    cluster.beat(member, assignor=assignor if joining else None)
                elif op == "leave" and member in cluster.epochs:
                    cluster.beat(member, epoch=-1)
                elif op == "crash" and member in cluster.epochs:
                    cluster.epochs.pop(member)  # silent from now on: its session ends
                    cluster.owned.pop(member, None)
                    for _ in range(2):  # the others heartbeat on the way
                        await cluster.clock.advance(SESSION / 2 + 1)
                        for other in list(cluster.epochs):
                            cluster.beat(other)
                elif op == "grow":
                    cluster.partitions["t"] = min(cluster.partitions["t"] + 1, 8)
                # What the members were told they own never overlaps.
                told = [tp for tps in cluster.owned.values() for tp in tps]
                assert len(told) == len(set(told))
            for _ in range(4):  # everyone heartbeats until nothing moves
                for member in list(cluster.epochs):
                    cluster.beat(member)
            if not cluster.epochs:
                return
            told = [tp for tps in cluster.owned.values() for tp in tps]
            assert sorted(told) == [("t", i) for i in range(cluster.partitions["t"])]
        finally:
            cluster.coordinator.close()
            cluster.classic.close()

    asyncio.run(main())


# -- confluent-kafka with group.protocol=consumer ------------------------------------------

WATCHDOG = 20.0
"""Seconds any one wait of a confluent-kafka scenario may take at most."""
QUICK = 1.0
"""Wall seconds a handover after advance() may take at most (it takes a few
heartbeats of the broker's interval below)."""
INTERVAL_MS = 200
"""The broker's group.consumer.heartbeat.interval.ms in these tests: what a member is
told, so a reassignment reaches it within a fifth of a second (Kafka's 5 s default
would make each handover step take seconds of wall time; the clients keep theirs)."""


def _consumer(address: str, group: str, **config: Any) -> Any:
    """A confluent-kafka consumer of the new protocol at its defaults."""
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )


def _partitions(consumer: Any) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def _poll_until(
    consumers: list[Any],
    done: Callable[[], bool],
    read: list[Any] | None = None,
    until: float | None = None,
) -> float:
    """Poll every consumer until ``done()`` (or for ``until`` seconds); the wall
    seconds it took. Messages read go to ``read``."""
    start = time.monotonic()
    while not done():
        if until is not None and time.monotonic() - start >= until:
            break
        assert time.monotonic() - start < WATCHDOG, "not reached in time"
        for consumer in consumers:
            message = consumer.poll(0.05)
            if message is not None and message.error() is None and read is not None:
                read.append((message.partition(), message.offset()))
    return time.monotonic() - start


@contextlib.contextmanager
def _broker_with_topic(
    partitions: int = 4, messages: int = 0
) -> Iterator[tuple[BrokerThread, str, str]]:
    thread = BrokerThread(group_consumer_heartbeat_interval_ms=INTERVAL_MS)
    with thread as address:
        topic = name("kip848")
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": address})
        admin.create_topics([NewTopic(topic, partitions)])[topic].result(10)
        if messages:
            producer = confluent_kafka.Producer({"bootstrap.servers": address})
            for i in range(messages):
                producer.produce(topic, value=b"%d" % i, partition=i % partitions)
            assert producer.flush(10) == 0
        yield thread, address, topic


def _members(thread: BrokerThread, group: str) -> set[str]:
    def read(broker: Any) -> set[str]:
        table = broker.consumer_groups.table.get(group)
        return set() if table is None else set(table.members)

    return set(thread.call(read))


def _advance_past_session(thread: BrokerThread, alive: list[Any]) -> float:
    """46 s of broker time in two steps, the live consumers heartbeating between them
    (as they would over 46 real seconds): only the silent members' sessions end. The
    monotonic time the second step started at."""
    thread.advance(25)
    _poll_until(alive, lambda: False, until=3 * INTERVAL_MS / 1000)
    start = time.monotonic()
    thread.advance(21)
    return start


def test_confluent_two_consumers_split_one_leaves_the_other_gets_all_commits_kept() -> None:
    with _broker_with_topic(messages=40) as (_, address, topic):
        group = name("g")
        a, b = _consumer(address, group), _consumer(address, group)
        a.subscribe([topic])
        b.subscribe([topic])
        read: list[Any] = []
        _poll_until(
            [a, b],
            lambda: len(_partitions(a)) == 2 and len(_partitions(b)) == 2 and len(set(read)) >= 40,
            read,
        )
        assert _partitions(a) | _partitions(b) == {0, 1, 2, 3}
        # Each record read (one read twice is one A had read before it handed its
        # partition over uncommitted: at least once, as Kafka's consumers read).
        assert set(read) == {(p, o) for p in range(4) for o in range(10)}
        # Described (ConsumerGroupDescribe); not deletable while it has members.
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": address})
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert str(described.state).endswith("STABLE")
        assert str(described.type).endswith("CONSUMER")
        assert len(described.members) == 2
        with pytest.raises(confluent_kafka.KafkaException, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups([group])[group].result(10)
        a.commit(asynchronous=False)
        b.commit(asynchronous=False)
        b.close()  # leaves (epoch -1)
        took = _poll_until([a], lambda: _partitions(a) == {0, 1, 2, 3})
        assert took < WATCHDOG
        a.close()
        # The commits kept: a newcomer reads nothing again.
        c = _consumer(address, group)
        c.subscribe([topic])
        again: list[Any] = []
        _poll_until([c], lambda: _partitions(c) == {0, 1, 2, 3}, again)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = c.poll(0.1)
            assert message is None or message.error() is not None
        c.close()
        # The group is listed as a consumer-type group (ListGroups v5).
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": address})
        listed = admin.list_consumer_groups().result(10)
        (entry,) = [g for g in listed.valid if g.group_id == group]
        assert str(entry.type).endswith("CONSUMER")
        assert str(entry.state).endswith("EMPTY")
        admin.delete_consumer_groups([group])[group].result(10)  # empty: it goes
        assert group not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}


_CRASHING = """
import sys, time, confluent_kafka
c = confluent_kafka.Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
    "group.protocol": "consumer", "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.05)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_confluent_a_crashed_consumer_s_partitions_move_on_advance() -> None:
    """A consumer's process killed (no leave): its partitions stay with it until its
    session (45 s, the broker's default) times out on the broker's clock; advance()
    past it and the survivor has them all in well under a second of wall time."""
    with _broker_with_topic() as (thread, address, topic):
        group = name("g")
        crashing = subprocess.Popen(
            [sys.executable, "-c", _CRASHING, address, group, topic],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert crashing.stdout is not None
            assert crashing.stdout.readline().strip() == "assigned"
            a = _consumer(address, group)
            a.subscribe([topic])
            _poll_until([a], lambda: len(_partitions(a)) == 2)
        finally:
            os.kill(crashing.pid, signal.SIGKILL)
            crashing.wait(10)
        # Nothing moves in real time: the session is 45 s.
        _poll_until([a], lambda: False, until=0.5)
        assert len(_partitions(a)) == 2
        members = _members(thread, group)
        assert len(members) == 2
        start = _advance_past_session(thread, [a])
        _poll_until([a], lambda: _partitions(a) == {0, 1, 2, 3})
        took = time.monotonic() - start
        print(f"crash handover after the session's end (advance): {took:.3f} s")
        assert took < QUICK
        (survivor,) = _members(thread, group)
        assert survivor in members  # the same member: it was never expired itself
        a.close()


def test_confluent_a_static_member_restarted_gets_its_partitions_back() -> None:
    with _broker_with_topic() as (thread, address, topic):
        group = name("g")
        a = _consumer(address, group, **{"group.instance.id": "instance-a"})
        b = _consumer(address, group)
        a.subscribe([topic])
        b.subscribe([topic])
        _poll_until([a, b], lambda: len(_partitions(a)) == 2 and len(_partitions(b)) == 2)
        mine = _partitions(a)
        a.close()  # a static member leaves with -2: its partitions wait for it
        time.sleep(0.5)
        _poll_until([b], lambda: True)
        assert _partitions(b) == {0, 1, 2, 3} - mine
        again = _consumer(address, group, **{"group.instance.id": "instance-a"})
        again.subscribe([topic])
        _poll_until([again, b], lambda: _partitions(again) == mine)
        assert _partitions(b) == {0, 1, 2, 3} - mine
        # Not back within its session: its partitions go to the others.
        again.close()
        start = _advance_past_session(thread, [b])
        _poll_until([b], lambda: _partitions(b) == {0, 1, 2, 3})
        took = time.monotonic() - start
        print(f"static member's partitions after its session's end (advance): {took:.3f} s")
        assert took < QUICK
        b.close()


def test_confluent_a_cluster_with_the_group_s_coordinator_stopped() -> None:
    """Three nodes: the group's coordinator stopped, the members find the next one and
    go on with their partitions and epochs (the group's state is the process's, as a
    Kafka coordinator's is replicated in __consumer_offsets); one leaves after and the
    other gets everything."""
    thread = BrokerThread(
        nodes=3, replicas=3, replica_lag=0.5, group_consumer_heartbeat_interval_ms=INTERVAL_MS
    )
    with thread as address:
        topic, group = name("kip848"), name("g")
        thread.create_topic(topic, 4)
        a, b = _consumer(address, group), _consumer(address, group)
        a.subscribe([topic])
        b.subscribe([topic])
        _poll_until([a, b], lambda: len(_partitions(a)) == 2 and len(_partitions(b)) == 2)
        before = (_partitions(a), _partitions(b), _members(thread, group))
        coordinator = thread.coordinator(group)
        thread.stop_node(coordinator)
        assert thread.coordinator(group) != coordinator
        # Heartbeats go to the new coordinator: nobody rejoins, nothing moves.
        _poll_until([a, b], lambda: False, until=1.0)
        assert (_partitions(a), _partitions(b), _members(thread, group)) == before
        b.close()
        _poll_until([a], lambda: _partitions(a) == {0, 1, 2, 3})
        a.close()
