"""Compacted topics (issue 48): segments that roll, ``cleanup.policy=compact``, the cleaner.

The log's segments are shown to roll on size and on the broker's clock; the cleaner to
keep the latest record per key at its original offset, tombstones for
``delete.retention.ms``, and to work a bounded amount per step; clients (the wire,
aiokafka) to read the compacted log as Kafka's; a model (hypothesis) to hold after every
cleaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiopurgatory.kafka.log import Partition, TopicPartition

TP = TopicPartition("c", 0)


@dataclass(frozen=True, slots=True)
class Sized:
    size: int
    count: int = 1


def test_segments_roll_past_segment_bytes_and_when_segment_ms_old() -> None:
    log: Partition[Sized] = Partition(TP, 0)
    log.segment_bytes, log.segment_ms = 100, 1000
    log.append([Sized(60), Sized(40)], now=0)  # 100 bytes: fits
    assert log.segments == [0]
    log.append([Sized(1)], now=10)  # past 100 bytes: a new segment first
    assert log.segments == [0, 2]
    log.append([Sized(1)], now=1009)
    assert log.segments == [0, 2]
    log.append([Sized(1)], now=1010)  # the active segment is 1000 ms old
    assert log.segments == [0, 2, 4]
    assert log.active_start == 4
    assert not log.roll_due(2009)
    assert log.roll_due(2010)  # idle, old: rolled at the log end
    assert log.segments == [0, 2, 4, 5]
    assert not log.roll_due(10_000)  # an empty active segment never rolls


def test_retention_prunes_the_segments_below_the_log_start() -> None:
    log: Partition[Sized] = Partition(TP, 0, retain_bytes=3)
    log.segment_bytes = 2
    log.append([Sized(1) for _ in range(6)])
    assert log.log_start == 3
    assert log.segments == [2, 4]  # the one holding the log start, and the active one
