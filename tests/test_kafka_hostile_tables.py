"""What a peer can make the broker keep (issue 44): producer ids, transactional ids,
group ids and protocol types, the tables of transactional ids and groups, and a check
that every table and string a peer can grow is named in :class:`Limits` with its bound.

Raw frames where no client shows the defect, real clients where one does; every wait
bounded (socket timeouts, the clients' own timeouts, ``asyncio.timeout``).
"""

from __future__ import annotations

import io
from typing import Any

import kafka
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.serial import entity_reader

from aiopurgatory.kafka import BrokerThread
from aiopurgatory.kafka.producers import FIRST_PRODUCER_ID

from .kafka_wire import Wire, batch, encoded, name, produce_request, read_frame
from .kafka_wire import ms as wire_ms
from .test_kafka_broker_data import produced

WAIT = 10.0
"""Seconds any one wait of these tests takes at most."""
KAFKA_PYTHON: dict[str, Any] = {
    "request_timeout_ms": 5000,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
    "max_block_ms": 5000,
}
"""kafka-python's timeouts, shortened: a producer refused its id fails within the test."""


def pipelined(wire: Wire, requests: list[Any], response_type: type[Any]) -> list[Any]:
    """``requests`` sent at once on ``wire`` (one ``sendall``), then their answers read in
    order: thousands of requests in well under a second."""
    frames = io.BytesIO()
    first = wire.correlation_id + 1
    for offset, request in enumerate(requests):
        frames.write(encoded(request, first + offset, header_type=wire.request_header))
    wire.correlation_id += len(requests)
    wire.sock.settimeout(WAIT)
    wire.sock.sendall(frames.getvalue())
    answers = []
    for offset in range(len(requests)):
        frame = read_frame(wire.sock)
        correlation_id, used = wire.response_header(frame)
        assert correlation_id == first + offset
        answers.append(entity_reader(response_type)(frame, used)[0])
    return answers


# -- item 4: producer ids are a counter, not a table -----------------------------------

OLD_PRODUCER_CAP = 10_000
"""What ``max_producers`` was by default: the ids a broker handed out in its life."""


def test_producer_ids_never_run_out_and_ids_never_handed_out_are_still_refused() -> None:
    """More InitProducerId than the old lifetime cap (10,000, 340 kB of frames): every
    one gets a new id, and a real idempotent producer (kafka-python) then still gets
    one and writes; a batch carrying an id never handed out is still refused."""
    topic = name("t")
    with BrokerThread() as bootstrap, Wire(bootstrap) as wire:
        request = InitProducerIdRequest(transactional_id=None, transaction_timeout=wire_ms(60))
        answers = pipelined(wire, [request] * (OLD_PRODUCER_CAP + 1), InitProducerIdResponse)
        assert {answer.error_code for answer in answers} == {ErrorCode.none}
        ids = [int(answer.producer_id) for answer in answers]
        assert len(set(ids)) == len(ids)
        producer = kafka.KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **KAFKA_PYTHON
        )
        try:
            sent = producer.send(topic, b"v", partition=0).get(timeout=WAIT)
            assert sent.offset == 0
        finally:
            producer.close(timeout=WAIT)
        # Never handed out (beyond every id given so far): refused, nothing kept for it.
        stranger = max(ids) + 1000
        assert produced(wire, produce_request([(topic, [(0, batch(stranger, 0, [b"x"]))])])) == [
            (ErrorCode.unknown_producer_id, -1)
        ]
        assert min(ids) >= FIRST_PRODUCER_ID
