"""Issue 44, round four: the in-flight byte budget against hostile peers.

Each test shows what a peer could hold of the budget (and so keep every other client
waiting) before the fix: an announced frame size charged before its body arrives, a
parked request keeping its frame, answers bigger than their requests, and TLS
handshakes not counted against max_connections. Raw frames over loopback sockets, on
a broker thread of the test's own; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator

from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode

from aiopurgatory.kafka import BrokerThread
from aiopurgatory.kafka.connection import FRAME_CHUNK

from .kafka_wire import Wire, connect, encoded

Factory = Callable[..., BrokerThread]

PROMPT = 3.0
"""Seconds within which a client must be answered for it to count as not kept waiting."""


@contextlib.contextmanager
def sockets(address: str, count: int) -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(connect(address))
        yield opened
    finally:
        for sock in opened:
            sock.close()


def answered_promptly(address: str) -> float:
    """Seconds a new connection's ApiVersions took to be answered (at most PROMPT)."""
    with Wire(address) as wire:
        started = time.monotonic()
        wire.send(ApiVersionsRequest())
        wire.sock.settimeout(PROMPT)
        assert wire.receive(ApiVersionsResponse).error_code is ErrorCode.none
        return time.monotonic() - started


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
