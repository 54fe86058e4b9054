"""The broker's TLS and SASL listeners, driven over loopback by the three Python Kafka
clients with their production security settings, and by raw sockets.

Each client (aiokafka, kafka-python, confluent-kafka) produces a record and consumes it
back over TLS (trusting the ``kafka_tls`` throwaway CA), over SASL PLAIN with and
without TLS, over SCRAM-SHA-256 and SCRAM-SHA-512, and is refused with a wrong
password: the test asserts the client's own error and the broker's log line saying it
closed the connection. Raw sockets check what no client sends: a mechanism not enabled,
a request before authentication, an oversized SASL message, a peer that never
authenticates (closed at a short ``auth_deadline_seconds``), the v0 handshake's bare
tokens, and SASL requests to a listener without SASL. The SCRAM exchange is checked
against RFC 7677's example. Each broker is a ``kafka_broker_factory`` one, on a free
port of its own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.sasl import SaslError, SaslSession, SaslUsers, parse_user
from aiopurgatory.kafka.tls import TlsFiles

from ..support.servers import start_server, stop_server

USERS = {"alice": "secret", "bob": "p:a,s=s"}
WRONG = "not-the-password"
TIMEOUT = 10.0
"""Seconds a client may take to produce or consume one record."""
Factory = Callable[..., BrokerThread]

# API keys and Kafka's error codes, as the raw-socket tests write and read them.
API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58


def topic_name() -> str:
    return f"secure-{uuid.uuid4().hex[:10]}"


def start(factory: Factory, protocol: str, **options: Any) -> BrokerThread:
    """A broker listening with ``protocol`` (``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``)."""
    if protocol.startswith("SASL"):
        options.setdefault("sasl_users", USERS)
    broker = factory(tls=protocol.endswith("SSL"), **options)
    assert broker.security_protocol == protocol
    return broker


# -- the clients ------------------------------------------------------------------------


def aiokafka_settings(protocol: str, mechanism: str | None, password: str, tls: TlsFiles) -> Any:
    settings: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        settings["ssl_context"] = tls.client_context()
    if mechanism is not None:
        settings.update(
            sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password=password
        )
    return settings


async def aiokafka_round_trip(bootstrap: str, topic: str, settings: dict[str, Any]) -> bytes:
    aiokafka = pytest.importorskip("aiokafka")
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, **settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"over aiokafka", partition=0)
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", **settings
    )
    await consumer.start()
    try:
        consumer.assign([aiokafka.TopicPartition(topic, 0)])
        record = await asyncio.wait_for(consumer.getone(), TIMEOUT)
    finally:
        await consumer.stop()
    value: bytes = record.value
    return value


def kafka_python_settings(
    protocol: str, mechanism: str | None, password: str, tls: TlsFiles
) -> dict[str, Any]:
    settings: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        settings["ssl_cafile"] = str(tls.ca_file)
    if mechanism is not None:
        settings.update(
            sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password=password
        )
    return settings


def kafka_python_round_trip(bootstrap: str, topic: str, settings: dict[str, Any]) -> bytes:
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, **settings)
    try:
        producer.send(topic, b"over kafka-python", partition=0).get(timeout=TIMEOUT)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", **settings
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                value: bytes = records[0].value
                return value
    finally:
        consumer.close()
    raise AssertionError("kafka-python consumed nothing")


def confluent_settings(
    protocol: str, mechanism: str | None, password: str, tls: TlsFiles
) -> dict[str, Any]:
    settings: dict[str, Any] = {"security.protocol": protocol}
    if protocol.endswith("SSL"):
        settings["ssl.ca.location"] = str(tls.ca_file)
    if mechanism is not None:
        settings.update(
            {"sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": password}
        )
    return settings


def confluent_round_trip(bootstrap: str, topic: str, settings: dict[str, Any]) -> bytes:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **settings})
    producer.produce(topic, b"over confluent-kafka", partition=0)
    assert producer.flush(TIMEOUT) == 0
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "enable.auto.commit": False,
            **settings,
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                value: bytes = message.value()
                return value
    finally:
        consumer.close()
    raise AssertionError("confluent-kafka consumed nothing")


CASES = [
    ("SSL", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_SSL", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_SSL", "SCRAM-SHA-512"),
]


@pytest.mark.parametrize(("protocol", "mechanism"), CASES)
def test_aiokafka_produces_and_consumes(
    kafka_broker_factory: Factory, kafka_tls: TlsFiles, protocol: str, mechanism: str | None
) -> None:
    broker = start(kafka_broker_factory, protocol)
    settings = aiokafka_settings(protocol, mechanism, USERS["alice"], kafka_tls)
    topic = topic_name()
    assert asyncio.run(aiokafka_round_trip(broker.bootstrap, topic, settings)) == b"over aiokafka"
    assert broker.offsets(topic)[0].high_watermark == 1


@pytest.mark.parametrize(("protocol", "mechanism"), CASES)
def test_kafka_python_produces_and_consumes(
    kafka_broker_factory: Factory, kafka_tls: TlsFiles, protocol: str, mechanism: str | None
) -> None:
    broker = start(kafka_broker_factory, protocol)
    settings = kafka_python_settings(protocol, mechanism, USERS["alice"], kafka_tls)
    topic = topic_name()
    assert kafka_python_round_trip(broker.bootstrap, topic, settings) == b"over kafka-python"
    assert broker.offsets(topic)[0].high_watermark == 1


@pytest.mark.parametrize(("protocol", "mechanism"), CASES)
def test_confluent_kafka_produces_and_consumes(
    kafka_broker_factory: Factory, kafka_tls: TlsFiles, protocol: str, mechanism: str | None
) -> None:
    broker = start(kafka_broker_factory, protocol)
    settings = confluent_settings(protocol, mechanism, USERS["alice"], kafka_tls)
    topic = topic_name()
    assert confluent_round_trip(broker.bootstrap, topic, settings) == b"over confluent-kafka"
    assert broker.offsets(topic)[0].high_watermark == 1


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python", "confluent-kafka"])
def test_every_node_of_a_cluster_takes_tls_and_sasl(
    kafka_broker_factory: Factory, kafka_tls: TlsFiles, client: str
) -> None:
    """On a cluster each node listens with the same TLS and SASL: the client bootstraps
    from one, and produces to and fetches from the partition's leader, another node."""
    broker = start(kafka_broker_factory, "SASL_SSL", nodes=3, replicas=3)
    topic = topic_name()
    broker.create_topic(topic, 1)
    leader = broker.leader(topic)
    # Bootstrapped from a node that does not lead: the client must reach the leader too.
    other = broker.call(lambda b: b.node_address((leader + 1) % 3))
    if client == "aiokafka":
        settings = aiokafka_settings("SASL_SSL", "SCRAM-SHA-512", USERS["alice"], kafka_tls)
        value = asyncio.run(aiokafka_round_trip(other, topic, settings))
    elif client == "kafka-python":
        settings = kafka_python_settings("SASL_SSL", "SCRAM-SHA-512", USERS["alice"], kafka_tls)
        value = kafka_python_round_trip(other, topic, settings)
    else:
        settings = confluent_settings("SASL_SSL", "SCRAM-SHA-512", USERS["alice"], kafka_tls)
        value = confluent_round_trip(other, topic, settings)
    assert value.startswith(b"over ")
    assert broker.offsets(topic)[0].high_watermark == 1
    assert len(broker.isr(topic)) == 3


# -- a wrong password -------------------------------------------------------------------

PLAIN_FAILED = "Authentication failed: Invalid username or password"
SCRAM_FAILED = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
)
WRONG_CASES = [
    ("SASL_PLAINTEXT", "PLAIN", PLAIN_FAILED),
    ("SASL_SSL", "SCRAM-SHA-256", SCRAM_FAILED.format("SCRAM-SHA-256")),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", SCRAM_FAILED.format("SCRAM-SHA-512")),
]


def broker_closed(caplog: pytest.LogCaptureFixture, message: str) -> bool:
    """Whether the broker logs closing a connection over ``message`` (it closes 100 ms
    after its answer, as Kafka delays a failed authentication: wait a little)."""
    expected = f"closing a connection: SASL authentication failed: {message}"
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        if any(
            r.name == "aiopurgatory.kafka" and r.getMessage() == expected for r in caplog.records
        ):
            return True
        time.sleep(0.02)
    return False


def client_logged(caplog: pytest.LogCaptureFixture, logger: str, *parts: str) -> bool:
    return any(
        r.name.startswith(logger) and all(part in r.getMessage() for part in parts)
        for r in caplog.records
    )


@pytest.mark.parametrize(("protocol", "mechanism", "message"), WRONG_CASES)
def test_aiokafka_is_refused_a_wrong_password(
    kafka_broker_factory: Factory,
    kafka_tls: TlsFiles,
    caplog: pytest.LogCaptureFixture,
    protocol: str,
    mechanism: str,
    message: str,
) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    caplog.set_level(logging.INFO)
    broker = start(kafka_broker_factory, protocol)
    settings = aiokafka_settings(protocol, mechanism, WRONG, kafka_tls)

    async def connect() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, **settings)
        try:
            await producer.start()
        finally:
            await producer.stop()

    started = time.monotonic()
    with pytest.raises(aiokafka.errors.KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(connect())
    assert time.monotonic() - started < TIMEOUT
    # aiokafka logs the broker's answer, then gives up bootstrapping.
    assert client_logged(caplog, "aiokafka", "[Error 58] SaslAuthenticationFailed", message)
    assert broker_closed(caplog, message)


@pytest.mark.parametrize(("protocol", "mechanism", "message"), WRONG_CASES)
def test_kafka_python_is_refused_a_wrong_password(
    kafka_broker_factory: Factory,
    kafka_tls: TlsFiles,
    caplog: pytest.LogCaptureFixture,
    protocol: str,
    mechanism: str,
    message: str,
) -> None:
    kafka = pytest.importorskip("kafka")
    caplog.set_level(logging.INFO)
    broker = start(kafka_broker_factory, protocol)
    settings = kafka_python_settings(protocol, mechanism, WRONG, kafka_tls)
    # kafka-python retries bootstrapping (30 s by default): a second is plenty here.
    with pytest.raises(kafka.errors.KafkaTimeoutError, match="Unable to bootstrap"):
        kafka.KafkaProducer(
            bootstrap_servers=broker.bootstrap, bootstrap_timeout_ms=1500, **settings
        )
    assert client_logged(caplog, "kafka", "[Error 58] SaslAuthenticationFailedError", message)
    assert broker_closed(caplog, message)


@pytest.mark.parametrize(("protocol", "mechanism", "message"), WRONG_CASES)
def test_confluent_kafka_is_refused_a_wrong_password(
    kafka_broker_factory: Factory,
    kafka_tls: TlsFiles,
    caplog: pytest.LogCaptureFixture,
    protocol: str,
    mechanism: str,
    message: str,
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    caplog.set_level(logging.INFO)
    broker = start(kafka_broker_factory, protocol)
    errors: list[Any] = []
    settings = confluent_settings(protocol, mechanism, WRONG, kafka_tls)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "error_cb": errors.append,
            "log_level": 0,
            **settings,
        }
    )
    deadline = time.monotonic() + TIMEOUT
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    del producer  # librdkafka's threads stop with the handle
    assert errors, "confluent-kafka reported no error"
    error = errors[0]
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION
    assert f"SASL authentication error: {message}" in error.str()
    assert broker_closed(caplog, message)


# -- raw sockets ------------------------------------------------------------------------


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def request(api_key: int, version: int, body: bytes = b"", correlation_id: int = 7) -> bytes:
    """A request frame with a v1 header (every API and version used here takes one)."""
    frame = struct.pack(">hhi", api_key, version, correlation_id) + string("raw") + body
    return struct.pack(">i", len(frame)) + frame


def connect(broker: BrokerThread) -> socket.socket:
    host, port = broker.bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def read_exactly(sock: socket.socket, count: int) -> bytes | None:
    """``count`` bytes, or None when the broker closed the connection first."""
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def answer(sock: socket.socket) -> bytes | None:
    """The next response's body (after the correlation id), or None on EOF."""
    size = read_exactly(sock, 4)
    if size is None:
        return None
    frame = read_exactly(sock, struct.unpack(">i", size)[0])
    assert frame is not None, "the broker closed the connection mid-answer"
    assert struct.unpack(">i", frame[:4])[0] == 7
    return frame[4:]


def closed(sock: socket.socket) -> bool:
    """Whether the broker closed the connection (EOF) without answering anything more."""
    return read_exactly(sock, 1) is None


def handshake(sock: socket.socket, mechanism: str, version: int = 1) -> tuple[int, list[str]]:
    sock.sendall(request(SASL_HANDSHAKE, version, string(mechanism)))
    body = answer(sock)
    assert body is not None
    error, count = struct.unpack(">hi", body[:6])
    mechanisms, offset = [], 6
    for _ in range(count):
        (length,) = struct.unpack(">h", body[offset : offset + 2])
        mechanisms.append(body[offset + 2 : offset + 2 + length].decode())
        offset += 2 + length
    return error, mechanisms


def authenticate(sock: socket.socket, token: bytes) -> tuple[int, str | None, bytes]:
    """SaslAuthenticate v1: (error code, error message, the server's bytes)."""
    sock.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token))
    body = answer(sock)
    assert body is not None
    error, length = struct.unpack(">hh", body[:4])
    message = None if length < 0 else body[4 : 4 + length].decode()
    offset = 4 + max(length, 0)
    (size,) = struct.unpack(">i", body[offset : offset + 4])
    return error, message, body[offset + 4 : offset + 4 + size]


def metadata_answered(sock: socket.socket) -> bool:
    sock.sendall(request(METADATA, 1, struct.pack(">i", -1)))
    return answer(sock) is not None


def test_a_mechanism_not_enabled_is_refused_with_those_enabled(
    kafka_broker_factory: Factory,
) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT", sasl_mechanisms=["SCRAM-SHA-512"])
    with connect(broker) as sock:
        assert handshake(sock, "PLAIN") == (UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-512"])
        assert closed(sock)
    with connect(broker) as sock:
        assert handshake(sock, "GSSAPI") == (UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-512"])
        assert closed(sock)


def test_only_api_versions_and_sasl_are_served_before_authentication(
    kafka_broker_factory: Factory,
) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT")
    with connect(broker) as sock:  # Metadata first: closed, unanswered
        assert not metadata_answered(sock)
    with connect(broker) as sock:  # ApiVersions is served, then Metadata still is not
        sock.sendall(request(API_VERSIONS, 0))
        assert answer(sock) is not None
        assert not metadata_answered(sock)
    with connect(broker) as sock:  # after the handshake, before SaslAuthenticate
        assert handshake(sock, "PLAIN") == (0, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
        assert not metadata_answered(sock)
    assert broker.topics == {}


def test_sasl_requests_out_of_order_answer_illegal_sasl_state_and_close(
    kafka_broker_factory: Factory,
) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT")
    with connect(broker) as sock:  # SaslAuthenticate with no handshake
        error, message, _ = authenticate(sock, b"\0alice\0secret")
        assert error == ILLEGAL_SASL_STATE
        assert message
        assert "SaslHandshake" in message
        assert closed(sock)
    with connect(broker) as sock:  # a second handshake
        assert handshake(sock, "PLAIN")[0] == 0
        assert handshake(sock, "PLAIN")[0] == ILLEGAL_SASL_STATE
        assert closed(sock)


def test_plain_over_raw_socket_then_the_connection_serves_everything(
    kafka_broker_factory: Factory,
) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT", auth_deadline_seconds=0.5)
    with connect(broker) as sock:
        assert handshake(sock, "PLAIN")[0] == 0
        assert authenticate(sock, b"\0bob\0p:a,s=s") == (0, None, b"")
        time.sleep(0.8)  # past the authentication deadline: it no longer applies
        assert metadata_answered(sock)
        # Authenticated: another handshake is told ILLEGAL_SASL_STATE, and serves on.
        assert handshake(sock, "PLAIN")[0] == ILLEGAL_SASL_STATE
        assert metadata_answered(sock)


def test_a_wrong_plain_password_over_raw_socket(kafka_broker_factory: Factory) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT")
    for token in (b"\0alice\0" + WRONG.encode(), b"\0nobody\0secret", b"bob\0alice\0secret"):
        with connect(broker) as sock:
            assert handshake(sock, "PLAIN")[0] == 0
            error, message, data = authenticate(sock, token)
            assert (error, data) == (SASL_AUTHENTICATION_FAILED, b"")
            assert message is not None
            assert message.startswith("Authentication failed")
            assert closed(sock)


def test_the_v0_handshake_takes_bare_tokens(kafka_broker_factory: Factory) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT")
    with connect(broker) as sock:
        assert handshake(sock, "PLAIN", version=0)[0] == 0
        token = b"\0alice\0secret"
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert read_exactly(sock, 4) == bytes(4)  # PLAIN's empty answer, size-prefixed
        assert metadata_answered(sock)
    with connect(broker) as sock:  # a wrong password there has nowhere for an error
        assert handshake(sock, "PLAIN", version=0)[0] == 0
        token = b"\0alice\0" + WRONG.encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert closed(sock)


def test_an_oversized_sasl_message_closes_the_connection(kafka_broker_factory: Factory) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT", sasl_max_receive_bytes=1024)
    with connect(broker) as sock:
        assert handshake(sock, "PLAIN")[0] == 0
        token = b"\0alice\0" + b"x" * 1024
        sock.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token))
        assert closed(sock)
    with connect(broker) as sock:  # only the size announced, before any handshake
        sock.sendall(struct.pack(">i", 1025))
        assert closed(sock)
    with connect(broker) as sock:  # within the bound, it is served
        assert handshake(sock, "PLAIN")[0] == 0
        assert authenticate(sock, b"\0alice\0secret")[0] == 0


def test_a_peer_that_never_authenticates_is_closed_at_the_deadline(
    kafka_broker_factory: Factory,
) -> None:
    broker = start(kafka_broker_factory, "SASL_PLAINTEXT", auth_deadline_seconds=0.5)
    with connect(broker) as silent, connect(broker) as chatty:
        started = time.monotonic()
        assert handshake(chatty, "SCRAM-SHA-256")[0] == 0
        assert closed(silent)
        assert 0.4 <= time.monotonic() - started < 3.0
        assert closed(chatty)  # mid-exchange: the deadline is the connection's
    assert broker.call(lambda b: len(b.connections)) == 0


def test_a_listener_without_sasl_answers_sasl_illegal_state_and_serves_on(
    kafka_broker_factory: Factory,
) -> None:
    broker = kafka_broker_factory()
    assert broker.security_protocol == "PLAINTEXT"
    with connect(broker) as sock:
        assert handshake(sock, "PLAIN") == (ILLEGAL_SASL_STATE, [])
        assert authenticate(sock, b"\0alice\0secret")[0] == ILLEGAL_SASL_STATE
        assert metadata_answered(sock)


# -- SCRAM, options, the command line ---------------------------------------------------


def test_scram_sha_256_is_rfc_7677s_example(monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 7677, section 3: user "user", password "pencil", its salt and nonces.
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    monkeypatch.setattr(secrets, "token_bytes", lambda n: salt)
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    session = SaslSession(SaslUsers({"user": "pencil"}, ["SCRAM-SHA-256"], max_users=1))
    assert session.handshake("SCRAM-SHA-256")
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    first = session.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    final = session.step(
        f"c=biws,r={nonce},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=".encode()
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert session.user == "user"


def test_scram_refuses_a_wrong_proof_and_a_replayed_nonce() -> None:
    users = SaslUsers({"alice": "secret"}, max_users=1)
    session = SaslSession(users)
    assert session.handshake("SCRAM-SHA-512")
    first = session.step(b"n,,n=alice,r=abc").decode()
    nonce = first.split(",")[0][2:]
    with pytest.raises(SaslError, match="invalid credentials"):
        session.step(f"c=biws,r={nonce},p={base64.b64encode(bytes(64)).decode()}".encode())
    other = SaslSession(users)
    assert other.handshake("SCRAM-SHA-512")
    other.step(b"n,,n=alice,r=abc")
    with pytest.raises(SaslError, match="nonce"):
        other.step(b"c=biws,r=abcforged,p=AAAA")


def test_users_are_kept_as_salted_keys_only() -> None:
    users = SaslUsers({"alice": "secret"}, max_users=1)
    held = repr([getattr(users, name) for name in users.__slots__])
    assert "secret" not in held
    assert users.check_password("alice", "secret")
    assert not users.check_password("alice", "Secret")
    assert not users.check_password("nobody", "secret")


def test_a_plain_attempt_costs_no_key_derivation(monkeypatch: pytest.MonkeyPatch) -> None:
    # PBKDF2's 4,096 rounds are paid once per user when the table is made; a PLAIN
    # attempt, which a peer can make once per connection, must not pay them again.
    users = SaslUsers({"alice": "secret"}, ["PLAIN", "SCRAM-SHA-512"], max_users=1)

    def refused(*args: object) -> bytes:
        raise AssertionError("PBKDF2 on a PLAIN attempt")

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", refused)
    assert users.check_password("alice", "secret")
    assert not users.check_password("alice", "wrong")
    assert not users.check_password("nobody", "secret")


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"sasl_users": USERS, "sasl_mechanisms": ["GSSAPI"]}, ValueError, "GSSAPI"),
        ({"sasl_users": USERS, "sasl_mechanisms": "PLAIN"}, TypeError, "'PLAIN'"),
        ({"sasl_users": USERS, "sasl_mechanisms": []}, ValueError, "empty"),
        ({"sasl_mechanisms": ["PLAIN"]}, ValueError, "without sasl_users"),
        ({"sasl_users": {}}, ValueError, "at least one user"),
        ({"sasl_users": USERS, "max_sasl_users": 1}, ValueError, "at most 1 SASL users"),
        ({"sasl_users": {"alice": ""}}, ValueError, "'alice'"),
        ({"sasl_users": [("alice", "secret")]}, TypeError, "sasl_users"),
        ({"ssl_context": "cert.pem"}, TypeError, "'cert.pem'"),
    ],
)
def test_bad_security_options_are_refused(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        KafkaBroker(**options)


def test_parse_user() -> None:
    assert parse_user("alice:se:cret") == ("alice", "se:cret")
    for text in ("alice", ":secret"):
        with pytest.raises(ValueError, match=repr(text)):
            parse_user(text)


def test_the_command_line_listens_with_tls_and_sasl(kafka_tls: TlsFiles) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        "--tls",
        str(kafka_tls.cert_file),
        str(kafka_tls.key_file),
        "--sasl-user",
        "alice:secret",
        "--sasl-mechanism",
        "SCRAM-SHA-256",
    )
    try:
        settings = confluent_settings("SASL_SSL", "SCRAM-SHA-256", "secret", kafka_tls)
        producer = confluent_kafka.Producer({"bootstrap.servers": address, **settings})
        producer.produce(topic_name(), b"over the command line")
        assert producer.flush(TIMEOUT) == 0
    finally:
        assert stop_server(process) == 0
