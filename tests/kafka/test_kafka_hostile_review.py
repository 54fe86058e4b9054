"""Issue 44, round four: a hostile review of the fixes (the in-flight budget).

Each test shows a way around a fix of the issue, or a hole a fix opened: raw frames
over loopback sockets, on a broker thread of the test's own; every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import gc
import struct
import time
from collections.abc import Callable
from typing import Final

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch
from kio.schema.fetch.v11.response import FetchResponse

from aiopurgatory.kafka import BrokerThread
from aiopurgatory.kafka.connection import FRAME_CHUNK

from ..support.kafka_wire import (
    PROMPT,
    Wire,
    answered_promptly,
    create,
    encoded,
    fetch_request,
    name,
    sockets,
)

Factory = Callable[..., BrokerThread]

SMALL_BUDGET: Final = {
    "max_request_bytes": 512 * 1024,
    "max_inflight_bytes": 2 * 1024 * 1024,
    "budget_wait_seconds": 30.0,
}
"""A 2 MiB budget (a valid configuration: it holds four of the largest frames)."""


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
