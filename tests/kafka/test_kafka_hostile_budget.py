"""Issue 44, round four: the in-flight byte budget against hostile peers.

Each test shows what a peer could hold of the budget (and so keep every other client
waiting) before the fix: an announced frame size charged before its body arrives, a
parked request keeping its frame, answers bigger than their requests, and TLS
handshakes not counted against max_connections; then what a hostile review of those
fixes found around them (small frames announced and not sent, parked fetches padded
with one partition named thousands of times), and TLS peers that reset before their
handshake starts, leaving no connection behind. Raw frames over loopback sockets, on a
broker thread of the test's own; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import logging
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.describe_groups.v1.request import DescribeGroupsRequest
from kio.schema.describe_groups.v1.response import DescribeGroupsResponse
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.join_group.v5 import request as join_v5
from kio.schema.join_group.v5.response import JoinGroupResponse
from kio.schema.types import GroupId
from kio.static.primitive import i32Timedelta

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.connection import FRAME_CHUNK
from aiopurgatory.kafka.tls import TlsFiles

from ..support.kafka_wire import (
    PROMPT,
    Wire,
    answered_promptly,
    batch,
    closed_by_broker,
    create,
    encoded,
    fetch_request,
    name,
    produce_request,
    served_over_tls,
    sockets,
    wait_for,
)

Factory = Callable[..., BrokerThread]


# -- item 2: announced, not sent -----------------------------------------------------------


def test_announced_frames_not_sent_hold_no_budget(kafka_broker_factory: Factory) -> None:
    """Four peers announce 16 MiB frames (the whole 64 MiB budget) and send nothing:
    bytes a peer has not sent hold nothing, so another client is answered at once."""
    broker = kafka_broker_factory()
    with sockets(broker.bootstrap, 4) as stalled:
        for sock in stalled:
            sock.sendall(struct.pack(">i", 16 * 1024 * 1024))
        time.sleep(0.3)  # their prefixes are read
        assert answered_promptly(broker.bootstrap) < PROMPT
        # What they do send is charged as it arrives: half a frame each, still room.
        for sock in stalled:
            sock.sendall(bytes(1024 * 1024))
        time.sleep(0.3)
        assert answered_promptly(broker.bootstrap) < PROMPT
        assert broker.call(lambda b: b.budget.used) <= 4 * 1024 * 1024 + 64 * 1024


def test_unauthenticated_announcements_hold_no_budget(kafka_broker_factory: Factory) -> None:
    """On a SASL listener, 130 unauthenticated peers each announcing the largest SASL
    frame (512 KiB, 65 MiB in all) and sending nothing keep no one waiting."""
    broker = kafka_broker_factory(sasl_users={"alice": "secret"})
    with sockets(broker.bootstrap, 130) as stalled:
        for sock in stalled:
            sock.sendall(struct.pack(">i", 512 * 1024))
        time.sleep(0.5)
        assert answered_promptly(broker.bootstrap) < PROMPT


def test_a_frame_sent_in_pieces_is_served(kafka_broker_factory: Factory) -> None:
    """A large frame trickling in (charged piece by piece) is read whole and answered,
    and its charge is given back."""
    broker = kafka_broker_factory()
    with Wire(broker.bootstrap) as wire:
        # ApiVersions v0 has an empty body: a long client id makes the frame large.
        frame = encoded(ApiVersionsRequest(), 1, client_id="c" * 30_000)
        assert len(frame) > FRAME_CHUNK
        for at in range(0, len(frame), 7000):
            wire.sock.sendall(frame[at : at + 7000])
            time.sleep(0.01)
        wire.correlation_id = 1
        wire.sock.settimeout(PROMPT)
        assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
    time.sleep(0.1)
    assert broker.call(lambda b: b.budget.used) == 0


def test_partial_frames_filling_the_budget_do_not_wait_for_one_another(
    kafka_broker_factory: Factory,
) -> None:
    """Two 30 kB frames against a 40 kB budget, both half sent, then the rest: the one
    whose piece does not fit gives back what it holds and waits holding nothing (no
    connection holding bytes waits for more), the other completes, then it does."""
    broker = kafka_broker_factory(max_request_bytes=40_000, max_inflight_bytes=40_000)
    frame = encoded(ApiVersionsRequest(), 1, client_id="c" * 30_000)
    half = len(frame) // 2
    with Wire(broker.bootstrap) as first, Wire(broker.bootstrap) as second:
        for wire in (first, second):
            wire.sock.sendall(frame[:half])
        time.sleep(0.2)
        for wire in (first, second):
            wire.sock.sendall(frame[half:])
        for wire in (first, second):
            wire.correlation_id = 1
            wire.sock.settimeout(PROMPT)
            assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
    wait_for(lambda: broker.call(lambda b: b.budget.used) == 0, "the budget given back", 5)


# -- item 6: answers bigger than their requests ---------------------------------------------


def join_request(group: str, metadata: bytes, session_s: int = 30) -> join_v5.JoinGroupRequest:
    """A first JoinGroup (v5: no member id needed) carrying ``metadata``."""
    return join_v5.JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=session_s)),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=session_s)),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(join_v5.JoinGroupRequestProtocol(name="range", metadata=metadata),),
    )


def big_group(address: str, metadata: int) -> str:
    """A group whose one member's metadata is ``metadata`` bytes, described with it
    (its rebalance is completing: the member is the leader, it has not synced)."""
    group = name("big")
    with Wire(address) as wire:
        joined = wire.call(join_request(group, bytes(metadata)), JoinGroupResponse)
        assert joined.error_code is ErrorCode.none
    return group


def test_describe_groups_answers_a_group_named_many_times_once(
    kafka_broker_factory: Factory,
) -> None:
    """A 20 kB request naming one 20 kB group 2,000 times is answered with the group
    once (Kafka answers the distinct group ids), not with a 40 MB answer."""
    broker = kafka_broker_factory(initial_rebalance_delay=0.0)
    group = big_group(broker.bootstrap, 20_000)
    with Wire(broker.bootstrap) as wire:
        request = DescribeGroupsRequest(groups=(GroupId(group),) * 2000)
        wire.send(request)
        wire.sock.settimeout(PROMPT)
        described = wire.receive(DescribeGroupsResponse)
    assert [g.group_id for g in described.groups] == [group]
    (member,) = described.groups[0].members
    assert len(member.member_metadata) == 20_000


def write_buffers(broker: KafkaBroker) -> int:
    return sum(w.transport.get_write_buffer_size() for w in broker.connections.values())


def test_answers_not_read_hold_no_more_than_the_budget(kafka_broker_factory: Factory) -> None:
    """Twenty clients send small DescribeGroups requests whose answers are 200 kB each,
    and never read: every answer is charged to the in-flight budget (1 MiB here) until
    written, so what their answers hold in the broker stays within it (those that find
    no room wait at most budget_wait_seconds, then are closed), and another client is
    answered once they are gone."""
    limit = 1024 * 1024
    broker = kafka_broker_factory(
        initial_rebalance_delay=0.0,
        max_request_bytes=256 * 1024,
        max_inflight_bytes=limit,
        budget_wait_seconds=1.0,
        idle_seconds=3.0,
    )
    group = big_group(broker.bootstrap, 200_000)
    frame = encoded(DescribeGroupsRequest(groups=(GroupId(group),)), 1)
    readers: list[socket.socket] = []
    try:
        for _ in range(20):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(5)
            sock.connect(tuple_address(broker.bootstrap))
            readers.append(sock)
            sock.sendall(frame * 20)  # pipelined, never read
        most = 0
        for _ in range(10):
            time.sleep(0.1)
            most = max(most, broker.call(write_buffers))
            assert broker.call(lambda b: b.budget.used) <= limit
        assert most <= limit, f"{most} bytes of answers held, the budget is {limit}"
        # Room comes back as the readers go: those that found none after
        # budget_wait_seconds, those holding an answer they do not read after idle_seconds.
        # A client that comes before (a loaded machine makes that likely) waits no longer
        # than budget_wait_seconds itself and is closed, so it tries again; what is
        # asserted is that one is answered once the readers are gone, in bounded time.
        started = time.monotonic()
        while True:
            try:
                with Wire(broker.bootstrap) as wire:
                    wire.send(ApiVersionsRequest())
                    wire.sock.settimeout(10)
                    assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
                break
            except (AssertionError, OSError):
                if time.monotonic() - started > 6.0:
                    raise
                time.sleep(0.2)
        assert time.monotonic() - started < 6.0
    finally:
        for sock in readers:
            sock.close()


def tuple_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


# -- item 3: parked requests -------------------------------------------------------------------

SMALL_BUDGET: Final = {
    "max_request_bytes": 512 * 1024,
    "max_inflight_bytes": 2 * 1024 * 1024,
    "budget_wait_seconds": 30.0,
}
"""A 2 MiB budget (a valid configuration: it holds four of the largest frames): fifteen
parked requests of 200 kB, or eight of 300 kB, are beyond it."""


def test_parked_joins_do_not_hold_their_frames(kafka_broker_factory: Factory) -> None:
    """A member that will not rejoin (a long session) keeps a rebalance open; fifteen
    JoinGroups with 200 kB of metadata each park until it ends (3 MB, beyond the 2 MiB
    budget). What they keep is the group's (max_group_bytes counts it), not the
    budget's: another client is answered at once."""
    broker = kafka_broker_factory(initial_rebalance_delay=0.0, **SMALL_BUDGET)
    group = name("parked")
    with Wire(broker.bootstrap) as first:
        joined = first.call(join_request(group, b"first", session_s=1800), JoinGroupResponse)
        assert joined.error_code is ErrorCode.none
        with sockets(broker.bootstrap, 15) as joiners:
            frame = encoded(join_request(group, bytes(200_000), session_s=1800), 1)
            for sock in joiners:
                sock.sendall(frame)
            time.sleep(0.5)  # every join is read and parked
            assert answered_promptly(broker.bootstrap) < PROMPT
            wait_for(
                lambda: broker.call(lambda b: len(b.groups.groups[group].members)) == 16,
                "the joins parked",
                timeout=5,
            )
            assert broker.call(lambda b: b.budget.used) < 2 * 1024 * 1024
            assert not any(readable(sock) for sock in joiners)  # still parked


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_a_parked_acks_all_produce_does_not_hold_its_frame(kafka_broker_factory: Factory) -> None:
    """Produces with acks=all wait for slow followers (5 s after each fetch): eight of
    300 kB each park beyond the 2 MiB budget. Their batches are the log's (its retention
    counts them), not the budget's: another client is answered while they wait."""
    broker = kafka_broker_factory(replicas=3, follower_delay=5.0, **SMALL_BUDGET)
    topic = name("parked")
    with Wire(broker.bootstrap) as setup:
        create(setup, topic)
    records = batch(-1, -1, [bytes(300_000)])
    frame = encoded(produce_request([(topic, [(0, records)])], timeout=30), 1)
    with sockets(broker.bootstrap, 8) as producers:
        for sock in producers:
            sock.sendall(frame)
        time.sleep(0.5)  # every produce is read and parked
        assert answered_promptly(broker.bootstrap) < PROMPT
        assert broker.call(lambda b: b.budget.used) < 2 * 1024 * 1024
        assert not any(readable(sock) for sock in producers)  # still parked
        assert broker.offsets(topic)[0].log_end == 8


# -- item 13: TLS handshakes count against max_connections ------------------------------------


def test_tls_handshakes_in_progress_count_against_max_connections(
    kafka_broker_factory: Factory, kafka_tls: TlsFiles
) -> None:
    """With max_connections 5, twenty peers connect to a TLS listener and never start a
    handshake: the fifteen past the limit are closed at once, as Kafka counts a
    connection from its accept; the five first are dropped at auth_deadline_seconds.
    Then a TLS client is served."""
    broker = kafka_broker_factory(tls=True, max_connections=5, auth_deadline_seconds=2.0)
    with sockets(broker.bootstrap, 20) as silent:
        time.sleep(0.3)  # every one accepted
        held = []
        for sock in silent:
            sock.settimeout(0.1)
            try:
                assert closed_by_broker(sock)
            except TimeoutError:
                held.append(sock)  # counted: the broker waits for its handshake
        assert len(held) == 5
        for sock in held:  # their handshake's deadline
            sock.settimeout(5)
            assert closed_by_broker(sock)
    raw = socket.create_connection(tuple_address(broker.bootstrap), timeout=5)
    with Wire(broker.bootstrap) as wire:
        wire.sock.close()
        wire.sock = kafka_tls.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
        wire.send(ApiVersionsRequest())
        assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
    assert broker.call(lambda b: len(b.connections)) <= 1


@pytest.mark.anyio
async def test_silent_tls_peers_past_the_limit_go_at_once_on_either_loop(
    kafka_tls: TlsFiles,
) -> None:
    """The same on asyncio and uvloop, in process, with aiokafka as the TLS client: the
    handshake starts once counted, with the bytes the client sent before (uvloop reads
    them before the handshake can start)."""
    async with (
        asyncio.timeout(20),
        KafkaBroker(
            ssl_context=kafka_tls.server_context(), max_connections=3, auth_deadline_seconds=1.0
        ) as broker,
    ):
        host, port = tuple_address(broker.bootstrap)
        silent = [await asyncio.open_connection(host, port) for _ in range(10)]
        try:
            await asyncio.sleep(0.2)
            held = []
            for reader, _ in silent:
                try:
                    assert await asyncio.wait_for(reader.read(1), 0.1) == b""
                except TimeoutError:
                    held.append(reader)
            assert len(held) == 3
            for reader in held:  # their handshake's deadline
                assert await asyncio.wait_for(reader.read(1), 3) == b""
        finally:
            for _, writer in silent:
                writer.close()
        await served_over_tls(broker.bootstrap, kafka_tls.client_context())


# -- the review of the fixes (issue 44, round four) -------------------------------------------


# -- item 2: a small frame announced, not sent ------------------------------------------------


def test_small_frames_announced_not_sent_hold_no_budget(kafka_broker_factory: Factory) -> None:
    """A frame up to FRAME_CHUNK was still charged whole when announced: 130 peers
    announcing 16 KiB each and sending nothing held a 2 MiB budget (every other client
    waited, for up to idle_seconds). Bytes not sent hold nothing, whatever the size."""
    broker = kafka_broker_factory(**SMALL_BUDGET)
    with sockets(broker.bootstrap, 130) as stalled:
        for sock in stalled:
            sock.sendall(struct.pack(">i", FRAME_CHUNK))
        time.sleep(0.5)  # their prefixes are read
        assert answered_promptly(broker.bootstrap) < PROMPT
        assert broker.call(lambda b: b.budget.used) == 0


# -- item 3: a parked request keeps only what its operation needs --------------------------


def padded_fetch(topic: str, copies: int, max_wait: float = 10.0) -> bytes:
    """A Fetch v11 of partition 0 of ``topic`` that parks (min_bytes 1, a long wait),
    naming the partition ``copies`` times."""
    request = fetch_request(topic, 0, max_wait=max_wait, min_bytes=1)
    part = request.topics[0].partitions[0]
    topics = (dataclasses.replace(request.topics[0], partitions=(part,) * copies),)
    return encoded(dataclasses.replace(request, topics=topics), 1)


def alive_fetch_partitions() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is fetch.FetchPartition)


def test_parked_padded_fetches_keep_no_more_than_the_budget(
    kafka_broker_factory: Factory,
) -> None:
    """Item 3 gives a frame back to the budget once decoded, but a parked Fetch keeps
    its whole decoded request (the handler's and the dispatcher's frames hold it), not
    only the partitions it waits on: eight fetches of 480 kB (15,000 namings of one
    partition each) all park holding 3.8 MB of entries against a 2 MiB budget, and
    1,024 connections could hold 16 GiB. What parked fetches keep must stay within
    the budget (before item 3, four parked at most; with the padding dropped, none)."""
    broker = kafka_broker_factory(**SMALL_BUDGET)
    topic = name("padded")
    with Wire(broker.bootstrap) as setup:
        create(setup, topic)
    copies = 15_000
    frame = padded_fetch(topic, copies)
    assert len(frame) < 512 * 1024
    entry_bytes = (len(frame) - 100) / copies  # one naming on the wire
    gc.collect()
    before = alive_fetch_partitions()
    with sockets(broker.bootstrap, 8) as fetchers:
        for sock in fetchers:
            sock.sendall(frame)
        time.sleep(1.0)  # every fetch read, and parked if admitted
        kept = alive_fetch_partitions() - before
        assert kept * entry_bytes <= 2 * 1024 * 1024, (
            f"{kept} namings kept by parked fetches ({kept * entry_bytes:,.0f} bytes on the"
            " wire) beyond the 2 MiB budget"
        )


def test_a_padded_fetch_is_answered_at_once_and_an_honest_one_parks(
    kafka_broker_factory: Factory,
) -> None:
    """A Fetch naming its partition twice is answered at once (no client sends one; parked,
    it would hold what it names for up to max_wait); the same fetch naming it once parks
    until its max_wait, holding its frame's charge the while (what it parks with)."""
    broker = kafka_broker_factory(**SMALL_BUDGET)
    topic = name("padded")
    with Wire(broker.bootstrap) as setup:
        create(setup, topic)
    for copies, parks in ((2, False), (1, True)):
        frame = padded_fetch(topic, copies, max_wait=3.0)
        with Wire(broker.bootstrap) as wire:
            started = time.monotonic()
            wire.sock.sendall(frame)
            wire.correlation_id = 1  # padded_fetch's
            if parks:
                time.sleep(0.5)  # read, and parked
                assert broker.call(lambda b: b.budget.used) >= len(frame) - 4
            wire.sock.settimeout(10.0)
            answer = wire.receive(FetchResponse)
            took = time.monotonic() - started
        assert answer.error_code is ErrorCode.none
        if parks:
            assert took >= 2.9, f"an honest fetch answered after {took:.2f} s, not its max_wait"
        else:
            assert took < PROMPT, f"a padded fetch answered after {took:.2f} s"
    assert broker.call(lambda b: b.budget.used) == 0


# -- TLS peers that reset before their handshake starts ----------------------------------------


def reset_at_once(address: tuple[str, int], count: int) -> None:
    """``count`` connections, each reset (SO_LINGER 0) at once: some before sending a
    byte, some after the first bytes of a ClientHello, some a moment later."""
    for i in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(5)
        try:
            sock.connect(address)
            if i % 3 == 1:
                sock.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            elif i % 3 == 2:
                time.sleep(0.001)
        except OSError:
            pass  # refused past max_connections' backlog: nothing to reset
        finally:
            sock.close()


@pytest.mark.anyio
async def test_tls_peers_resetting_before_the_handshake_leave_nothing(
    kafka_tls: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """On asyncio and uvloop: 300 peers connect to a TLS listener and reset at once,
    before or while the handshake starts. Each connection ends quietly (no error
    logged, no exception left unretrieved, none escaping the connection's task), the
    count of connections returns to 0, and a TLS client is then served."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    caplog.set_level(logging.WARNING)
    try:
        async with (
            asyncio.timeout(30),
            KafkaBroker(
                ssl_context=kafka_tls.server_context(), auth_deadline_seconds=2.0
            ) as broker,
        ):
            host, port = broker.bootstrap.rsplit(":", 1)
            await asyncio.to_thread(reset_at_once, (host, int(port)), 300)
            for _ in range(100):  # 5 s: past the handshake's deadline and its grace
                if not broker.connections:
                    break
                await asyncio.sleep(0.05)
            assert len(broker.connections) == 0
            await served_over_tls(broker.bootstrap, kafka_tls.client_context())
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reported == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
