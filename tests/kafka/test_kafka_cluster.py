"""A cluster of Kafka-protocol brokers in one process (``KafkaBroker(nodes=N)``), over
raw wire requests: every node listed in Metadata, leaders and coordinators spread, each
node answering only for what it leads or coordinates, and the faults on demand
(``stop_node``, ``start_node``, ``isolate``, ``heal``) with their effects: a new leader
from the ISR with a bumped epoch, the ISR shrinking and growing, acks=all and
``min.insync.replicas``, truncation of what was not replicated."""

from __future__ import annotations

import asyncio
import re
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.add_partitions_to_txn.v2 import request as add_partitions
from kio.schema.add_partitions_to_txn.v2.response import AddPartitionsToTxnResponse
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2 import request as find_coordinator
from kio.schema.find_coordinator.v2.response import FindCoordinatorResponse
from kio.schema.heartbeat.v3 import request as heartbeat
from kio.schema.heartbeat.v3.response import HeartbeatResponse
from kio.schema.metadata.v8.response import MetadataResponse
from kio.schema.metadata.v9 import request as metadata_v9
from kio.schema.metadata.v9.response import MetadataResponse as MetadataResponseV9
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.static.primitive import i8, i16, i32

from aiopurgatory.kafka import BrokerThread, KafkaBroker

from ..support.kafka_wire import (
    FlexibleWire,
    Wire,
    address,
    batch,
    cluster_thread,
    fetch_from,
    metadata_of,
    metadata_request,
    name,
    produce_request,
    running,
    send,
    wait_for,
)
from ..support.servers import start_server, stop_server


def topic() -> str:
    return name("c")


@pytest.fixture
def cluster() -> Iterator[BrokerThread]:
    with running(cluster_thread()) as thread:
        yield thread


def test_metadata_lists_every_node_and_spreads_the_leaders(cluster: BrokerThread) -> None:
    name = topic()
    cluster.call(lambda broker: broker.create_topic(name, 6))
    assert len(cluster.bootstrap.split(",")) == 3
    for node in range(3):
        with Wire(address(cluster, node)) as wire:
            answer = metadata_of(wire, [name])
        assert sorted(b.node_id for b in answer.brokers) == [0, 1, 2]
        assert {b.port for b in answer.brokers} == {
            int(address(cluster, n).rsplit(":", 1)[1]) for n in range(3)
        }
        partitions = answer.topics[0].partitions
        leaders = [p.leader_id for p in partitions]
        assert sorted(leaders) == [0, 0, 1, 1, 2, 2]
        for p in partitions:
            assert sorted(p.replica_nodes) == [0, 1, 2]
            assert p.replica_nodes[0] == p.leader_id  # the preferred replica leads
            assert sorted(p.isr_nodes) == [0, 1, 2]
            assert p.leader_epoch == 0


def test_only_the_leader_takes_a_produce_and_acks_all_waits_for_the_isr(
    cluster: BrokerThread,
) -> None:
    name = topic()
    cluster.call(lambda broker: broker.create_topic(name, 1))
    leader = cluster.leader(name)
    follower = (leader + 1) % 3
    with Wire(address(cluster, follower)) as wire:
        assert send(wire, name, [b"x"]).error_code is ErrorCode.not_leader_or_follower
        assert fetch_from(wire, name, 0).error_code is ErrorCode.not_leader_or_follower
    with Wire(address(cluster, leader)) as wire:
        answer = send(wire, name, [b"a", b"b"])
        assert answer.error_code is ErrorCode.none
        assert answer.base_offset == 0
        # acks=all answered: every follower (the ISR) has it.
        assert [o.high_watermark for o in cluster.offsets(name)] == [2]
        read = fetch_from(wire, name, 0, epoch=0)
        assert read.error_code is ErrorCode.none
        assert read.high_watermark == 2


def test_coordinators_are_spread_and_others_answer_not_coordinator(
    cluster: BrokerThread,
) -> None:
    groups = [f"g-{i}" for i in range(30)]
    owners = {g: cluster.coordinator(g) for g in groups}
    assert set(owners.values()) == {0, 1, 2}
    group = groups[0]
    for node in range(3):
        with Wire(address(cluster, node)) as wire:
            found = wire.call(
                find_coordinator.FindCoordinatorRequest(key=group, key_type=i8(0)),
                FindCoordinatorResponse,
            )
            assert found.error_code is ErrorCode.none
            assert found.node_id == owners[group]
            assert f"{found.host}:{found.port}" == address(cluster, owners[group])
            beat = wire.call(
                heartbeat.HeartbeatRequest(
                    group_id=GroupId(group),
                    generation_id=i32(1),
                    member_id="m",
                    group_instance_id=None,
                ),
                HeartbeatResponse,
            )
            expected = (
                ErrorCode.unknown_member_id if node == owners[group] else ErrorCode.not_coordinator
            )
            assert beat.error_code is expected


def test_add_partitions_to_txn_elsewhere_than_its_coordinator_is_not_coordinator(
    cluster: BrokerThread,
) -> None:
    """AddPartitionsToTxn names its transactional id v3_and_below_transactional_id (v0-3):
    the node check reads it there, and answers (not the connection closed)."""
    tid = "tx-1"
    owner = cluster.coordinator(tid)
    request = add_partitions.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TransactionalId(tid),
        v3_and_below_producer_id=ProducerId(1),
        v3_and_below_producer_epoch=i16(0),
        v3_and_below_topics=(
            add_partitions.AddPartitionsToTxnTopic(name=TopicName("t"), partitions=(i32(0),)),
        ),
    )
    for node in range(3):
        with Wire(address(cluster, node)) as wire:
            answer = wire.call(request, AddPartitionsToTxnResponse)
            (result,) = answer.results_by_topic_v3_and_below[0].results_by_partition
            # The coordinator knows no such producer; any other node is not it.
            expected = (
                ErrorCode.invalid_producer_id_mapping
                if node == owner
                else ErrorCode.not_coordinator
            )
            assert result.partition_error_code is expected


def test_stopping_the_leader_moves_it_to_the_isr_with_a_new_epoch(cluster: BrokerThread) -> None:
    name = topic()
    cluster.call(lambda broker: broker.create_topic(name, 1))
    old = cluster.leader(name)
    with Wire(address(cluster, old)) as wire:
        for i in range(5):
            assert send(wire, name, [b"v%d" % i]).error_code is ErrorCode.none
    cluster.stop_node(old)
    assert cluster.node_state(old) == "stopped"
    new = cluster.leader(name)
    assert new not in (old, -1)
    assert cluster.leader_epoch(name) == 1
    assert old not in cluster.isr(name)
    with Wire(address(cluster, new)) as wire:
        answer = metadata_of(wire, [name])
        assert sorted(b.node_id for b in answer.brokers) == sorted({0, 1, 2} - {old})
        part = answer.topics[0].partitions[0]
        assert (part.leader_id, part.leader_epoch) == (new, 1)
        assert list(part.offline_replicas) == [old]
        # What acks=all acknowledged is all there, and the log goes on from it.
        assert send(wire, name, [b"after"]).base_offset == 5
        assert fetch_from(wire, name, 0, epoch=0).error_code is ErrorCode.fenced_leader_epoch
        assert fetch_from(wire, name, 0, epoch=2).error_code is ErrorCode.unknown_leader_epoch
        assert fetch_from(wire, name, 0, epoch=1).high_watermark == 6
    with pytest.raises(ConnectionRefusedError):
        Wire(address(cluster, old))  # its listener is gone
    cluster.start_node(old)
    wait_for(lambda: old in cluster.isr(name), timeout=10.0)  # caught up: back in sync
    assert cluster.leader(name) == new  # leadership stays where it moved
    cluster.call(lambda broker: broker.topology.check())


@pytest.mark.anyio
async def test_a_produce_parked_on_a_leader_that_stops_goes_with_its_connection() -> None:
    """The acks=all produce waiting on a leader is answered when the leader stops, but
    its connection is closed by then: nothing is written (uvloop raised RuntimeError on
    a write to the closed transport, out of the connection's task)."""
    name = topic()
    async with asyncio.timeout(10), KafkaBroker(nodes=3, replicas=3, follower_delay=5.0) as broker:
        broker.create_topic(name, 1)
        leader = broker.leader(name)
        with Wire(broker.node_address(leader)) as wire:
            wire.send(produce_request([(name, [(0, batch(-1, -1, [b"x"]))])]))
            for _ in range(500):  # appended: parked for the ISR
                if broker.offsets(name)[0].log_end:
                    break
                await asyncio.sleep(0.01)
            await broker.stop_node(leader)
            await asyncio.sleep(0.1)  # the connection's task ends (quietly)
            assert not broker.nodes.connections[leader]


def test_an_isolated_follower_leaves_the_isr_and_heals_back(cluster: BrokerThread) -> None:
    name = topic()
    cluster.call(lambda broker: broker.create_topic(name, 1))
    leader = cluster.leader(name)
    follower = next(n for n in cluster.replicas_of(name) if n != leader)
    cluster.isolate(follower)
    started = time.monotonic()
    wait_for(lambda: follower not in cluster.isr(name), timeout=10.0)
    assert time.monotonic() - started >= 0.4  # the lag bound (0.5 s), not at once
    assert cluster.leader(name) == leader
    with Wire(address(cluster, leader)) as wire:
        # acks=all no longer waits for the isolated follower.
        assert send(wire, name, [b"x"], timeout=2.0).error_code is ErrorCode.none
    cluster.heal(follower)
    wait_for(lambda: follower in cluster.isr(name), timeout=10.0)


def test_an_isolated_node_answers_nothing_until_healed(cluster: BrokerThread) -> None:
    name = topic()
    cluster.call(lambda broker: broker.create_topic(name, 1))
    leader = cluster.leader(name)
    with Wire(address(cluster, leader)) as wire:
        cluster.isolate(leader)
        assert cluster.leader(name) != leader  # fenced: its partitions moved
        wire.send(metadata_request(None))
        wire.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            wire.sock.recv(1)  # held, the socket open
        cluster.heal(leader)
        answer = wire.receive(MetadataResponse)
        assert sorted(b.node_id for b in answer.brokers) == [0, 1, 2]


def test_min_insync_replicas_refuses_acks_all_when_the_isr_is_short(
    cluster: BrokerThread,
) -> None:
    name = topic()

    async def create(broker: KafkaBroker) -> None:
        from aiopurgatory.kafka.configs import check_topic_configs

        broker.create_topic(name, 1)
        broker.admin_api.apply(
            name, check_topic_configs({"min.insync.replicas": "3"}, broker.limits)
        )

    cluster.call(create)
    leader = cluster.leader(name)
    other = next(n for n in range(3) if n != leader)
    cluster.stop_node(other)
    with Wire(address(cluster, leader)) as wire:
        assert send(wire, name, [b"x"]).error_code is ErrorCode.not_enough_replicas
        assert send(wire, name, [b"x"], acks=1).error_code is ErrorCode.none
        assert cluster.offsets(name)[0].log_end == 1  # acks=1 appended, acks=all not


def test_one_node_checks_leader_epochs_and_min_insync_against_its_simulated_replicas() -> None:
    """One node does not ask the nodes who leads (a consumer's fetch would pay a call per
    partition), but still answers a leader epoch that is not its own, and acks=all
    against the replicas it simulates."""
    with running(BrokerThread(replicas=2)) as thread:
        name, short = topic(), topic()

        async def create(broker: KafkaBroker) -> None:
            from aiopurgatory.kafka.configs import check_topic_configs

            broker.create_topic(name, 1)
            broker.create_topic(short, 1)
            broker.admin_api.apply(
                short, check_topic_configs({"min.insync.replicas": "3"}, broker.limits)
            )

        thread.call(create)
        with Wire(thread.bootstrap) as wire:
            assert send(wire, name, [b"a"]).error_code is ErrorCode.none
            assert fetch_from(wire, name, 0, epoch=0).high_watermark == 1
            assert fetch_from(wire, name, 0).high_watermark == 1
            assert fetch_from(wire, name, 0, epoch=1).error_code is ErrorCode.unknown_leader_epoch
            assert send(wire, short, [b"x"]).error_code is ErrorCode.not_enough_replicas
            assert send(wire, short, [b"x"], acks=1).error_code is ErrorCode.none


def test_unreplicated_batches_are_truncated_and_an_idempotent_retry_appended_again() -> None:
    # Followers slow enough that an acks=1 batch is not replicated when its leader stops.
    with running(BrokerThread(nodes=3, replicas=3, follower_delay=0.3)) as thread:
        name = topic()
        thread.call(lambda broker: broker.create_topic(name, 1))
        pid = thread.call(lambda broker: broker.producers.new_id())
        assert pid is not None
        leader = thread.leader(name)
        with Wire(address(thread, leader)) as wire:
            assert send(wire, name, [b"a"], pid=pid, sequence=0).base_offset == 0
            time.sleep(0.5)  # replicated by then (acks=all answered at once? no: waited)
            first = send(wire, name, [b"b"], acks=1, pid=pid, sequence=1)
            assert first.base_offset == 1
        thread.stop_node(leader)
        new = thread.leader(name)
        assert thread.offsets(name)[0].log_end == 1  # "b" was not replicated: gone
        with Wire(address(thread, new)) as wire:
            retry = send(wire, name, [b"b"], acks=-1, pid=pid, sequence=1)
            assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 1)
            again = send(wire, name, [b"b"], acks=-1, pid=pid, sequence=1)
            assert (again.error_code, again.base_offset) == (ErrorCode.none, 1)  # a duplicate
        assert thread.offsets(name)[0].log_end == 2


def test_bounds_and_bad_input() -> None:
    with pytest.raises(ValueError, match="nodes"):
        KafkaBroker(nodes=0)
    with pytest.raises(ValueError, match="nodes"):
        KafkaBroker(nodes=17)
    with pytest.raises(ValueError, match="replicas"):
        KafkaBroker(nodes=2, replicas=3)
    with pytest.raises(ValueError, match="replica_lag"):
        KafkaBroker(nodes=2, replica_lag=0)
    with running(BrokerThread(nodes=2, replicas=2, max_replicas_per_node=4)) as thread:
        thread.create_topic("four", 4)  # 4 replicas on each node: the bound
        with pytest.raises(ValueError, match="max_replicas_per_node"):
            thread.create_topic("more", 1)
        assert "more" not in thread.topics
        with pytest.raises(ValueError, match="no node 5"):
            thread.stop_node(5)
        with pytest.raises(ValueError, match="not stopped"):
            thread.start_node(1)
        thread.stop_node(1)
        with pytest.raises(ValueError, match="stopped already"):
            thread.stop_node(1)
        assert not thread.call(lambda broker: broker.nodes.connections[1])
        assert not [key for key in thread.call(lambda b: b.nodes.followers) if key[1] == 1]


def test_the_command_line_lists_every_node() -> None:
    process, first = start_server(
        "-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+) \(node 0\)", "--nodes", "3"
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert re.fullmatch(r"listening on 127\.0\.0\.1:\d+ \(node 1\)\n", lines[0])
        assert re.fullmatch(r"listening on 127\.0\.0\.1:\d+ \(node 2\)\n", lines[1])
        bootstrap = lines[2].removeprefix("bootstrap: ").strip().split(",")
        assert bootstrap[0] == first
        assert len(set(bootstrap)) == 3
        with Wire(bootstrap[2]) as wire:
            assert len(metadata_of(wire, None).brokers) == 3
    finally:
        assert stop_server(process) == 0


def test_a_partition_whose_isr_is_gone_waits_offline_for_its_last_leader() -> None:
    with running(BrokerThread(nodes=2, replicas=2)) as thread:
        name = topic()
        thread.create_topic(name, 1)
        leader = thread.leader(name)
        other = 1 - leader
        with Wire(address(thread, leader)) as wire:
            assert send(wire, name, [b"a", b"b"]).error_code is ErrorCode.none
        thread.stop_node(other)  # the follower: the ISR is the leader alone
        assert thread.isr(name) == (leader,)
        with Wire(address(thread, leader)) as wire:
            assert send(wire, name, [b"c"]).error_code is ErrorCode.none
        thread.stop_node(leader)  # the last in sync: offline, not led by the stale one
        assert thread.leader(name) == -1
        thread.start_node(other)
        assert thread.leader(name) == -1  # out of sync: no unclean election
        thread.start_node(leader)
        assert thread.leader(name) == leader
        assert thread.offsets(name)[0].high_watermark == 3  # all it acknowledged
        wait_for(lambda: other in thread.isr(name), timeout=10.0)
        thread.call(lambda broker: broker.topology.check())


def test_injected_errors_answer_without_handling_and_delays_hold_answers(
    cluster: BrokerThread,
) -> None:
    name = topic()
    cluster.create_topic(name, 1)
    leader = cluster.leader(name)
    cluster.inject("Produce", "NOT_LEADER_OR_FOLLOWER", count=2, node=leader)
    with Wire(address(cluster, leader)) as wire:
        for _ in range(2):
            assert send(wire, name, [b"x"]).error_code is ErrorCode.not_leader_or_follower
        assert cluster.offsets(name)[0].log_end == 0  # nothing appended
        assert send(wire, name, [b"x"]).error_code is ErrorCode.none
        cluster.delay(300, api="Produce")
        started = time.monotonic()
        assert send(wire, name, [b"y"]).error_code is ErrorCode.none
        assert time.monotonic() - started >= 0.3
        cluster.delay(0, api="Produce")
    lines = cluster.fault_lines
    assert any(line.startswith("fault: inject api=Produce") for line in lines)
    assert sum("effect: injected Produce" in line for line in lines) == 2
    with pytest.raises(ValueError, match="no node 7"):
        cluster.inject("Produce", "NOT_LEADER_OR_FOLLOWER", node=7)


def test_faults_and_their_effects_are_trace_rows(tmp_path: Any) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from aiopurgatory.trace import TraceRecorder

    recorder = TraceRecorder(tmp_path)
    thread = BrokerThread(nodes=3, replicas=3, observer=recorder)
    thread.start()
    try:
        name = topic()
        thread.create_topic(name, 1)
        thread.stop_node(thread.leader(name))
    finally:
        thread.stop()
        recorder.close()
    table = pq.read_table(tmp_path)
    rows = [
        kind
        for purgatory, kind in zip(
            table.column("purgatory").to_pylist(), table.column("kind").to_pylist(), strict=True
        )
        if purgatory == "faults"
    ]
    assert rows[:2] == ["stop_node", "leader_change"]


def test_metadata_v9_gives_the_leader_epoch_librdkafka_trusts(cluster: BrokerThread) -> None:
    """librdkafka takes a partition's leader epoch from Metadata only when the broker
    serves Metadata v9+ (flexible; older brokers' epochs it treats as -1), and only then
    fetches with ``current_leader_epoch`` and validates its position after a leader
    change with OffsetForLeaderEpoch (KIP-320). So v9 is served, and says the epoch."""
    name = topic()
    cluster.create_topic(name, 1)
    old = cluster.leader(name)
    cluster.stop_node(old)
    new = cluster.leader(name)
    with FlexibleWire(address(cluster, new)) as wire:
        answer = wire.call(metadata_request([name], schema=metadata_v9), MetadataResponseV9)
    part = answer.topics[0].partitions[0]
    assert (part.error_code, part.leader_id, part.leader_epoch) == (ErrorCode.none, new, 1)
    assert sorted(b.node_id for b in answer.brokers) == sorted({0, 1, 2} - {old})


def test_metadata_v9_for_every_topic_as_librdkafka_asks_it(cluster: BrokerThread) -> None:
    """librdkafka 2.x asks Metadata v9+ for every topic with a 4-byte placeholder where
    the null array's one byte belongs; Kafka reads the zeros as the three flags and the
    real flags as a tagged field it skips (unknown tags are ignored, KIP-482). kio
    refuses the unknown tag: the broker reads a flexible Metadata request as Kafka."""
    name = topic()
    cluster.create_topic(name, 1)
    header = struct.pack(">hhih", 3, 9, 7, 7) + b"rdkafka" + b"\x00"
    body = bytes.fromhex("00000000" + "01" + "00" + "00" + "00")  # librdkafka's bytes
    with FlexibleWire(address(cluster, 0)) as wire:
        wire.sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        wire.correlation_id = 7
        answer = wire.receive(MetadataResponseV9)
        named = {t.name: t for t in answer.topics}
        assert named[name].partitions[0].leader_epoch == 0
        assert named["__consumer_offsets"].is_internal
        # A topic listed with an unknown tagged field of its own, and trailing bytes.
        tags = bytes([1, 5, 2, 0xAB, 0xCD])  # one field: tag 5, 2 bytes
        body = bytes([2, len(name) + 1]) + name.encode() + tags + bytes([0, 0, 0, 0, 0, 0])
        wire.sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        answer = wire.receive(MetadataResponseV9)
        assert [t.name for t in answer.topics] == [name]


def describe_broker(wire: Wire, resource: str) -> Any:
    """DescribeConfigs v1 of the broker resource ``resource`` (broker.id and
    advertised.listeners): its result."""
    from kio.schema.describe_configs.v1 import request as describe_configs
    from kio.schema.describe_configs.v1.response import DescribeConfigsResponse

    request = describe_configs.DescribeConfigsRequest(
        resources=(
            describe_configs.DescribeConfigsResource(
                resource_type=i8(4),  # BROKER
                resource_name=resource,
                configuration_keys=("broker.id", "advertised.listeners"),
            ),
        ),
        include_synonyms=False,
    )
    (result,) = wire.call(request, DescribeConfigsResponse).results
    return result


def test_describe_configs_answers_a_broker_resource_on_that_broker_only(
    cluster: BrokerThread,
) -> None:
    """Each node reports its own broker.id and listener; a broker resource sent to another
    node is refused INVALID_REQUEST, as Kafka's ConfigHelper refuses it (clients send
    each broker resource to its broker)."""
    for node in range(3):
        with Wire(address(cluster, node)) as wire:
            result = describe_broker(wire, str(node))
            assert (result.error_code, result.error_message) == (ErrorCode.none, None)
            values = {entry.name: entry.value for entry in result.configs}
            assert values == {
                "broker.id": str(node),
                "advertised.listeners": f"PLAINTEXT://{address(cluster, node)}",
            }
            other = (node + 1) % 3
            refused = describe_broker(wire, str(other))
            assert (refused.error_code, refused.error_message, refused.configs) == (
                ErrorCode.invalid_request,
                f"Unexpected broker id, expected {node} or empty string, but received {other}",
                (),
            )
            bad = describe_broker(wire, "one")
            assert (bad.error_code, bad.error_message) == (
                ErrorCode.invalid_request,
                "Broker id must be an integer, but it is: one",
            )
            default = describe_broker(wire, "")  # the cluster-wide defaults: none here
            assert (default.error_code, default.configs) == (ErrorCode.none, ())


@pytest.mark.anyio
async def test_aiokafka_admin_describes_each_brokers_own_configs() -> None:
    """aiokafka's admin client sends each broker resource to its broker: every node
    answers its own broker.id (it was 0 on all of them)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async with asyncio.timeout(15), KafkaBroker(nodes=3, replicas=3) as broker:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            answers = await admin.describe_configs(
                [
                    ConfigResource(ConfigResourceType.BROKER, str(node), {"broker.id": None})
                    for node in range(3)
                ]
            )
        finally:
            await admin.close()
    ids = sorted(
        (resource[3], {entry[0]: entry[1] for entry in resource[4]}["broker.id"])
        for answer in answers
        for resource in answer.resources
    )
    assert ids == [("0", "0"), ("1", "1"), ("2", "2")]
