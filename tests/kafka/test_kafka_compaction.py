"""Compacted topics (issue 48): segments that roll, ``cleanup.policy=compact``, the cleaner.

The log's segments are shown to roll on size and on the broker's clock; the cleaner to
keep the latest record per key at its original offset, tombstones for
``delete.retention.ms``, and to work a bounded amount per step; clients (the wire,
aiokafka) to read the compacted log as Kafka's; a model (hypothesis) to hold after every
cleaning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.record.default_records import DefaultRecordBatch
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

import aiopurgatory as ap
from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.cleaner import Cleaner
from aiopurgatory.kafka.configs import check_topic_configs
from aiopurgatory.kafka.core import BrokerCore
from aiopurgatory.kafka.groups import GroupCoordinator
from aiopurgatory.kafka.limits import Limits
from aiopurgatory.kafka.log import Partition, TopicPartition
from aiopurgatory.kafka.producers import ProducerTable
from aiopurgatory.kafka.records import (
    BATCH_ATTRIBUTES,
    BATCH_BASE_SEQUENCE,
    BATCH_CRC,
    BATCH_HEADER_BYTES,
    BATCH_PRODUCER_EPOCH,
    BATCH_PRODUCER_ID,
    CONTROL,
    TRANSACTIONAL,
    IncomingBatch,
    StoredBatch,
    batch_records,
)
from aiopurgatory.kafka.transactions import TransactionCoordinator

from ..support.kafka_records import COMPRESS, plain_batch
from ..support.kafka_wire import Wire, create, name, send

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


# -- the cleaner on the core (no sockets) ---------------------------------------------------


def keyed_batch(records: list[tuple[bytes | None, bytes | None]], base: int) -> StoredBatch:
    """A stored v2 batch of (key, value) records at offsets from ``base``."""
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    data = bytearray(plain_batch(records, now))
    struct.pack_into(">q", data, 0, base)
    stamp = int(now.timestamp() * 1000)
    return StoredBatch(bytes(data), len(records), stamp, stamp)


class Log:
    """A compacted topic's partition on a bare core, its cleaner on a clock of our own."""

    def __init__(self, **configs: str) -> None:
        self.now = int(time.time() * 1000)
        self.limits = Limits(log_cleaner_step_bytes=256)
        self.core: BrokerCore[StoredBatch] = BrokerCore(followers=0)
        self.core.segment_now = lambda: self.now
        self.cleaner = Cleaner(self.core, self.limits, lambda: self.now)
        self.core.create_topic("c", 1)
        settings = {"cleanup.policy": "compact", "segment.ms": "1000", **configs}
        self.cleaner.configure("c", check_topic_configs(settings, self.limits))
        self.partition = self.core.partitions[TP]
        self.appended: dict[int, tuple[bytes | None, bytes | None]] = {}

    def append(self, *records: tuple[bytes | None, bytes | None]) -> None:
        base = self.partition.leo
        self.core.append({TP: [keyed_batch(list(records), base)]})
        for i, record in enumerate(records):
            self.appended[base + i] = record

    def clean(self) -> int:
        """Run the cleaner until it has nothing to do; returns its steps."""
        steps = 0
        while self.cleaner.step():
            steps += 1
            assert steps < 100_000
        return steps

    def records(self) -> list[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every data record in the log, in order."""
        out = []
        for batch in self.partition.retained():
            base = batch.end - batch.count
            if batch.data[BATCH_ATTRIBUTES + 1] & CONTROL:
                continue  # a marker
            for record in batch_records(batch.data, 1 << 24):
                key, _value = self.appended[base + record.offset_delta]
                assert key == record.key
                out.append((base + record.offset_delta, record.key, _value))
        return out


def txn_batch(
    records: list[tuple[bytes | None, bytes | None]], base: int, pid: int, epoch: int, sequence: int
) -> StoredBatch:
    """A transactional stored batch of ``pid`` at ``epoch`` (CRC set again)."""
    batch = keyed_batch(records, base)
    data = bytearray(batch.data)
    struct.pack_into(">h", data, BATCH_ATTRIBUTES, TRANSACTIONAL)
    struct.pack_into(">qhi", data, BATCH_PRODUCER_ID, pid, epoch, sequence)
    struct.pack_into(">I", data, BATCH_CRC, crc32c(bytes(data[BATCH_ATTRIBUTES:])))
    batch.data = bytes(data)
    return batch


class TxnLog(Log):
    """A :class:`Log` with a transaction coordinator: its LSO, markers and aborted index."""

    def __init__(self, **configs: str) -> None:
        super().__init__(**configs)
        self.txns = TransactionCoordinator(
            self.core,
            ProducerTable(max_producer_states=100),
            GroupCoordinator(),
            self.limits,
            clock=ap.ManualClock(),
        )
        self.cleaner.transactions = self.txns
        self.sequences: dict[str, int] = {}

    def send(self, tid: str, *records: tuple[bytes | None, bytes | None]) -> None:
        """``records`` in a batch of transactional id ``tid``'s open transaction (begun
        if none is)."""
        if tid not in self.txns.transactions:
            self.txns.init_producer(tid, 60_000, -1, -1, ErrorCode.producer_fenced)
        txn = self.txns.transactions[tid]
        self.txns.add_partitions(txn, [TP])
        base, sequence = self.partition.leo, self.sequences.get(tid, 0)
        self.sequences[tid] = sequence + len(records)
        batch = txn_batch(list(records), base, txn.producer_id, txn.epoch, sequence)
        incoming = IncomingBatch(
            bytearray(batch.data), len(records), 0, txn.producer_id, txn.epoch, sequence, True
        )
        self.txns.appended(TP, incoming, base)
        self.core.append({TP: [batch]})
        for i, record in enumerate(records):
            self.appended[base + i] = record

    def end(self, tid: str, *, commit: bool) -> None:
        assert self.txns.end(self.txns.transactions[tid], commit) is ErrorCode.none

    def markers(self) -> list[int]:
        """The offsets of the markers in the log."""
        return [
            batch.end - 1
            for batch in self.partition.retained()
            if batch.data[BATCH_ATTRIBUTES + 1] & CONTROL
        ]


@pytest.mark.anyio
async def test_committed_transactional_records_are_compacted_as_any_other() -> None:
    log = TxnLog()
    try:
        log.append((b"a", b"a1"))  # 0
        log.send("t", (b"a", b"a2"), (b"b", b"b1"))  # 1, 2
        log.end("t", commit=True)  # 3
        log.send("t", (b"a", b"a3"))  # 4
        log.end("t", commit=True)  # 5
        log.now += 1000
        log.append((b"z", b"z1"))  # 6: rolls, offsets 0-5 are closed
        log.clean()
        # The committed a3 hides the plain a1 and the committed a2.
        assert log.records() == [(2, b"b", b"b1"), (4, b"a", b"a3"), (6, b"z", b"z1")]
        assert log.markers() == [3, 5]  # their transactions' records were there to clean
        rewritten = log.partition.read(1, 7, 1)[0]
        assert rewritten.end == 3  # its offsets, its producer's sequence kept
        data, pid = rewritten.data, log.txns.transactions["t"].producer_id
        assert data[BATCH_ATTRIBUTES + 1] == TRANSACTIONAL
        assert struct.unpack_from(">qhi", data, BATCH_PRODUCER_ID) == (pid, 0, 0)
        assert struct.unpack_from(">h", data, BATCH_PRODUCER_EPOCH) == (0,)
        assert struct.unpack_from(">i", data, BATCH_BASE_SEQUENCE) == (0,)
        assert crc32c(data[BATCH_ATTRIBUTES:]) == struct.unpack_from(">I", data, BATCH_CRC)[0]
    finally:
        log.txns.close()


@pytest.mark.anyio
@pytest.mark.parametrize("commit", [True, False])
async def test_an_open_transaction_stops_the_cleaner_at_its_first_offset(commit: bool) -> None:
    log = TxnLog()
    try:
        log.append((b"a", b"a1"))  # 0
        log.send("t", (b"a", b"a2"))  # 1: open, the LSO
        log.append((b"a", b"a4"))  # 2
        log.now += 1000
        log.append((b"z", b"z1"))  # 3: rolls
        log.clean()
        # Nothing at or past the LSO is cleaned nor hides a1.
        everything = [(i, *log.appended[i]) for i in range(4)]
        assert log.records() == everything
        log.end("t", commit=commit)  # 4
        log.now += 1000
        log.append((b"y", b"y1"))  # 5: rolls
        log.clean()
        assert log.records() == [(2, b"a", b"a4"), (3, b"z", b"z1"), (5, b"y", b"y1")]
        assert log.markers() == [4]
    finally:
        log.txns.close()


@pytest.mark.anyio
async def test_the_cleaner_keeps_the_latest_record_per_key_at_its_offset() -> None:
    log = Log()
    for version in (b"1", b"2", b"3"):
        for key in (b"a", b"b", b"c"):
            log.append((key, key + version))
    log.append((b"a", b"a4"), (b"b", b"b4"))  # one batch: 9, 10
    log.clean()
    assert log.records() == [(i, *log.appended[i]) for i in range(11)]  # active: not yet
    log.now += 1000  # the active segment is segment.ms old: rolled, then cleaned
    log.append((b"d", b"d1"))
    log.clean()
    assert log.records() == [
        (8, b"c", b"c3"),
        (9, b"a", b"a4"),
        (10, b"b", b"b4"),
        (11, b"d", b"d1"),
    ]
    assert log.partition.leo == 12
    assert log.partition.log_start == 0
    assert log.partition.read(3, 12, 1 << 20)[0].end - 1 == 8  # a fetch in a gap moves on
    assert log.core.retained_bytes == log.partition.retained_bytes


@pytest.mark.anyio
async def test_a_tombstone_stays_delete_retention_ms_after_its_first_cleaning_then_goes() -> None:
    log = Log(**{"delete.retention.ms": "5000"})
    log.append((b"a", b"a1"), (b"b", b"b1"))
    log.append((b"a", None))  # a delete of a
    log.now += 1000
    log.append((b"c", b"c1"))  # rolls: offsets 0-2 are closed
    log.clean()
    assert log.records() == [(1, b"b", b"b1"), (2, b"a", None), (3, b"c", b"c1")]
    log.now += 4000
    log.clean()
    assert (2, b"a", None) in log.records()  # 4 s after: kept
    log.now += 1001
    log.clean()  # past the horizon: a pass with nothing dirty drops it
    assert log.records() == [(1, b"b", b"b1"), (3, b"c", b"c1")]
    assert log.partition.leo == 4


@pytest.mark.anyio
async def test_min_compaction_lag_and_the_dirty_ratio_hold_a_log_back() -> None:
    log = Log(**{"min.compaction.lag.ms": "10000", "min.cleanable.dirty.ratio": "0.9"})
    log.append((b"a", b"a1"))
    log.append((b"a", b"a2"))
    log.now += 1000
    log.append((b"b", b"b1"))  # rolled, but the records are 1 s old
    log.clean()
    assert [r[0] for r in log.records()] == [0, 1, 2]
    log.now += 10_000
    log.clean()  # old enough, wholly dirty (ratio 1)
    assert [r[0] for r in log.records()] == [1, 2]
    log.append((b"a", b"a3"))  # 3 is in the active segment (rolled at 3)
    log.now += 1000
    log.append((b"c", b"c1"))
    log.now += 10_000
    log.append((b"d", b"d1"))
    log.clean()  # dirty: 2 batches of 4, below 0.9: left
    assert [r[0] for r in log.records()] == [1, 2, 3, 4, 5]


@pytest.mark.anyio
async def test_max_compaction_lag_cleans_below_the_ratio() -> None:
    log = Log(**{"min.cleanable.dirty.ratio": "1.0", "max.compaction.lag.ms": "60000"})
    log.append((b"a", b"a1"))
    log.append((b"a", b"a2"))
    log.now += 1000
    log.append((b"b", b"b1"))
    log.clean()
    # Ratio 1.0 reached (all dirty): cleaned at once.
    assert [r[0] for r in log.records()] == [1, 2]
    log.append((b"b", b"b2"))
    log.now += 1000
    log.append((b"c", b"c1"))
    log.clean()  # dirty 2 of 3 batches: below 1.0
    assert [r[0] for r in log.records()] == [1, 2, 3, 4]
    log.now += 60_001
    log.clean()  # the oldest dirty record is past max.compaction.lag.ms
    assert [r[0] for r in log.records()] == [1, 3, 4]


@pytest.mark.anyio
async def test_the_cleaner_works_a_bounded_step_at_a_time() -> None:
    log = Log()
    for i in range(200):
        log.append((b"k%d" % (i % 10), b"v%d" % i))
    log.now += 1000
    log.append((b"last", b"x"))
    steps = log.clean()
    assert steps > 20  # 256 bytes a step: many steps, each short
    assert [r[0] for r in log.records()] == [*range(190, 200), 200]


def compressed(batch: StoredBatch, codec: int) -> StoredBatch:
    """``batch`` with its records compressed by ``codec``, as a producer sends them."""
    data = bytearray(batch.data[:BATCH_HEADER_BYTES])
    data += COMPRESS[codec](batch.data[BATCH_HEADER_BYTES:])
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, BATCH_ATTRIBUTES, codec)
    struct.pack_into(">I", data, BATCH_CRC, crc32c(bytes(data[BATCH_ATTRIBUTES:])))
    return StoredBatch(bytes(data), batch.count, batch.max_timestamp, batch.max_timestamp)


@pytest.mark.anyio
async def test_a_step_inflates_about_its_bytes_however_well_the_batches_compress() -> None:
    """Twenty gzip batches of a few hundred bytes, each inflating to 200 kB (a key
    written twice): a step reads 64 kB of the log, so all twenty at once, and inflated
    (mapping) then inflated and compressed again (rewriting) 4 MB in one step before; a
    producer's batches inflating to the request bound made a step of 64 x 16 MB. A step
    now stops once what it inflated reaches its bytes: one such batch a step."""
    log = Log()
    log.cleaner.limits = dataclasses.replace(log.limits, log_cleaner_step_bytes=64 * 1024)
    for i in range(20):
        key = b"k%d" % i
        records: list[tuple[bytes | None, bytes | None]] = [(key, bytes(100_000)), (key, b"v")]
        base = log.partition.leo
        log.core.append({TP: [compressed(keyed_batch(records, base), 1)]})
        log.appended.update({base: records[0], base + 1: records[1]})
    assert log.partition.available_bytes(0, log.partition.leo) < 64 * 1024
    log.now += 1000
    log.append((b"last", b"x"))  # 40: rolls
    steps = log.clean()
    assert steps >= 40  # a step to map each batch and a step to rewrite each
    assert [r[0] for r in log.records()] == [*range(1, 40, 2), 40]


@pytest.mark.anyio
@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
async def test_a_rewritten_batch_keeps_its_codec(codec: int) -> None:
    log = Log()
    records: list[tuple[bytes | None, bytes | None]] = [
        (key, key * 300 + b"%d" % n) for n in range(3) for key in (b"a", b"b")
    ]
    batch = keyed_batch(records, 0)
    data = bytearray(batch.data[:BATCH_HEADER_BYTES])
    data += COMPRESS[codec](batch.data[BATCH_HEADER_BYTES:])
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, BATCH_ATTRIBUTES, codec)
    struct.pack_into(">I", data, BATCH_CRC, crc32c(bytes(data[BATCH_ATTRIBUTES:])))
    log.core.append({TP: [StoredBatch(bytes(data), 6, batch.max_timestamp, batch.max_timestamp)]})
    log.appended.update(enumerate(records))
    log.now += 1000
    log.append((b"z", b"z"))  # 6: rolls
    log.clean()
    assert [r[0] for r in log.records()] == [4, 5, 6]
    rewritten = log.partition.retained()[0].data
    assert rewritten[BATCH_ATTRIBUTES + 1] & 0x07 == codec  # compressed again, alike
    kept = sum(len(r.raw) for r in batch_records(rewritten, 1 << 24))
    assert len(rewritten) - BATCH_HEADER_BYTES < kept
    decoded = DefaultRecordBatch(rewritten)  # a client's reader
    assert decoded.validate_crc()
    assert [(r.offset, r.key, r.value) for r in decoded] == [(4, *records[4]), (5, *records[5])]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.sampled_from([b"a", b"b", b"c", b"d"]), st.booleans()),
            st.tuples(st.just("roll"), st.just(b""), st.just(False)),
            st.tuples(st.just("advance"), st.just(b""), st.just(False)),
            st.tuples(st.just("clean"), st.just(b""), st.just(False)),
        ),
        max_size=60,
    )
)
def test_model_after_every_cleaning_the_log_reads_as_a_dict_of_latest_values(
    ops: list[tuple[str, bytes, bool]],
) -> None:
    asyncio.run(check_the_model(ops))  # the core's purgatories want a running loop


async def check_the_model(ops: list[tuple[str, bytes, bool]]) -> None:
    log = Log(**{"delete.retention.ms": "3000", "min.cleanable.dirty.ratio": "0.0"})
    latest: dict[bytes, bytes] = {}
    for n, (op, key, tombstone) in enumerate(ops):
        if op == "append":
            value = None if tombstone else b"%s%d" % (key, n)
            log.append((key, value))
            if value is None:
                latest.pop(key, None)
            else:
                latest[key] = value
        elif op == "roll":
            log.now += 1000
        elif op == "advance":
            log.now += 2000
        else:
            log.clean()
            records = log.records()
            offsets = [offset for offset, _, _ in records]
            assert offsets == sorted(set(offsets))  # strictly increasing
            for offset, k, v in records:
                assert log.appended[offset] == (k, v)  # unchanged, at its offset
            if log.appended:  # the newest batch stays: a consumer in a gap moves on
                assert log.partition.retained()[-1].end == log.partition.leo
            replayed: dict[bytes, bytes] = {}
            for _, k, v in records:
                assert k is not None
                if v is None:
                    replayed.pop(k, None)
                else:
                    replayed[k] = v
            assert replayed == latest
            cleaned = log.cleaner.checkpoints.get(log.partition, 0)
            keys = [k for offset, k, _ in records if offset < cleaned]
            assert len(keys) == len(set(keys))  # the cleaned section: each key once


TXN_OPS = st.tuples(
    # Repeated to weigh them: records of one key from both sides, ended both ways.
    st.sampled_from(
        [
            *("append", "append", "send t", "send t", "send u"),
            *("commit t", "abort t", "abort t", "commit u", "abort u"),
            *("roll", "advance", "clean", "clean"),
        ]
    ),
    st.sampled_from([b"a", b"b", b"c"]),
    st.sampled_from([False, False, False, True]),  # a tombstone
)
"""(op, key, tombstone): the key and tombstone are read by ``append`` and ``send``."""


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TXN_OPS, max_size=60))
def test_model_with_transactions_read_committed_is_the_committed_latest_values(
    ops: list[tuple[str, bytes, bool]],
) -> None:
    asyncio.run(check_the_transactional_model(ops))


def consume_committed(log: TxnLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a read_committed consumer reads from the log start: the batches below the
    LSO, the aborted transactions' skipped as Kafka's clients skip them (a producer is
    aborted from its transaction's first offset, listed by the broker's aborted index,
    to its abort marker)."""
    lso = log.txns.lso(log.partition)
    listed = sorted(log.txns.aborted_in(TP, log.partition.log_start, lso), key=lambda e: e[1])
    aborted: set[int] = set()
    out = []
    for batch in log.partition.retained():
        base = batch.end - batch.count
        if base >= lso:
            break
        while listed and listed[0][1] < batch.end:
            aborted.add(listed.pop(0)[0])
        data = batch.data
        pid = struct.unpack_from(">q", data, BATCH_PRODUCER_ID)[0]
        if data[BATCH_ATTRIBUTES + 1] & CONTROL:
            if batch_records(data, 1 << 24)[0].key == b"\x00\x00\x00\x00":  # an abort
                aborted.discard(pid)
            continue
        if data[BATCH_ATTRIBUTES + 1] & TRANSACTIONAL and pid in aborted:
            continue
        for record in batch_records(data, 1 << 24):
            offset = base + record.offset_delta
            out.append((offset, *log.appended[offset]))
    return out


async def check_the_transactional_model(ops: list[tuple[str, bytes, bool]]) -> None:
    log = TxnLog(**{"delete.retention.ms": "3000", "min.cleanable.dirty.ratio": "0.0"})
    fate: dict[int, str | None] = {}
    """Each data record's transaction: None (plain), its id while open, then
    "commit" or "abort"."""
    try:
        for n, (op, key, tombstone) in enumerate(ops):
            verb, _, tid = op.partition(" ")
            if verb in ("append", "send"):
                value = None if tombstone else b"%s%d" % (key, n)
                offset = log.partition.leo
                if verb == "append":
                    log.append((key, value))
                else:
                    log.send(tid, (key, value))
                fate[offset] = tid or None
            elif verb in ("commit", "abort"):
                txn = log.txns.transactions.get(tid)
                if txn is None or txn.state.name != "ONGOING":
                    continue
                log.end(tid, commit=verb == "commit")
                for offset, owner in fate.items():
                    if owner == tid:
                        fate[offset] = verb
            elif verb == "roll":
                log.now += 1000
            elif verb == "advance":
                log.now += 2000
            else:
                log.now += 1000  # the idle active segment rolls: more to clean
                log.clean()
                check_transactional_log(log, fate)
    finally:
        log.txns.close()


def check_transactional_log(log: TxnLog, fate: dict[int, str | None]) -> None:
    lso = log.txns.lso(log.partition)
    latest: dict[bytes, bytes] = {}
    for offset in sorted(fate):
        if offset < lso and fate[offset] in (None, "commit"):
            key, value = log.appended[offset]
            assert key is not None
            if value is None:
                latest.pop(key, None)
            else:
                latest[key] = value
    replayed: dict[bytes, bytes] = {}
    for _, key, value in consume_committed(log):
        assert key is not None
        if value is None:
            replayed.pop(key, None)
        else:
            replayed[key] = value
    assert replayed == latest
    records = log.records()
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets))
    for offset, key, value in records:
        assert log.appended[offset] == (key, value)  # unchanged, at its offset
    kept = set(offsets)
    # An open transaction's records are never cleaned.
    assert all(offset in kept for offset, owner in fate.items() if owner in ("t", "u"))
    cleaned = log.cleaner.checkpoints.get(log.partition, 0)
    assert cleaned <= lso
    below = [(o, k) for o, k, _ in records if o < cleaned]
    assert not [o for o, _ in below if fate[o] == "abort"]  # aborted: gone once cleaned
    keys = [k for _, k in below]
    assert len(keys) == len(set(keys))  # the cleaned section: each key once
    # The index lists no abort whose marker is gone.
    markers = set(log.markers())
    assert all(marker in markers for marker, _, _ in log.txns.aborted.get(TP, ()))
    if fate:
        assert log.partition.retained()[-1].end == log.partition.leo


# -- clients --------------------------------------------------------------------------------

WATCHDOG = 20.0

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "delete.retention.ms": "60000",
}


async def compacted_topic(broker: KafkaBroker, **configs: str) -> str:
    """A new one-partition topic, COMPACTED with ``configs`` over it."""
    topic = name("c")
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        settings = {**COMPACTED, **configs}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=settings)])
    finally:
        await admin.close()
    return topic


async def read_all(
    bootstrap: str, topic: str, start: int, end: int, isolation_level: str = "read_uncommitted"
) -> list[tuple[int, Any, Any]]:
    """(offset, key, value) of what aiokafka reads of partition 0 from ``start`` until
    its position reaches ``end``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    read: list[tuple[int, Any, Any]] = []
    try:
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=200)
            read.extend((m.offset, m.key, m.value) for m in batches.get(tp, []))
    finally:
        await consumer.stop()
    return read


@pytest.mark.anyio
async def test_aiokafka_reads_the_compacted_log_and_a_tombstone_goes_after_its_retention() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = await compacted_topic(broker)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        try:
            for version in range(3):
                for key in (b"a", b"b", b"c"):
                    await producer.send_and_wait(topic, b"%s%d" % (key, version), key=key)
            await producer.send_and_wait(topic, None, key=b"c")  # 9: a delete of c
            await producer.send_and_wait(topic, b"d0", key=b"d")  # 10: the newest, kept
        finally:
            await producer.stop()
        assert len(await read_all(broker.bootstrap, topic, 0, 11)) == 11  # nothing closed yet
        started = time.monotonic()
        await broker.advance(61.0)  # the segment is segment.ms old: rolled, cleaned
        assert time.monotonic() - started < 2.0
        compacted = [(6, b"a", b"a2"), (7, b"b", b"b2"), (9, b"c", None), (10, b"d", b"d0")]
        assert await read_all(broker.bootstrap, topic, 0, 11) == compacted
        assert await read_all(broker.bootstrap, topic, 2, 11) == compacted  # in a gap: on
        offsets = broker.offsets(topic)[0]
        assert (offsets.log_start, offsets.high_watermark) == (0, 11)  # offsets unchanged
        await broker.advance(30.0)
        assert (await read_all(broker.bootstrap, topic, 8, 11))[0] == (9, b"c", None)
        await broker.advance(31.0)  # past delete.retention.ms after the first cleaning
        gone = [(6, b"a", b"a2"), (7, b"b", b"b2"), (10, b"d", b"d0")]
        assert await read_all(broker.bootstrap, topic, 0, 11) == gone
        assert await read_all(broker.bootstrap, topic, 8, 11) == gone[2:]  # 8, 9: a gap
        assert broker.offsets(topic)[0].high_watermark == 11


def test_a_record_without_a_key_is_refused_on_a_compacted_topic(thread: BrokerThread) -> None:
    topic = name("c")
    with Wire(thread.bootstrap) as wire:
        create(wire, topic)  # the broker's default policy: compact
        answer = send(wire, topic, [b"no key"])
        assert answer.error_code is ErrorCode.invalid_record
        assert answer.record_errors[0].batch_index == 0
        assert "Compacted topic cannot accept message without key" in answer.error_message
        assert thread.offsets(topic)[0].high_watermark == 0


@pytest.fixture
def thread() -> Iterator[BrokerThread]:
    broker = BrokerThread(log_cleanup_policy="compact")
    with broker:
        yield broker


WEEK = 7 * 24 * 3600.0
"""The default segment.ms, in seconds: an advance past it rolls and cleans."""


def test_confluent_kafka_reads_the_latest_value_per_key(thread: BrokerThread) -> None:
    topic = name("c")
    producer = confluent_kafka.Producer({"bootstrap.servers": thread.bootstrap, "linger.ms": 5})
    for version in range(3):
        for key in (b"a", b"b"):
            producer.produce(topic, key=key, value=b"%s%d" % (key, version))
        producer.flush(10)
    refused: list[Any] = []
    producer.produce(topic, value=b"no key", on_delivery=lambda err, _: refused.append(err))
    producer.flush(10)  # its batch refused whole
    assert refused[0].code() == confluent_kafka.KafkaError.INVALID_RECORD
    producer.produce(topic, key=b"z", value=b"z0")  # 6: the newest
    producer.flush(10)
    thread.advance(WEEK + 1)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": thread.bootstrap, "group.id": name("g"), "enable.auto.commit": False}
    )
    read: list[tuple[int, Any, Any]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WATCHDOG
        while (not read or read[-1][0] < 6) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append((message.offset() or 0, message.key(), message.value()))
    finally:
        consumer.close()
    assert read == [(4, b"a", b"a2"), (5, b"b", b"b2"), (6, b"z", b"z0")]


def test_kafka_python_reads_the_latest_value_per_key_from_a_gap(thread: BrokerThread) -> None:
    topic = name("c")
    producer = kafka.KafkaProducer(bootstrap_servers=thread.bootstrap, linger_ms=0)
    try:
        for version in range(3):
            for key in (b"a", b"b"):
                producer.send(topic, key=key, value=b"%s%d" % (key, version)).get(10)
        producer.send(topic, key=b"z", value=b"z0").get(10)
    finally:
        producer.close()
    thread.advance(WEEK + 1)
    consumer = kafka.KafkaConsumer(bootstrap_servers=thread.bootstrap, enable_auto_commit=False)
    read: list[tuple[int, Any, Any]] = []
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 1)  # in a gap
        deadline = time.monotonic() + WATCHDOG
        while consumer.position(tp) < 7 and time.monotonic() < deadline:
            for messages in consumer.poll(200).values():
                read.extend((m.offset, m.key, m.value) for m in messages)
    finally:
        consumer.close()
    assert read == [(4, b"a", b"a2"), (5, b"b", b"b2"), (6, b"z", b"z0")]


@pytest.mark.anyio
async def test_the_cleaner_runs_on_its_own_tick_without_advance() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker(log_cleaner_backoff_ms=50) as broker:
        topic = await compacted_topic(broker, **{"segment.ms": "1"})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        try:
            for value in (b"a1", b"a2", b"a3"):
                await producer.send_and_wait(topic, value, key=b"a")
            await producer.send_and_wait(topic, b"z", key=b"z")
        finally:
            await producer.stop()
        compacted = [(2, b"a", b"a3"), (3, b"z", b"z")]
        for _ in range(200):
            if await read_all(broker.bootstrap, topic, 0, 4) == compacted:
                break
            await asyncio.sleep(0.05)  # the cleaner's 50 ms tick, in real time
        else:
            pytest.fail("not compacted within 10 s of ticks")


@pytest.mark.anyio
async def test_aborted_records_go_and_committed_ones_stay_read_committed() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker(log_cleanup_policy="compact") as broker:
        topic = name("c")
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        txn = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=name("tx"))
        await plain.start()
        await txn.start()
        try:
            await plain.send_and_wait(topic, b"a1", key=b"a")  # 0
            async with txn.transaction():
                await txn.send_and_wait(topic, b"a2", key=b"a")  # 1, marker 2
            await txn.begin_transaction()
            await txn.send_and_wait(topic, b"a3", key=b"a")  # 3, aborted, marker 4
            await txn.abort_transaction()
            await plain.send_and_wait(topic, b"b1", key=b"b")  # 5
        finally:
            await txn.stop()
            await plain.stop()
        await broker.advance(WEEK + 1)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, isolation_level="read_committed"
        )
        await consumer.start()
        read: list[tuple[int, Any]] = []
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while await consumer.position(tp) < 6:
                batches = await consumer.getmany(tp, timeout_ms=200)
                read.extend((m.offset, m.value) for m in batches.get(tp, []))
        finally:
            await consumer.stop()
        # The committed a2 is the latest committed value of a (it hides a1, as any later
        # record would); the aborted a3 is not read.
        assert [value for _, value in read] == [b"a2", b"b1"]
        # read_uncommitted: the aborted record is gone too, as Kafka's cleaner removes it.
        assert [(o, v) for o, _, v in await read_all(broker.bootstrap, topic, 0, 6)] == [
            (1, b"a2"),
            (5, b"b1"),
        ]


def test_the_broker_default_policy_is_checked_and_described() -> None:
    with pytest.raises(ValueError, match=r"cleanup\.policy"):
        KafkaBroker(log_cleanup_policy="archive")
    broker = KafkaBroker(log_cleanup_policy=" delete , compact ")
    assert broker.cleaner.policy == ("compact", "delete")
    assert broker.cleaner.compacted("any")
    assert broker._broker_configs(0)["log.cleanup.policy"][0] == "compact,delete"


@pytest.mark.anyio
async def test_a_compressed_batch_is_rewritten_readable() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker(log_cleanup_policy="compact") as broker:
        topic = name("c")
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, compression_type="gzip", linger_ms=50
        )
        await producer.start()
        try:
            sent = [
                await producer.send(topic, b"%s%d" % (key, n), key=key)
                for n in range(3)
                for key in (b"a", b"b")
            ]
            await asyncio.gather(*sent)  # one gzip batch of six records, offsets 0-5
            await producer.send_and_wait(topic, b"z", key=b"z")
        finally:
            await producer.stop()
        await broker.advance(WEEK + 1)
        assert await read_all(broker.bootstrap, topic, 0, 7) == [
            (4, b"a", b"a2"),
            (5, b"b", b"b2"),
            (6, b"z", b"z"),
        ]


async def read_committed(bootstrap: str, topic: str, end: int) -> list[tuple[int, Any, Any]]:
    """(offset, key, value) of what a read_committed aiokafka consumer reads of partition
    0 from the start until its position reaches ``end``."""
    return await read_all(bootstrap, topic, 0, end, isolation_level="read_committed")


@pytest.mark.anyio
async def test_aiokafka_committed_values_are_compacted_as_plain_ones() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = await compacted_topic(broker)
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        txn = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=name("tx"))
        await plain.start()
        await txn.start()
        try:
            await plain.send_and_wait(topic, b"a1", key=b"a")  # 0
            async with txn.transaction():
                await txn.send(topic, b"a2", key=b"a")  # 1
                await txn.send_and_wait(topic, b"b1", key=b"b")  # 2, marker 3
            async with txn.transaction():
                await txn.send_and_wait(topic, b"a3", key=b"a")  # 4, marker 5
            await plain.send_and_wait(topic, b"z1", key=b"z")  # 6
        finally:
            await txn.stop()
            await plain.stop()
        await broker.advance(61.0)  # segment.ms: rolled, cleaned
        latest = [(2, b"b", b"b1"), (4, b"a", b"a3"), (6, b"z", b"z1")]
        assert await read_committed(broker.bootstrap, topic, 7) == latest
        assert await read_all(broker.bootstrap, topic, 0, 7) == latest


@pytest.mark.anyio
@pytest.mark.parametrize("commit", [True, False])
async def test_aiokafka_an_open_transaction_is_not_cleaned_nor_hides_a_value(commit: bool) -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = await compacted_topic(broker, **{"segment.ms": "1000"})
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        txn = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=name("tx"))
        await plain.start()
        await txn.start()
        try:
            await plain.send_and_wait(topic, b"a1", key=b"a")  # 0
            await txn.begin_transaction()
            await txn.send_and_wait(topic, b"a2", key=b"a")  # 1: open, the LSO
            await plain.send_and_wait(topic, b"a4", key=b"a")  # 2
            await plain.send_and_wait(topic, b"z1", key=b"z")  # 3
            await broker.advance(2.0)  # rolled; the transaction's 60 s timeout runs on
            assert await read_committed(broker.bootstrap, topic, 1) == [(0, b"a", b"a1")]
            everything = [(0, b"a", b"a1"), (1, b"a", b"a2"), (2, b"a", b"a4"), (3, b"z", b"z1")]
            assert await read_all(broker.bootstrap, topic, 0, 4) == everything
            if commit:
                await txn.commit_transaction()  # 4
            else:
                await txn.abort_transaction()  # 4
            await plain.send_and_wait(topic, b"y1", key=b"y")  # 5
        finally:
            await txn.stop()
            await plain.stop()
        await broker.advance(2.0)
        latest = [(2, b"a", b"a4"), (3, b"z", b"z1"), (5, b"y", b"y1")]
        assert await read_committed(broker.bootstrap, topic, 6) == latest
        assert await read_all(broker.bootstrap, topic, 0, 6) == latest


@pytest.mark.anyio
async def test_markers_go_delete_retention_ms_after_nothing_they_cover_is_left() -> None:
    log = TxnLog(**{"delete.retention.ms": "5000", "min.cleanable.dirty.ratio": "0.01"})
    try:
        log.send("t", (b"a", b"a1"))  # 0
        log.end("t", commit=True)  # 1
        log.send("t", (b"a", b"a2"))  # 2
        log.end("t", commit=False)  # 3
        log.append((b"a", b"a3"))  # 4
        pid = log.txns.transactions["t"].producer_id
        log.now += 1000
        log.append((b"z", b"z1"))  # 5: rolls
        log.clean()
        assert log.records() == [(4, b"a", b"a3"), (5, b"z", b"z1")]
        # Their transactions' batches were there to clean: the markers stay as they are.
        assert log.markers() == [1, 3]
        assert log.txns.aborted[TP] == [(3, pid, 2)]
        log.now += 1000
        log.append((b"y", b"y1"))  # 6: rolls
        log.clean()
        # Nothing left to mark: kept delete.retention.ms more; the abort leaves the index.
        assert log.markers() == [1, 3]
        assert TP not in log.txns.aborted
        assert log.txns.aborted_in(TP, 0, 7) == []
        log.now += 4000
        log.clean()
        assert log.markers() == [1, 3]
        log.now += 1001
        log.clean()  # past the horizon: a pass with nothing dirty drops them
        assert log.markers() == []
        assert log.records() == [(4, b"a", b"a3"), (5, b"z", b"z1"), (6, b"y", b"y1")]
        assert log.partition.leo == 7
    finally:
        log.txns.close()


@pytest.mark.anyio
async def test_aiokafka_reads_across_the_gaps_of_removed_markers() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        configs = {"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01"}
        topic = await compacted_topic(broker, **configs)
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        txn = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=name("tx"))
        await plain.start()
        await txn.start()
        try:
            async with txn.transaction():
                await txn.send_and_wait(topic, b"a1", key=b"a")  # 0, marker 1
            await txn.begin_transaction()
            await txn.send_and_wait(topic, b"a2", key=b"a")  # 2
            await txn.abort_transaction()  # 3
            await plain.send_and_wait(topic, b"a3", key=b"a")  # 4
            await broker.advance(2.0)  # cleaned: the batches go, the markers stay
            await plain.send_and_wait(topic, b"z1", key=b"z")  # 5
        finally:
            await txn.stop()
            await plain.stop()
        tp = TopicPartition(topic, 0)
        partition = broker.core.partitions[tp]

        def markers() -> list[int]:
            return [
                b.end - 1 for b in partition.retained() if b.data[BATCH_ATTRIBUTES + 1] & CONTROL
            ]

        assert markers() == [1, 3]
        await broker.advance(2.0)  # nothing left to mark: their horizon set
        assert markers() == [1, 3]
        assert tp not in broker.transactions.aborted
        await broker.advance(61.0)  # past delete.retention.ms
        assert markers() == []
        latest = [(4, b"a", b"a3"), (5, b"z", b"z1")]
        assert await read_committed(broker.bootstrap, topic, 6) == latest
        assert await read_all(broker.bootstrap, topic, 0, 6) == latest
