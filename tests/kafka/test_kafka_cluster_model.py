"""A model-based test of the cluster in one process (issue 37): hypothesis drives a
three-node cluster through random sequences of an idempotent producer's acks=all sends
(a batch not acknowledged is sent again, with its sequence) and faults (stop, start,
isolate, heal, time passing) and checks Kafka's promises after every step:

* the topology's invariants (:meth:`Topology.check`): a leader is up and in its ISR,
  the ISR holds replicas only, a node that is not up leads nothing;
* leader epochs and high watermarks never go back;
* every acks=all produce acknowledged is below the high watermark;
* at the end, once every node is back: each acknowledged record is in its partition's
  log at the offset it was acknowledged at, and once (no record lost, none appended
  twice), whatever faults came between.

The produces go over the wire to the partition's leader, as a client's would; the
broker runs in its own thread (:class:`BrokerThread`). The examples are derandomized,
so that CI runs the same sequences every time: a failure here is a bug, not chance.
"""

from __future__ import annotations

import struct
import time
import uuid

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse

from aiopurgatory.kafka import BrokerThread

from ..support.helpers import run_derandomized, watchdog
from ..support.kafka_wire import Wire, address, fetch_from, ms, send

NODES = 3
PARTITIONS = 2
REPLICA_LAG = 0.2
"""Seconds a follower may lag before it leaves the ISR: short, so that an acks=all
produce held by an isolated follower is answered within a step."""
PRODUCE_TIMEOUT = 1.0
"""The produce's own timeout (REQUEST_TIMED_OUT after it)."""
SETTLE = 10.0
"""Seconds the cluster has, once every node is back, to lead and replicate everything."""


class ClusterMachine(RuleBasedStateMachine):
    """One cluster per example; the model is what was acknowledged, and where."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster = BrokerThread(nodes=NODES, replicas=NODES, replica_lag=REPLICA_LAG)
        self.cluster.start()
        self.topic = f"model-{uuid.uuid4().hex[:8]}"
        self.acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        """Per partition: offset -> the value acknowledged there."""
        self.epochs = [0] * PARTITIONS
        self.hws = [0] * PARTITIONS
        self.sent = 0
        self.producer_id = -1
        self.sequences = [0] * PARTITIONS
        """Per partition, the idempotent producer's next sequence."""
        self.pending: list[list[bytes] | None] = [None] * PARTITIONS
        """Per partition, the batch sent and not acknowledged yet (retried first)."""

    @initialize()
    def create(self) -> None:
        self.cluster.create_topic(self.topic, PARTITIONS)
        with Wire(self.cluster.bootstrap.split(",")[0]) as wire:
            init = wire.call(
                InitProducerIdRequest(transactional_id=None, transaction_timeout=ms(60)),
                InitProducerIdResponse,
            )
        assert init.error_code is ErrorCode.none
        self.producer_id = int(init.producer_id)

    def states(self) -> list[str]:
        return [self.cluster.node_state(n) for n in range(NODES)]

    # -- produces ------------------------------------------------------------------------

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 3))
    def produce(self, partition: int, count: int) -> None:
        """An idempotent producer's send: a batch not acknowledged is sent again, with
        its sequence, before any new one (as a client's retries do)."""
        leader = self.cluster.leader(self.topic, partition)
        if leader == -1:
            return  # offline: no replica of its ISR is up
        values = self.pending[partition]
        if values is None:
            self.sent += 1
            values = [b"v%d-%d" % (self.sent, i) for i in range(count)]
            self.pending[partition] = values
        sequence = self.sequences[partition]
        try:
            with Wire(address(self.cluster, leader)) as wire:
                answer = send(
                    wire,
                    self.topic,
                    values,
                    partition=partition,
                    pid=self.producer_id,
                    sequence=sequence,
                    timeout=PRODUCE_TIMEOUT,
                )
        except OSError:
            return  # the leader stopped between the question and the produce
        if answer.error_code is ErrorCode.none:
            for i, value in enumerate(values):
                offset = answer.base_offset + i
                assert offset not in self.acked[partition], (partition, offset)
                self.acked[partition][offset] = value
            self.pending[partition] = None
            self.sequences[partition] = sequence + len(values)
        else:
            # Not acknowledged: it may be in the log (a timeout is no refusal); the retry
            # must then be answered as a duplicate, not appended again.
            assert answer.error_code in {
                ErrorCode.request_timed_out,
                ErrorCode.not_leader_or_follower,
                ErrorCode.not_enough_replicas,
            }, answer

    # -- faults ----------------------------------------------------------------------------

    def pick(self, data: st.DataObject, state: str) -> int:
        """A node in ``state`` (the rules' preconditions make sure there is one)."""
        return data.draw(st.sampled_from([n for n, s in enumerate(self.states()) if s == state]))

    @precondition(lambda self: "up" in self.states())
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        self.cluster.stop_node(self.pick(data, "up"))

    @precondition(lambda self: "stopped" in self.states())
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.cluster.start_node(self.pick(data, "stopped"))

    @precondition(lambda self: "up" in self.states())
    @rule(data=st.data())
    def isolate(self, data: st.DataObject) -> None:
        self.cluster.isolate(self.pick(data, "up"))

    @precondition(lambda self: "isolated" in self.states())
    @rule(data=st.data())
    def heal(self, data: st.DataObject) -> None:
        self.cluster.heal(self.pick(data, "isolated"))

    @rule(seconds=st.sampled_from([0.05, 0.3]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)  # the ISR check runs, followers fetch

    # -- what holds after every step ---------------------------------------------------------

    @invariant()
    def promises(self) -> None:
        if self.topic not in self.cluster.topics:  # before create
            return
        self.cluster.call(lambda broker: broker.topology.check())
        offsets = self.cluster.offsets(self.topic)
        for p in range(PARTITIONS):
            epoch = self.cluster.leader_epoch(self.topic, p)
            assert epoch >= self.epochs[p], (p, epoch, self.epochs[p])
            self.epochs[p] = epoch
            hw = offsets[p].high_watermark
            assert hw >= self.hws[p], (p, hw, self.hws[p], self.states())
            self.hws[p] = hw
            assert all(offset < hw for offset in self.acked[p]), (p, hw, self.acked[p])

    def teardown(self) -> None:
        try:
            if self.topic in self.cluster.topics:
                self.everything_acknowledged_is_there_once()
        finally:
            self.cluster.stop()

    def everything_acknowledged_is_there_once(self) -> None:
        for node, state in enumerate(self.states()):
            if state == "stopped":
                self.cluster.start_node(node)
            elif state == "isolated":
                self.cluster.heal(node)
        deadline = time.monotonic() + SETTLE
        for p in range(PARTITIONS):
            while self.cluster.leader(self.topic, p) == -1 or (
                len(self.cluster.isr(self.topic, p)) < NODES
            ):
                assert time.monotonic() < deadline, (p, self.cluster.isr(self.topic, p))
                time.sleep(0.02)
            leader = self.cluster.leader(self.topic, p)
            with Wire(address(self.cluster, leader)) as wire:
                log = (
                    fetch_from(wire, self.topic, 0, partition=p, partition_max=1 << 24).records
                    or b""
                )
                for offset, value in self.acked[p].items():
                    assert log.count(value) == 1, (p, offset, value)
                    # The batch holding that offset is the first one a fetch from it returns.
                    first = fetch_from(wire, self.topic, offset, partition=p).records or b""
                    (base,) = struct.unpack(">q", first[:8])
                    (length,) = struct.unpack(">i", first[8:12])
                    assert base <= offset, (p, offset, base)
                    assert value in first[: 12 + length], (p, offset, value)


@pytest.mark.slow
def test_acknowledged_records_survive_any_sequence_of_faults() -> None:
    with watchdog(240.0):
        run_derandomized(ClusterMachine, max_examples=12, steps=14)
