"""The Kafka-protocol broker's data path (aiopurgatory.kafka) under hostile
requests: the in-flight byte budget, producer ids and sequences, ListOffsets by
timestamp. Raw frames over loopback (kio-encoded), and the real clients where they
are concerned."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.init_producer_id.v3.request import InitProducerIdRequest as InitProducerIdV3Request
from kio.schema.init_producer_id.v3.response import (
    InitProducerIdResponse as InitProducerIdV3Response,
)
from kio.schema.types import BrokerId, ProducerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i64

from aiopurgatory.kafka.connection import ByteBudget
from aiopurgatory.kafka.log import Partition, TopicPartition

from ..support.kafka_broker import OLD_DEFAULTS, offsets, produced, producer_id
from ..support.kafka_records import plain_batch
from ..support.kafka_wire import (
    Wire,
    batch,
    closed_by_broker,
    create,
    encoded,
    ms,
    produce_request,
    read_frame,
)
from ..support.servers import start_server, stop_server


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    process, address = start_server("-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS)
    yield address
    assert stop_server(process) == 0


def topic() -> str:
    return f"d-{uuid.uuid4().hex[:12]}"


def latest(wire: Wire, name: str) -> int:
    ((error, _, offset),) = offsets(wire, [(name, 0, -1)])
    assert error is ErrorCode.none
    return offset


def send_raw(wire: Wire, request: Any, patch: Any = None) -> None:
    wire.correlation_id += 1
    wire.sock.sendall(encoded(request, wire.correlation_id, client_id="data-test", patch=patch))


def call(wire: Wire, request: Any, response_type: type[Any]) -> Any:
    """:meth:`Wire.call` for any version, flexible ones included (the request and
    response headers are the schemas' own)."""
    send_raw(wire, request)
    wire.sock.settimeout(10)
    frame = read_frame(wire.sock)
    header, at = entity_reader(response_type.__header_schema__)(frame, 0)
    assert header.correlation_id == wire.correlation_id
    return entity_reader(response_type)(frame, at)[0]


# -- item 1: the in-flight byte budget --------------------------------------------------


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_a_cancelled_budget_waiter_raises_cancelled_error_and_gives_nothing_back() -> None:
    budget = ByteBudget(10)
    async with asyncio.timeout(5):
        await budget.acquire(10, None)
        waiter = asyncio.ensure_future(budget.acquire(5, None))
        await settle()
        # Cancelled (a connection closed at shutdown), and the budget freed in the same
        # step: the release finds the waiter cancelled and skips it. The waiter must
        # still raise CancelledError (once ValueError: its entry was gone from the queue).
        waiter.cancel()
        budget.release(10)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.used == 0
        await budget.acquire(10, None)  # the whole budget is there again
        # Cancelled after it was granted: what it was given goes back.
        late = asyncio.ensure_future(budget.acquire(4, None))
        await settle()
        budget.release(10)
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert budget.used == 0


@pytest.mark.anyio
async def test_a_budget_wait_is_bounded_and_those_behind_it_go_on() -> None:
    budget = ByteBudget(10)
    async with asyncio.timeout(5):
        await budget.acquire(8, None)
        # 5 bytes do not fit; 2 would, but wait their turn behind the 5.
        head = asyncio.ensure_future(budget.acquire(5, 0.05))
        await settle()
        behind = asyncio.ensure_future(budget.acquire(2, None))
        await settle()
        assert not behind.done()
        with pytest.raises(TimeoutError):
            await head
        await behind  # served once the head gave up, with no release needed
        assert budget.used == 10


@pytest.mark.anyio
async def test_answers_wait_before_requests_for_the_budget() -> None:
    budget = ByteBudget(10)
    async with asyncio.timeout(5):
        await budget.acquire(10, None)
        request = asyncio.ensure_future(budget.acquire(5, None))
        await settle()
        # An answer finishes admitted work (and frees it), a request admits more.
        assert not budget.try_acquire(1)
        answer = asyncio.ensure_future(budget.acquire(5, None, answer=True))
        await settle()
        budget.release(5)
        await answer
        assert not request.done()
        budget.release(5)
        await request
        assert budget.used == 10


def padded_fetch(name: str, padding: int, max_wait: float) -> fetch.FetchRequest:
    """A valid Fetch of partition 0 of ``name`` (none if ``name`` is empty) made large by
    ``padding`` topics that list no partitions; padded, it asks for more bytes than
    there are (it waits ``max_wait``), else for one."""
    real = fetch.FetchTopic(
        topic=TopicName(name),
        partitions=(
            fetch.FetchPartition(
                partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
            ),
        ),
    )
    pads = tuple(
        fetch.FetchTopic(topic=TopicName(f"p{i:05d}"), partitions=()) for i in range(padding)
    )
    return fetch.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=ms(max_wait),
        min_bytes=i32(1 << 30 if padding else 1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(real, *pads) if name else pads,
        forgotten_topics_data=(),
    )


def test_fetches_filling_the_budget_are_answered_and_new_connections_served() -> None:
    """Four fetches whose frames fill the in-flight budget exactly (a 16 MiB fetch
    each against 64 MiB, scaled down): once their wait ends, each answer is paid for by
    its own request's bytes; none waits for more, so all are answered, and a connection
    queued behind them for budget is served next."""
    name = topic()
    frame = encoded(padded_fetch(name, 5000, max_wait=1.0), 1)
    size = len(frame) - 4  # what the broker reserves: the frame after its size
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        *OLD_DEFAULTS,
        "--max-request-bytes",
        str(size),
        "--max-inflight-bytes",
        str(4 * size),
    )
    wires: list[Wire] = []
    try:
        setup = Wire(address)
        wires.append(setup)
        create(setup, name)
        assert produced(setup, produce_request([(name, [(0, stamped(EPOCH_MS))])])) == [
            (ErrorCode.none, 0)
        ]
        fetchers = [Wire(address) for _ in range(4)]
        wires += fetchers
        for wire in fetchers:
            wire.correlation_id = 1
            wire.sock.sendall(frame)
        time.sleep(0.2)  # their frames are in (an order only: the test holds either way)
        late = Wire(address)
        wires.append(late)
        late.send(ApiVersionsRequest())  # waits for budget behind the four
        started = time.monotonic()
        for wire in fetchers:
            wire.sock.settimeout(5)
            response = wire.receive(FetchResponse)
            (part,) = response.responses[0].partitions
            assert part.error_code is ErrorCode.none
            assert part.records  # the record produced, after max_wait
        late.sock.settimeout(5)
        assert late.receive(ApiVersionsResponse).error_code is ErrorCode.none
        assert time.monotonic() - started < 4.0
    finally:
        for wire in wires:
            wire.sock.close()
        assert stop_server(process) == 0


def test_an_answer_beyond_its_request_waits_holding_nothing_and_not_for_long() -> None:
    """A small fetch whose answer does not fit gives back its request's bytes and waits,
    at most --budget-wait-seconds (then its connection is closed); when room comes in
    time (the connection holding the budget finishes), it is answered."""
    name = topic()
    holder = encoded(padded_fetch("", 5000, max_wait=0.0), 1)
    small = encoded(padded_fetch(name, 0, max_wait=1.0), 1)
    limit = len(holder) - 4 + len(small) - 4  # the holder and one small frame: full
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        *OLD_DEFAULTS,
        "--max-request-bytes",
        str(limit),
        "--max-inflight-bytes",
        str(limit),
        "--budget-wait-seconds",
        "1.5",
    )
    wires: list[Wire] = []

    def small_fetch() -> Wire:
        wire = Wire(address)
        wires.append(wire)
        wire.correlation_id = 1
        wire.sock.sendall(small)
        return wire

    try:
        setup = Wire(address)
        wires.append(setup)
        create(setup, name)
        big = produce_request([(name, [(0, batch(-1, -1, [bytes(2000)]))])])
        assert produced(setup, big) == [(ErrorCode.none, 0)]
        # The holder's frame is sent but for its last byte: the bytes sent are charged
        # while the broker waits for the rest.
        held = Wire(address)
        wires.append(held)
        held.correlation_id = 1
        half = len(holder) - 1
        held.sock.sendall(holder[:half])
        time.sleep(0.2)
        # The record (2 kB) is readable at once, its answer does not fit: bounded wait.
        started = time.monotonic()
        first = small_fetch()
        first.sock.settimeout(5)
        assert closed_by_broker(first.sock)
        assert 1.0 <= time.monotonic() - started < 4.0
        # Again, and this time the holder finishes: the answer gets its room.
        second = small_fetch()
        time.sleep(0.3)
        held.sock.sendall(holder[half:])
        held.sock.settimeout(5)
        assert held.receive(FetchResponse).responses == ()
        second.sock.settimeout(5)
        (part,) = second.receive(FetchResponse).responses[0].partitions
        assert part.error_code is ErrorCode.none
        assert len(part.records) > 2000
    finally:
        for wire in wires:
            wire.sock.close()
        assert stop_server(process) == 0


# -- item 5: producer ids the broker never handed out ------------------------------------


def test_a_producer_id_never_handed_out_is_refused(broker: str) -> None:
    name = topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        # Below the first id handed out, and far above the last: no state is made for
        # them (240,000 forged ids once took 250 MB), nothing is appended.
        for forged in (0, 999, 10**12):
            answer = produced(wire, produce_request([(name, [(0, batch(forged, 0, [b"x"]))])]))
            assert answer == [(ErrorCode.unknown_producer_id, -1)]
        assert latest(wire, name) == 0
        # An id handed out is served; one a step beyond it is not.
        pid = producer_id(wire)
        assert produced(wire, produce_request([(name, [(0, batch(pid, 0, [b"a"]))])])) == [
            (ErrorCode.none, 0)
        ]
        beyond = produce_request([(name, [(0, batch(pid + 1000, 0, [b"b"]))])])
        assert produced(wire, beyond) == [(ErrorCode.unknown_producer_id, -1)]
        assert latest(wire, name) == 1
    finally:
        wire.sock.close()


def test_init_producer_id_bumps_only_an_id_it_handed_out(broker: str) -> None:
    wire = Wire(broker)
    try:
        pid = producer_id(wire)
        # KIP-360: a producer bumping its epoch keeps its id...
        bumped = call(
            wire,
            InitProducerIdV3Request(
                transactional_id=None,
                transaction_timeout=ms(60),
                producer_id=ProducerId(pid),
                producer_epoch=i16(0),
            ),
            InitProducerIdV3Response,
        )
        assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (
            ErrorCode.none,
            pid,
            1,
        )
        # ...but naming an id never handed out gets a new one, not that id.
        forged = call(
            wire,
            InitProducerIdV3Request(
                transactional_id=None,
                transaction_timeout=ms(60),
                producer_id=ProducerId(7),
                producer_epoch=i16(3),
            ),
            InitProducerIdV3Response,
        )
        assert forged.error_code is ErrorCode.none
        assert forged.producer_id > pid
        assert forged.producer_epoch == 0
    finally:
        wire.sock.close()


def test_producer_states_are_bounded_and_a_forgotten_one_is_told_so() -> None:
    process, address = start_server(
        "-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS, "--max-producer-states", "2"
    )
    try:
        name = topic()
        wire = Wire(address)
        try:
            create(wire, name)
            pids = [producer_id(wire) for _ in range(3)]
            for pid in pids:  # the third state pushes the first (least recent) out
                assert (
                    produced(wire, produce_request([(name, [(0, batch(pid, 0, [b"v"]))])]))[0][0]
                    is ErrorCode.none
                )
            first, _, third = pids
            answer = produced(wire, produce_request([(name, [(0, batch(first, 1, [b"w"]))])]))
            assert answer == [(ErrorCode.unknown_producer_id, -1)]
            answer = produced(wire, produce_request([(name, [(0, batch(third, 1, [b"w"]))])]))
            assert answer == [(ErrorCode.none, 3)]
            # The forgotten producer starts over at sequence 0 (what a client does once
            # it has bumped its epoch).
            answer = produced(wire, produce_request([(name, [(0, batch(first, 0, [b"w"]))])]))
            assert answer == [(ErrorCode.none, 4)]
        finally:
            wire.sock.close()
    finally:
        assert stop_server(process) == 0


@pytest.mark.anyio
async def test_aiokafka_idempotent_producer_is_served(broker: str) -> None:
    name = topic()
    async with asyncio.timeout(30):
        producer = AIOKafkaProducer(bootstrap_servers=broker, enable_idempotence=True)
        await producer.start()
        try:
            sends = [await producer.send(name, str(i).encode(), partition=0) for i in range(200)]
            offsets = [(await send).offset for send in sends]
        finally:
            await producer.stop()
    assert offsets == list(range(200))


# -- item 6: a refused produce keeps no sequence -----------------------------------------


def test_a_partition_listed_twice_keeps_no_sequence_and_the_retry_is_stored(broker: str) -> None:
    name = topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        pid = producer_id(wire)
        first = batch(pid, 0, [b"a"])
        # The same partition twice in one request: refused (INVALID_REQUEST), nothing
        # appended, and the producer's sequence 0 not taken either.
        twice = produce_request([(name, [(0, first), (0, first)])])
        assert produced(wire, twice) == [(ErrorCode.invalid_request, -1)]
        assert latest(wire, name) == 0
        # The producer retries its batch alone: stored now, not taken for a duplicate.
        assert produced(wire, produce_request([(name, [(0, first)])])) == [(ErrorCode.none, 0)]
        assert latest(wire, name) == 1
        second = produce_request([(name, [(0, batch(pid, 1, [b"b"]))])])
        assert produced(wire, second) == [(ErrorCode.none, 1)]
    finally:
        wire.sock.close()


def test_a_request_refused_on_a_later_topic_keeps_no_sequence(broker: str) -> None:
    name, other = topic(), topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        pid = producer_id(wire)
        first = batch(pid, 0, [b"a"])
        # A first topic with a valid batch, then one whose partitions array is null
        # (kio will not write that: the empty array's count, the frame's last 4 bytes,
        # becomes -1). Malformed: the connection is closed, nothing was taken.
        request = produce_request([(name, [(0, first)]), (other, [])])

        def null_partitions(payload: bytearray) -> None:
            assert payload[-4:] == b"\0\0\0\0"
            payload[-4:] = struct.pack(">i", -1)

        send_raw(wire, request, null_partitions)
        assert closed_by_broker(wire.sock)
    finally:
        wire.sock.close()
    wire = Wire(broker)
    try:
        assert latest(wire, name) == 0
        assert produced(wire, produce_request([(name, [(0, first)])])) == [(ErrorCode.none, 0)]
        assert latest(wire, name) == 1
    finally:
        wire.sock.close()


# -- item 7: ListOffsets ------------------------------------------------------------------

EPOCH_MS = 1_700_000_000_000


def stamped(ms_since_epoch: int) -> bytes:
    """A one-record batch (no producer id) whose record, and so the batch, has this
    timestamp."""
    at = datetime.datetime.fromtimestamp(ms_since_epoch / 1000, datetime.UTC)
    return plain_batch([(None, b"v")], at)


def test_list_offsets_refuses_a_partition_named_twice(broker: str) -> None:
    name = topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        # A log of 50,000 batches (one produce: the same batch again and again, the
        # broker assigns the offsets), then 1,000 lookups of it by timestamp in one
        # 12 kB request: once a scan each, now refused and answered once (Kafka's
        # INVALID_REQUEST, one row per partition).
        records = stamped(EPOCH_MS) * 50_000
        assert produced(wire, produce_request([(name, [(0, records)])])) == [(ErrorCode.none, 0)]
        assert latest(wire, name) == 50_000
        started = time.monotonic()
        answers = offsets(wire, [(name, 0, EPOCH_MS + 1)] * 1000 + [(name, 1, -1)])
        elapsed = time.monotonic() - started
        assert answers == [
            (ErrorCode.invalid_request, -1, -1),
            (ErrorCode.none, -1, 0),  # named once: answered
        ]
        assert elapsed < 1.0, f"{elapsed:.2f} s"
        # Named once, the same lookup is answered (none of the batches reaches it).
        assert offsets(wire, [(name, 0, EPOCH_MS + 1)]) == [(ErrorCode.none, -1, -1)]
        assert offsets(wire, [(name, 0, EPOCH_MS)]) == [(ErrorCode.none, EPOCH_MS, 0)]
    finally:
        wire.sock.close()


def test_list_offsets_by_timestamp_finds_the_first_batch_stamped_at_or_after_it(
    broker: str,
) -> None:
    name = topic()
    wire = Wire(broker)
    try:
        create(wire, name)
        # Producers stamp their records: the batches' timestamps need not increase.
        stamps = [1000, 3000, 2000, 4000, 4000, 3500]
        for stamp in stamps:
            produced(wire, produce_request([(name, [(0, stamped(EPOCH_MS + stamp))])]))
        for target, expected in [
            (0, (1000, 0)),
            (1000, (1000, 0)),
            (1001, (3000, 1)),
            (2500, (3000, 1)),  # the first at or after it, not the closest (2000)
            (3000, (3000, 1)),
            (3001, (4000, 3)),
            (4000, (4000, 3)),
        ]:
            answer = offsets(wire, [(name, 0, EPOCH_MS + target)])
            assert answer == [(ErrorCode.none, EPOCH_MS + expected[0], expected[1])], target
        assert offsets(wire, [(name, 0, EPOCH_MS + 4001)]) == [(ErrorCode.none, -1, -1)]
    finally:
        wire.sock.close()


@dataclasses.dataclass(frozen=True, slots=True)
class Stamped:
    size: int
    count: int
    so_far: int


def test_a_partition_finds_the_first_entry_reaching_a_value_by_bisection() -> None:
    partition: Partition[Stamped] = Partition(TopicPartition("t", 0), followers=0, retain_bytes=500)
    partition.append([Stamped(1, 2, stamp) for stamp in range(0, 100_000, 2)])
    assert partition.log_start > 0  # retention dropped the oldest: the search skips them
    calls = 0

    def key(entry: Stamped) -> int:
        nonlocal calls
        calls += 1
        return entry.so_far

    assert partition.first_at_least(0, key) == (partition.log_start, partition.entries[-500])
    found = partition.first_at_least(99_997, key)
    assert found is not None
    assert found[0] == 99_998  # the entry holding 99_998 has offset 2 * 49_999
    assert found[1].so_far == 99_998
    assert partition.first_at_least(99_999, key) is None
    assert calls <= 3 * 17  # log2(50,000) < 16 per search: nothing scanned, nothing copied
