"""The broker simulator (aiopurgatory.kafka.simulator, run by examples/broker/sim.py): produce
and fetch semantics on virtual time, the simulation end to end, and its command line."""

from __future__ import annotations

import asyncio
import math
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory.kafka.delayed import DelayedProduce
from aiopurgatory.kafka.log import Error, TopicPartition
from aiopurgatory.kafka.simulator import (
    Broker,
    DelayedFetch,
    Record,
    SimulationConfig,
    run_simulation,
)

ROOT = Path(__file__).resolve().parents[2]
TICK = 0.001
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)


async def advance(clock: ap.ManualClock, seconds: float) -> None:
    """Move virtual time; a timer that keeps re-arming must fail the test, not hang it."""
    async with asyncio.timeout(5.0):
        await clock.advance(seconds)


def records(count: int, size: int = 100) -> list[Record]:
    return [Record(size, 0.0) for _ in range(count)]


@dataclass
class Finish:
    op: ap.DelayedOperation[Any]
    outcome: ap.Outcome
    at: float
    hw: dict[TopicPartition, int]
    """Each partition's HW at the instant the operation finished."""


class Recorder:
    """An operation observer noting when each operation finished, and the HWs then."""

    def __init__(self) -> None:
        self.broker: Broker | None = None
        self.finished: list[Finish] = []

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        assert self.broker is not None
        hw = {tp: p.hw for tp, p in self.broker.partitions.items()}
        self.finished.append(Finish(op, outcome, finished, hw))

    def of(self, op: ap.DelayedOperation[Any]) -> Finish:
        (finish,) = [f for f in self.finished if f.op is op]
        return finish


@pytest.fixture
def clock() -> ap.ManualClock:
    return ap.ManualClock()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def make_broker(clock: ap.ManualClock, recorder: Recorder) -> AsyncIterator[Any]:
    brokers: list[Broker] = []

    def make(partitions: int = 2, followers: int = 2) -> Broker:
        broker = Broker(partitions=partitions, followers=followers, clock=clock, observer=recorder)
        recorder.broker = broker
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.close()


def follower_fetch(
    broker: Broker, replica: int, offsets: dict[TopicPartition, int]
) -> DelayedFetch:
    """A follower reporting its log end offsets (a fetch from them)."""
    return broker.fetch(offsets, min_bytes=1, max_wait=10.0, replica=replica)


@pytest.mark.anyio
async def test_acks_all_waits_for_every_follower(make_broker: Any, recorder: Recorder) -> None:
    broker = make_broker()
    produce = broker.produce({TP0: records(3)}, timeout=10.0)
    assert not produce.done()
    follower_fetch(broker, 0, {TP0: 3})
    assert broker.partitions[TP0].hw == 0
    assert not produce.done()
    follower_fetch(broker, 1, {TP0: 2})
    assert broker.partitions[TP0].hw == 2
    assert not produce.done()
    follower_fetch(broker, 1, {TP0: 3})
    assert produce.done()
    assert await produce == {TP0: Error.NONE}
    assert recorder.of(produce).hw[TP0] >= 3


@pytest.mark.anyio
async def test_acks_all_never_acknowledged_before_the_hw_covers_it(
    make_broker: Any, recorder: Recorder
) -> None:
    broker = make_broker(partitions=3, followers=2)
    tps = list(broker.partitions)
    rng = random.Random(4)
    follower_offsets = [dict.fromkeys(tps, 0) for _ in range(2)]
    produces: list[DelayedProduce] = []
    for _ in range(400):
        if rng.random() < 0.4:
            batches = {tp: records(rng.randint(1, 3)) for tp in rng.sample(tps, rng.randint(1, 3))}
            produces.append(broker.produce(batches, timeout=60.0))
        else:
            replica = rng.randrange(2)
            offsets = follower_offsets[replica]
            for tp in tps:  # a follower catches up by some amount
                offsets[tp] = rng.randint(offsets[tp], broker.partitions[tp].leo)
            follower_fetch(broker, replica, offsets)
        for op in produces:  # neither early nor late
            covered = all(p.hw >= end for p, end in op.required.items())
            assert op.done() == covered
    acknowledged = [op for op in produces if op.done()]
    assert 0 < len(acknowledged) < len(produces)
    for op in acknowledged:
        finish = recorder.of(op)
        assert finish.outcome is ap.Outcome.COMPLETED
        assert all(finish.hw[p.tp] >= end for p, end in op.required.items())
        assert set((await op).values()) == {Error.NONE}


@pytest.mark.anyio
async def test_stalled_follower_times_produce_out_at_its_deadline(
    make_broker: Any, clock: ap.ManualClock, recorder: Recorder
) -> None:
    broker = make_broker()
    # Follower 1 has TP1's first record, then stalls; follower 0 keeps up.
    broker.produce({TP1: records(1)}, timeout=0.5)
    follower_fetch(broker, 1, {TP1: 1})
    follower_fetch(broker, 0, {TP1: 1})
    await advance(clock, 0.1)
    produce = broker.produce({TP0: records(2), TP1: records(1)}, timeout=0.5)
    deadline = clock.time() + 0.5
    follower_fetch(broker, 0, {TP0: 2, TP1: 2})
    await advance(clock, 0.5 - TICK)
    assert not produce.done()
    await advance(clock, 2 * TICK)
    assert produce.done()
    assert await produce == {TP0: Error.REQUEST_TIMED_OUT, TP1: Error.REQUEST_TIMED_OUT}
    finish = recorder.of(produce)
    assert finish.outcome is ap.Outcome.EXPIRED
    assert deadline <= finish.at <= deadline + TICK + 1e-9


@pytest.mark.anyio
async def test_timeout_is_per_partition(make_broker: Any, clock: ap.ManualClock) -> None:
    broker = make_broker()
    produce = broker.produce({TP0: records(1), TP1: records(1)}, timeout=0.2)
    follower_fetch(broker, 0, {TP0: 1, TP1: 1})
    follower_fetch(broker, 1, {TP1: 1})  # follower 1 never gets TP0's record
    await advance(clock, 0.2 + 2 * TICK)
    assert await produce == {TP0: Error.REQUEST_TIMED_OUT, TP1: Error.NONE}


@pytest.mark.anyio
async def test_fetch_returns_as_soon_as_min_bytes_are_there(
    make_broker: Any, clock: ap.ManualClock
) -> None:
    broker = make_broker(followers=0)  # the HW follows the log end at once
    fetch = broker.fetch({TP0: 0, TP1: 0}, min_bytes=250, max_wait=1.0)
    broker.produce({TP0: records(1)}, timeout=1.0)
    broker.produce({TP1: records(1)}, timeout=1.0)
    assert not fetch.done()  # 200 bytes
    broker.produce({TP0: records(1)}, timeout=1.0)
    assert fetch.done()
    assert clock.time() == 0.0
    result = await fetch
    assert [len(result[TP0]), len(result[TP1])] == [2, 1]


@pytest.mark.anyio
async def test_fetch_short_of_min_bytes_waits_max_wait(
    make_broker: Any, clock: ap.ManualClock, recorder: Recorder
) -> None:
    broker = make_broker(followers=0)
    broker.produce({TP0: records(2)}, timeout=1.0)
    fetch = broker.fetch({TP0: 0, TP1: 0}, min_bytes=10_000, max_wait=0.3)
    await advance(clock, 0.3 - TICK)
    assert not fetch.done()
    await advance(clock, 2 * TICK)
    assert fetch.done()
    assert recorder.of(fetch).at >= 0.3
    result = await fetch
    assert [len(result[TP0]), len(result[TP1])] == [2, 0]  # what there is


@pytest.mark.anyio
async def test_consumers_read_up_to_the_hw_followers_up_to_the_log_end(
    make_broker: Any,
) -> None:
    broker = make_broker(followers=1)
    consumer = broker.fetch({TP0: 0}, min_bytes=1, max_wait=10.0)
    follower = follower_fetch(broker, 0, {TP0: 0})
    broker.produce({TP0: records(2)}, timeout=10.0)
    assert follower.done()
    assert not consumer.done()
    assert len((await follower)[TP0]) == 2
    follower_fetch(broker, 0, {TP0: 2})  # the follower has both: the HW moves
    assert consumer.done()
    assert len((await consumer)[TP0]) == 2


@pytest.mark.anyio
async def test_bad_requests_are_rejected(make_broker: Any) -> None:
    broker = make_broker()
    with pytest.raises(ValueError, match="unknown partition"):
        broker.produce({TopicPartition("other", 0): records(1)}, timeout=1.0)
    with pytest.raises(ValueError, match="out of range"):
        broker.fetch({TP0: 1}, min_bytes=1, max_wait=1.0)
    assert broker.partitions[TP0].leo == 0  # nothing appended by the failed request


@pytest.mark.parametrize("timeout", [math.nan, -1.0, math.inf])
@pytest.mark.anyio
async def test_a_bad_produce_appends_nothing(make_broker: Any, timeout: float) -> None:
    """Validate, then append: a produce refused for its timeout leaves no records that
    its retry would duplicate, and a batch to an unknown partition none on the others."""
    broker = make_broker()
    with pytest.raises(ValueError, match="timeout"):
        broker.produce({TP0: records(3), TP1: records(2)}, timeout=timeout)
    with pytest.raises(ValueError, match="unknown partition"):
        broker.produce({TP0: records(3), TopicPartition("other", 0): records(1)}, timeout=1.0)
    assert broker.partitions[TP0].leo == broker.partitions[TP1].leo == 0
    broker.produce({TP0: records(3)}, timeout=1.0)  # the retry
    assert broker.partitions[TP0].leo == 3


@pytest.mark.anyio
async def test_negative_sizes_and_bad_fetches_are_refused(make_broker: Any) -> None:
    broker = make_broker()
    with pytest.raises(ValueError, match="size"):
        Record(-1, 0.0)
    with pytest.raises(ValueError, match="min_bytes"):
        broker.fetch({TP0: 0}, min_bytes=-1, max_wait=1.0)
    for max_wait in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="max_wait"):
            broker.fetch({TP0: 0}, min_bytes=1, max_wait=max_wait)
    broker.produce({TP0: records(2), TP1: records(2)}, timeout=1.0)
    with pytest.raises(ValueError, match="no follower"):
        broker.fetch({TP0: 2, TP1: 2}, min_bytes=1, max_wait=1.0, replica=9)
    # The refused follower fetch moved no follower's LEO, hence no HW.
    assert all(leo == 0 for p in broker.partitions.values() for leo in p.follower_leos)
    assert broker.fetch_purgatory.num_delayed() == 0


class Collect:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, ap.Outcome]] = []

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        self.outcomes.append((purgatory, outcome))


@pytest.mark.anyio
async def test_simulation_with_a_stalled_follower() -> None:
    config = SimulationConfig(
        duration=0.8, produce_rate=50.0, produce_timeout=0.15, stall_at=0.2, stall_for=0.4
    )
    observer = Collect()
    report = await run_simulation(config, observer=observer)
    assert report.timed_out > 0
    assert report.acknowledged > 0
    assert report.acknowledged + report.timed_out == (
        report.produce_requests * config.partitions_per_request
    )
    assert report.records_fetched > 0
    assert report.produce_stats.expired > 0
    assert report.produce_stats.pending == report.fetch_stats.pending == 0
    finished = report.produce_stats.completed + report.produce_stats.expired
    finished += report.fetch_stats.completed + report.fetch_stats.expired
    finished += report.fetch_stats.cancelled
    assert len(observer.outcomes) == finished
    assert "timed out:" in report.format()


@pytest.mark.anyio
async def test_simulation_without_stall_acknowledges_everything() -> None:
    config = SimulationConfig(duration=0.5, produce_rate=50.0, produce_timeout=2.0, stall_for=0.0)
    report = await run_simulation(config)
    assert report.timed_out == 0
    assert report.acknowledged == report.produce_requests * config.partitions_per_request > 0
    assert report.produce_stats.expired == 0


def test_sim_command_line(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    command = [sys.executable, "examples/broker/sim.py", "--duration", "0.8"]
    command += ["--stall-at", "0.1", "--stall-for", "0.4", "--produce-timeout", "0.15"]
    command += ["--trace", str(tmp_path / "trace")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert int(lines["timed out"].split()[0]) > 0
    assert int(lines["acknowledged"].split()[0]) > 0
    assert "0 pending" in lines["produce purgatory"]
    assert list((tmp_path / "trace").glob("trace-*.parquet"))


def test_sim_rejects_bad_options() -> None:
    command = [sys.executable, "examples/broker/sim.py", "--duration", "-1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "duration" in done.stderr
