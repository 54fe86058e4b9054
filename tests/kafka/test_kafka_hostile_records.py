"""Hostile record batches (issue 44): a batch's header is not trusted. A batch whose
last offset delta, record count or records' own offset deltas disagree is refused
INVALID_RECORD with Kafka's message, and leaves nothing (no offsets, no sequence);
offsets in a partition stay unique and increasing whatever a producer sends. Raw
frames (batches written here byte by byte, CRC-32C correct) and a real client
(aiokafka) reading after a hostile batch and an honest producer; a property test
(hypothesis, stateful, derandomized) over random honest and hostile batches from
random producers. And an acks=all produce whose ISR shrank below
``min.insync.replicas`` while it waited: NOT_ENOUGH_REPLICAS_AFTER_APPEND."""

from __future__ import annotations

import asyncio
import gzip
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from crc32c import crc32c
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
)
from kio.schema.errors import ErrorCode

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.configs import check_topic_configs

from ..support.helpers import run_derandomized, watchdog
from ..support.kafka_broker import producer_id
from ..support.kafka_records import (
    FOUR,
    NOW_MS,
    log_of,
    produce_raw,
    raw_batch,
    read_records,
    record,
    topic,
    varint,
)
from ..support.kafka_wire import (
    Wire,
    address,
    aiokafka_read,
    cluster_thread,
    create,
    fetch_from,
    high_watermarks,
    running,
    send,
)

# -- batches written byte by byte (so that their headers may lie) ------------------------

"""Base offset, length, partition leader epoch, magic, CRC."""
"""Attributes, last offset delta, first and max timestamps, producer id and epoch,
base sequence, record count: what the CRC covers, before the records."""


"""A batch's records compressed by each codec (aiokafka's codecs, on cramjam)."""


# -- the broker and its callers ------------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with BrokerThread() as address:
        yield address


def _control() -> bytes:
    """A commit marker as a client might send it: attributes control | transactional."""
    data = bytearray(raw_batch([b"m"], pid=1000, sequence=0, epoch=0))
    struct.pack_into(">h", data, 21, 0x30)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


# (batch, the start of Kafka's message): each refused INVALID_RECORD.
HOSTILE: dict[str, tuple[bytes, str]] = {
    "last delta 0 for 4 records": (
        raw_batch(FOUR, last_offset_delta=0),
        "Inconsistent batch offset range [0, 0] and count of records 4",
    ),
    "last delta 0 and count 1 for 4 records": (
        raw_batch(FOUR, last_offset_delta=0, count=1),
        "Incorrect declared batch size, records still remaining",
    ),
    "last delta 5 for 4 records": (
        raw_batch(FOUR, last_offset_delta=5),
        "Inconsistent batch offset range [0, 5] and count of records 4",
    ),
    "count 6 for 4 records": (
        raw_batch(FOUR, last_offset_delta=5, count=6),
        "Incorrect declared batch size, premature EOF reached",
    ),
    "count 0": (raw_batch(FOUR, count=0), "Invalid reported count for record batch: 0"),
    "negative last delta": (
        raw_batch(FOUR, last_offset_delta=-1, count=0),
        "Batch has an invalid offset range: [0, -1]",
    ),
    "every record at delta 0": (
        raw_batch(FOUR, offset_deltas=[0, 0, 0, 0]),
        "Record 1's offset delta (0) is not continuous",
    ),
    "deltas out of order": (
        raw_batch(FOUR, offset_deltas=[0, 2, 1, 3]),
        "Record 1's offset delta (2) is not continuous",
    ),
    "deltas from 1": (
        raw_batch(FOUR, offset_deltas=[1, 2, 3, 4]),
        "Record 0's offset delta (1) is not continuous",
    ),
    "a producer id without a sequence": (
        raw_batch(FOUR, pid=1000, sequence=-1, epoch=0),
        "Invalid sequence number -1 in record batch with producerId 1000",
    ),
    "a control batch": (
        _control(),
        "Clients are not allowed to write control records",
    ),
    "a base offset": (
        raw_batch(FOUR, base_offset=7),
        "The baseOffset of the record batch in the append should be 0, but it is 7",
    ),
    "a record longer than its batch": (
        raw_batch([b"x"], records=varint(40) + b"\x00" * 8),
        "Invalid record size: expected 40 bytes",
    ),
    "a record shorter than its length": (
        raw_batch([b"x"], records=varint(9) + record(0, b"x")[1:] + b"\x00" * 2),
        "Invalid record size: expected to read 9 bytes",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_batch_whose_header_or_records_lie_is_refused_invalid_record(
    broker: str, case: str
) -> None:
    hostile, message = HOSTILE[case]
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        answer = produce_raw(wire, name, hostile)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.invalid_record, -1)
        assert answer.error_message is not None
        assert answer.error_message.startswith(message), answer.error_message
        assert answer.error_message.endswith(f"in topic partition {name}-0")
        # Nothing was kept: the next producer's records start at 0, each at its own offset.
        honest = produce_raw(wire, name, raw_batch([b"b1", b"b2", b"b3"]))
        assert (honest.error_code, honest.base_offset) == (ErrorCode.none, 0)
        assert log_of(wire, name) == (3, [(0, b"b1"), (1, b"b2"), (2, b"b3")])


def test_the_issue_s_batch_no_longer_gives_the_next_producer_s_offsets_twice(broker: str) -> None:
    """The issue's case: 4 records claiming one offset, then an honest producer's 3,
    read back [0, 1, 2, 3, 1, 2, 3] before; now the lie is refused and the log reads
    the honest records once each, at 0..2, and what follows at 3.."""
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        first = produce_raw(wire, name, raw_batch(FOUR, last_offset_delta=0))
        assert first.error_code is ErrorCode.invalid_record
        assert produce_raw(wire, name, raw_batch([b"b1", b"b2", b"b3"])).base_offset == 0
        assert produce_raw(wire, name, raw_batch([b"c1"])).base_offset == 3
        hw, records = log_of(wire, name)
        assert hw == 4
        assert records == [(0, b"b1"), (1, b"b2"), (2, b"b3"), (3, b"c1")]


def test_a_refused_batch_keeps_no_sequence_and_refuses_its_whole_partition(broker: str) -> None:
    """An idempotent producer's lying batch takes no sequence (its honest sequence 0
    is stored next); an honest batch before a lying one in the same partition's
    records is refused with it (a partition's append is validated whole, as Kafka's)."""
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        pid = producer_id(wire)
        lying = raw_batch(FOUR, last_offset_delta=0, pid=pid, sequence=0, epoch=0)
        assert produce_raw(wire, name, lying).error_code is ErrorCode.invalid_record
        honest = raw_batch([b"s0", b"s1"], pid=pid, sequence=0, epoch=0)
        assert (produce_raw(wire, name, honest).error_code, log_of(wire, name)[0]) == (
            ErrorCode.none,
            2,
        )
        both = raw_batch([b"s2"], pid=pid, sequence=2, epoch=0) + raw_batch(
            FOUR, offset_deltas=[0, 0, 1, 1]
        )
        assert produce_raw(wire, name, both).error_code is ErrorCode.invalid_record
        # The honest half was not stored, and its sequence is still free.
        again = produce_raw(wire, name, raw_batch([b"s2"], pid=pid, sequence=2, epoch=0))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, 2)
        assert log_of(wire, name)[1] == [(0, b"s0"), (1, b"s1"), (2, b"s2")]


def test_a_batch_s_max_timestamp_is_its_records(broker: str) -> None:
    """The header's max timestamp is not trusted either: the batch is stored stamped
    with its records' largest, CRC rewritten, as Kafka's validator stamps it."""
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        lying = raw_batch([b"t0", b"t1", b"t2"], max_timestamp=NOW_MS + 10**9)
        assert produce_raw(wire, name, lying).error_code is ErrorCode.none
        data = bytes(fetch_from(wire, name, 0).records)
        assert struct.unpack_from(">q", data, 35)[0] == NOW_MS + 2
        assert struct.unpack_from(">I", data, 17)[0] == crc32c(data[21:])


def test_a_bad_crc_is_still_corrupt_message(broker: str) -> None:
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        answer = produce_raw(wire, name, raw_batch(FOUR, bad_crc=True))
        assert answer.error_code is ErrorCode.corrupt_message
        assert log_of(wire, name) == (0, [])


@pytest.mark.anyio
async def test_aiokafka_reads_unique_offsets_after_a_hostile_batch_and_an_honest_producer(
    broker: str, anyio_backend: Any
) -> None:
    """A hostile batch (4 records claiming one offset), then an honest aiokafka
    producer: an aiokafka consumer reads unique increasing offsets and every
    acknowledged record exactly once (it read [0, 1, 2, 3, 1, 2, 3, 4, 5] before)."""
    if anyio_backend[0] != "asyncio":
        pytest.skip("aiokafka runs on asyncio")
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        assert (
            produce_raw(wire, name, raw_batch(FOUR, last_offset_delta=0)).error_code
            is ErrorCode.invalid_record
        )
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", enable_idempotence=True)
    await asyncio.wait_for(producer.start(), 10)
    acknowledged = []
    try:
        for i in range(6):
            meta = await asyncio.wait_for(producer.send_and_wait(name, f"b{i}".encode()), 10)
            acknowledged.append((meta.offset, f"b{i}".encode()))
    finally:
        await producer.stop()
    read = await aiokafka_read(broker, name, len(acknowledged))
    offsets = [offset for offset, _ in read]
    assert offsets == sorted(set(offsets)) == list(range(6))
    assert read == acknowledged


# -- item 12: acks=all while the ISR shrinks below min.insync.replicas ------------------------


@pytest.mark.parametrize(
    ("min_insync", "isolated", "expected"),
    [
        (3, 1, ErrorCode.not_enough_replicas_after_append),
        (2, 2, ErrorCode.not_enough_replicas_after_append),  # the leader alone is the ISR
        (2, 1, ErrorCode.none),  # two in sync: enough
    ],
)
def test_acks_all_answers_not_enough_replicas_after_append_when_the_isr_shrank_while_it_waited(
    min_insync: int, isolated: int, expected: ErrorCode
) -> None:
    """A produce appended while the ISR was full waits for isolated followers; the ISR
    then shrinks (after the lag bound), the HW moves to what the remaining ISR holds,
    and the produce is answered, as Kafka's DelayedProduce answers it: 20 when the ISR
    is now below the topic's min.insync.replicas (it was 0 before). The records stay in
    the log, at the offset answered; the next acks=all is refused up front (19)."""
    name = topic()
    with running(cluster_thread()) as cluster:

        async def create_topic(broker: KafkaBroker) -> None:
            broker.create_topic(name, 1)
            broker.admin_api.apply(
                name, check_topic_configs({"min.insync.replicas": str(min_insync)}, broker.limits)
            )

        cluster.call(create_topic)
        leader = cluster.leader(name)
        followers = [n for n in cluster.replicas_of(name) if n != leader]
        for node in followers[:isolated]:
            cluster.isolate(node)
        assert len(cluster.isr(name)) == 3  # not out of sync yet: the produce is taken
        with Wire(address(cluster, leader)) as wire:
            started = time.monotonic()
            answer = send(wire, name, [b"x"], timeout=10.0)
            waited = time.monotonic() - started
            assert (answer.error_code, answer.base_offset) == (expected, 0)
            assert 0.3 < waited < 5.0  # answered when the ISR shrank, not at the timeout
            assert len(cluster.isr(name)) == 3 - isolated
            assert high_watermarks(cluster, name) == {0: 1}  # the record stays
            later = send(wire, name, [b"y"], timeout=10.0)
            if expected is ErrorCode.none:
                assert (later.error_code, later.base_offset) == (ErrorCode.none, 1)
            else:
                assert later.error_code is ErrorCode.not_enough_replicas


# -- item 3: a property test over the record path ---------------------------------------------

KINDS = (
    "honest",
    "last_delta",
    "count",
    "offset_deltas",
    "bad_crc",
    "mixed",
    "sequence_gap",
    "retry",
)
"""What a step's producer sends (its records uncompressed or by any codec): an honest
batch, a header or records that lie, a bad CRC, an honest batch followed by a lying one
in the same records, an idempotent producer's sequence gap, or its last acknowledged
batch again."""


class RecordPathMachine(RuleBasedStateMachine):
    """Producers (two idempotent, one not) send random batches, honest and hostile, to
    one partition; the model is the log every acknowledged record makes. After every
    step the partition reads back as the model (offsets unique and increasing, each
    acknowledged record once, nothing of a refused batch); at the end, from every
    consumer position."""

    address = ""

    def __init__(self) -> None:
        super().__init__()
        self.wire = Wire(self.address)
        self.topic = topic()
        create(self.wire, self.topic)
        self.pids = [producer_id(self.wire) for _ in range(2)]
        self.log: list[bytes] = []
        """Offset -> value of every record acknowledged."""
        self.sequences: dict[int, int] = dict.fromkeys(self.pids, 0)
        self.last: dict[int, tuple[bytes, int]] = {}
        """An idempotent producer's last batch stored: its bytes, its base offset."""
        self.made = 0

    def values(self, count: int) -> list[bytes]:
        self.made += count
        return [f"v{i}".encode() for i in range(self.made - count, self.made)]

    @rule(
        producer=st.sampled_from([-1, 0, 1]),
        count=st.integers(1, 4),
        kind=st.sampled_from(KINDS),
        acks=st.sampled_from([1, -1]),
        codec=st.sampled_from([0, 1, 2, 3, 4]),
        data=st.data(),
    )
    def send(
        self,
        producer: int,
        count: int,
        kind: str,
        acks: int,
        codec: int,
        data: st.DataObject,
    ) -> None:
        pid = -1 if producer < 0 else self.pids[producer]
        sequence = self.sequences[pid] if pid >= 0 else -1
        epoch = 0 if pid >= 0 else -1
        values = self.values(count)
        options: dict[str, Any] = {"codec": codec}
        expected = ErrorCode.invalid_record
        appended = values
        records: bytes | None = None
        if kind == "last_delta":
            options["last_offset_delta"] = data.draw(
                st.integers(-1, 6).filter(lambda d: d != count - 1), "last delta"
            )
        elif kind == "count":
            wrong = data.draw(st.integers(0, 6).filter(lambda c: c != count), "count")
            options.update(count=wrong, last_offset_delta=wrong - 1)
        elif kind == "offset_deltas":
            options["offset_deltas"] = data.draw(
                st.lists(st.integers(0, 5), min_size=count, max_size=count).filter(
                    lambda d: d != list(range(count))
                ),
                "offset deltas",
            )
        elif kind == "bad_crc":
            options["bad_crc"] = True
            expected = ErrorCode.corrupt_message
        elif kind == "mixed":
            records = raw_batch(
                values, pid=pid, sequence=sequence, epoch=epoch, codec=codec
            ) + raw_batch([b"lie"] * 2, last_offset_delta=0, codec=codec)
        elif kind == "sequence_gap" and pid >= 0:
            sequence += data.draw(st.integers(1, 3), "gap")
            expected = (
                ErrorCode.out_of_order_sequence_number
                if pid in self.last
                else ErrorCode.unknown_producer_id
            )
        elif kind == "retry" and pid in self.last:
            records, base = self.last[pid]
            answer = produce_raw(self.wire, self.topic, records, acks=acks)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, base)
            return
        else:
            expected = ErrorCode.none
        if records is None:
            records = raw_batch(values, pid=pid, sequence=sequence, epoch=epoch, **options)
        answer = produce_raw(self.wire, self.topic, records, acks=acks)
        if expected is not ErrorCode.none:
            assert (answer.error_code, answer.base_offset) == (expected, -1), kind
            return
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, len(self.log))
        if pid >= 0:
            self.sequences[pid] += count
            self.last[pid] = (records, len(self.log))
        self.log.extend(appended)

    @invariant()
    def the_log_is_what_was_acknowledged(self) -> None:
        assert log_of(self.wire, self.topic) == (len(self.log), list(enumerate(self.log)))

    def teardown(self) -> None:
        try:
            # Every consumer position reads the rest of the log, in order, once.
            for position in range(len(self.log) + 1):
                answer = fetch_from(self.wire, self.topic, position)
                assert answer.error_code is ErrorCode.none
                read = read_records(bytes(answer.records or b""))
                offsets = [offset for offset, _ in read]
                assert offsets == sorted(set(offsets))
                rest = [(o, v) for o, v in read if o >= position]
                assert rest == list(enumerate(self.log))[position:]
        finally:
            self.wire.sock.close()


def test_the_record_path_keeps_offsets_unique_and_every_acknowledged_record_once() -> None:
    with BrokerThread() as address, watchdog(60.0):
        RecordPathMachine.address = address
        run_derandomized(RecordPathMachine, max_examples=30, steps=20)


# -- gzip batches: their records are read once inflated ----------------------------------------


def gzip_attributes(batch: bytes) -> bytes:
    """``batch`` marked gzip (its records as they are), its CRC made right again."""
    fixed = bytearray(batch)
    struct.pack_into(">h", fixed, 21, 1)
    struct.pack_into(">I", fixed, 17, crc32c(bytes(fixed[21:])))
    return bytes(fixed)


def test_a_gzip_batch_s_records_are_checked_once_inflated(broker: str) -> None:
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        lying = produce_raw(wire, name, raw_batch(FOUR, offset_deltas=[0, 0, 0, 0], gzipped=True))
        assert lying.error_code is ErrorCode.invalid_record
        assert lying.error_message.startswith("Record 1's offset delta (0) is not continuous")
        short = produce_raw(wire, name, raw_batch(FOUR, last_offset_delta=4, count=5, gzipped=True))
        assert short.error_code is ErrorCode.invalid_record
        garbage = gzip_attributes(raw_batch([b"x"], records=b"not gzip"))
        assert produce_raw(wire, name, garbage).error_code is ErrorCode.corrupt_message
        honest = produce_raw(wire, name, raw_batch(FOUR, gzipped=True))
        assert (honest.error_code, honest.base_offset) == (ErrorCode.none, 0)
        assert produce_raw(wire, name, raw_batch([b"b"])).base_offset == 4


def test_a_gzip_batch_inflating_beyond_the_request_bound_is_refused() -> None:
    """A small batch that inflates to more than max_request_bytes is refused before
    the broker holds it all."""
    with BrokerThread(max_request_bytes=1 << 20) as address, Wire(address) as wire:
        name = topic()
        create(wire, name)
        bomb = gzip_attributes(raw_batch([b"x"], records=gzip.compress(b"\x00" * (4 << 20))))
        assert len(bomb) < 64 << 10
        assert produce_raw(wire, name, bomb).error_code is ErrorCode.corrupt_message
        assert log_of(wire, name) == (0, [])


@pytest.mark.anyio
async def test_aiokafka_gzip_batches_are_stored_and_read(broker: str, anyio_backend: Any) -> None:
    if anyio_backend[0] != "asyncio":
        pytest.skip("aiokafka runs on asyncio")
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
    producer = AIOKafkaProducer(bootstrap_servers=broker, compression_type="gzip", linger_ms=50)
    await asyncio.wait_for(producer.start(), 10)
    try:
        sent = [await producer.send(name, f"g{i}".encode()) for i in range(5)]
        offsets = [(await asyncio.wait_for(future, 10)).offset for future in sent]
    finally:
        await producer.stop()
    assert offsets == list(range(5))
    read = await aiokafka_read(broker, name, 5)
    assert read == [(i, f"g{i}".encode()) for i in range(5)]
