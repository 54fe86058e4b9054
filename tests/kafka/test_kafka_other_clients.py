"""The broker driven by clients not written in Python: kcat (librdkafka's command line,
in C) and KafkaJS (in JavaScript, on Node).

kcat lists metadata, produces keyed messages, consumes them back, and consumes in a
group that commits. KafkaJS (``tests/support/node/*.js``: one JSON argument in, JSON lines out)
produces and consumes in a group, produces idempotently, commits and aborts
transactions read by a read_committed and a read_uncommitted consumer, and sends
offsets in a transaction. The tests assert on what the clients print and on the
broker's state (the ``kafka_broker`` fixture's read accessors).

A missing ``kcat``, ``node`` or ``npm`` skips the tests that need it, naming the Debian
package (``.ci/run`` installs them). KafkaJS is installed once, with npm, into a cache
outside the checkout (``~/.cache/aiopurgatory-tests/support/node/kafkajs-VERSION``, or under
``$XDG_CACHE_HOME``); later runs need no registry. Every external process runs under a
timeout, and is killed if it outlives it.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from aiopurgatory.kafka import BrokerThread, TopicPartition

NODE_SCRIPTS = Path(__file__).resolve().parents[1] / "support" / "node"
KAFKAJS_VERSION = "2.2.4"
TIMEOUT = 30.0
"""Seconds any one client process may run (the scripts' own watchdog says 20)."""
NPM_TIMEOUT = 180.0

Events = list[dict[str, Any]]


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def need(command: str, package: str) -> str:
    """The command's path, or the test skipped naming the Debian package."""
    path = shutil.which(command)
    if path is None:
        pytest.skip(f"{command} not found: apt-get install {package}")
    return path


def run(
    args: list[str], *, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a client to its end (killed after TIMEOUT s); it must exit with 0."""
    done = subprocess.run(
        args, input=input, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, f"{args[:3]} exited with {done.returncode}:\n{done.stderr}"
    return done


def json_lines(text: str) -> Events:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def negotiated(broker: BrokerThread, client_id: str) -> dict[int, int]:
    """API key to the version ``client_id`` used (the highest, when several)."""
    table = broker.call(lambda b: dict(b.negotiated))
    versions: dict[int, int] = {}
    for (client, api, version), _ in sorted(table.items()):
        if client == client_id:
            versions[api] = version
    return versions


# -- kcat -------------------------------------------------------------------------------


@pytest.fixture
def kcat(kafka_broker: BrokerThread) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``kcat(*args, input=None)``: kcat against the session broker, client id ``kcat``."""
    path = need("kcat", "kcat")

    def call(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return run([path, "-b", kafka_broker.bootstrap, "-X", "client.id=kcat", *args], input=input)

    return call


def test_kcat_lists_metadata(kafka_broker: BrokerThread, kcat: Callable[..., Any]) -> None:
    topic = name("kcat-meta")
    kafka_broker.create_topic(topic, 3)
    listing = json.loads(kcat("-L", "-J", "-t", topic).stdout)
    assert listing["brokers"] == [{"id": 0, "name": kafka_broker.bootstrap}]
    assert listing["controllerid"] == 0
    (described,) = listing["topics"]
    assert described["topic"] == topic
    assert [(p["partition"], p["leader"], p["isrs"]) for p in described["partitions"]] == [
        (partition, 0, [{"id": 0}]) for partition in range(3)
    ]


def test_kcat_produces_keyed_messages_and_consumes_them_back(
    kafka_broker: BrokerThread, kcat: Callable[..., Any]
) -> None:
    topic = name("kcat-keyed")
    kafka_broker.create_topic(topic, 3)
    sent = [(f"key{i % 4}", f"value{i}") for i in range(12)]
    kcat("-P", "-K:", "-t", topic, input="".join(f"{k}:{v}\n" for k, v in sent))
    hw = {o.partition: o.high_watermark for o in kafka_broker.offsets(topic)}
    assert sum(hw.values()) == len(sent)

    records = json_lines(kcat("-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q").stdout)
    assert sorted((r["key"], r["payload"]) for r in records) == sorted(sent)
    # A key's records share a partition, in the order sent, at contiguous offsets.
    by_partition: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_partition.setdefault(record["partition"], []).append(record)
    for partition, stored in by_partition.items():
        assert [r["offset"] for r in stored] == list(range(hw[partition]))
    for key in {k for k, _ in sent}:
        mine = [r for r in records if r["key"] == key]
        assert len({r["partition"] for r in mine}) == 1
        assert [r["payload"] for r in mine] == [v for k, v in sent if k == key]


def test_kcat_consumer_group_commits_its_offsets(
    kafka_broker: BrokerThread, kcat: Callable[..., Any]
) -> None:
    topic, group = name("kcat-group"), name("kcat-readers")
    kafka_broker.create_topic(topic, 2)
    # -G: a balanced consumer (JoinGroup, SyncGroup); it commits what it read when it
    # closes at the end of the partitions (-e). No -o: it starts at the committed offsets,
    # and auto.offset.reset where there are none.
    consume = ("-G", group, topic, "-e", "-J", "-q", "-X", "auto.offset.reset=earliest")
    kcat("-P", "-K:", "-t", topic, input="".join(f"k{i}:first{i}\n" for i in range(6)))
    first = json_lines(kcat(*consume).stdout)
    assert sorted(r["payload"] for r in first) == [f"first{i}" for i in range(6)]
    ends = {o.tp: o.high_watermark for o in kafka_broker.offsets(topic)}
    assert kafka_broker.committed(group) == ends
    described = kafka_broker.group(group)
    assert (described.state, described.protocol_type, described.members) == (
        "Empty",
        "consumer",
        (),
    )

    # The next run reads only what came after the commit.
    kcat("-P", "-K:", "-t", topic, input="k0:second0\nk1:second1\n")
    second = json_lines(kcat(*consume).stdout)
    assert sorted(r["payload"] for r in second) == ["second0", "second1"]
    ends = {o.tp: o.high_watermark for o in kafka_broker.offsets(topic)}
    assert kafka_broker.committed(group) == ends
    assert sum(ends.values()) == 8
    versions = negotiated(kafka_broker, "kcat")
    assert {0, 1, 3, 8, 9, 10, 11, 14} <= versions.keys()


# -- KafkaJS ----------------------------------------------------------------------------


def _cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = base / "aiopurgatory-tests" / "node"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home: this session's own directory
        root = tmp_path_factory.mktemp("node")
    return root


def _installed(prefix: Path) -> bool:
    manifest = prefix / "node_modules" / "kafkajs" / "package.json"
    try:
        return bool(json.loads(manifest.read_text())["version"] == KAFKAJS_VERSION)
    except (OSError, ValueError, KeyError):
        return False


@pytest.fixture(scope="session")
def kafkajs_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for ``node tests/support/node/*.js``: KafkaJS on ``NODE_PATH``.

    Installed once per version into the cache. A failed install (no registry) fails
    the tests with npm's output rather than skipping them: with node and npm on the
    machine (CI installs both) a skip would hide that KafkaJS went untested, and once
    the cache holds the version no later run needs the registry, so this is not a
    brittleness of local runs.
    """
    need("node", "nodejs")
    npm = need("npm", "npm")
    prefix = _cache_root(tmp_path_factory) / f"kafkajs-{KAFKAJS_VERSION}"
    if not _installed(prefix):
        # Installed beside the cache entry, then renamed into place: a concurrent
        # session, or one killed halfway, never leaves a half-installed entry in use.
        staging = Path(tempfile.mkdtemp(prefix=f"{prefix.name}.", dir=prefix.parent))
        try:
            install = [npm, "install", "--prefix", str(staging), "--no-save"]
            quiet = ["--no-package-lock", "--no-audit", "--no-fund", "--ignore-scripts"]
            done = subprocess.run(
                [*install, *quiet, "--loglevel=error", f"kafkajs@{KAFKAJS_VERSION}"],
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT,
            )
            if done.returncode != 0 or not _installed(staging):
                pytest.fail(
                    f"npm install kafkajs@{KAFKAJS_VERSION} failed ({done.returncode}):\n"
                    f"{done.stdout}{done.stderr}",
                    pytrace=False,
                )
            if not _installed(prefix):
                shutil.rmtree(prefix, ignore_errors=True)
                try:
                    staging.rename(prefix)
                except OSError:  # another session renamed its own first
                    if not _installed(prefix):
                        raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {
        **os.environ,
        "NODE_PATH": str(prefix / "node_modules"),
        "KAFKAJS_NO_PARTITIONER_WARNING": "1",
    }


@pytest.fixture
def kafkajs(kafka_broker: BrokerThread, kafkajs_env: dict[str, str]) -> Callable[..., Events]:
    """``kafkajs(script, **args)``: run ``tests/support/node/<script>.js`` against the session
    broker with ``args`` (and ``bootstrap``); the JSON lines it printed."""

    def call(script: str, **args: Any) -> Events:
        argument = json.dumps({"bootstrap": kafka_broker.bootstrap, **args})
        node = need("node", "nodejs")
        done = run([node, str(NODE_SCRIPTS / f"{script}.js"), argument], env=kafkajs_env)
        return json_lines(done.stdout)

    return call


def test_kafkajs_produces_and_consumes_in_a_group_that_commits(
    kafka_broker: BrokerThread, kafkajs: Callable[..., Events]
) -> None:
    topic, group = name("kjs-group"), name("kjs-readers")
    kafka_broker.create_topic(topic, 3)
    keys = [f"key{i % 5}" for i in range(15)]
    events = kafkajs("group", topic=topic, group=group, keys=keys)
    consumed = [e for e in events if e["event"] == "consumed"]
    assert sorted(e["key"] for e in consumed) == sorted(keys)
    assert all(e["value"] == f"value-{e['key']}" for e in consumed)
    for key in set(keys):
        assert len({e["partition"] for e in consumed if e["key"] == key}) == 1
    ends = {o.tp: o.high_watermark for o in kafka_broker.offsets(topic)}
    assert sum(ends.values()) == len(keys)
    # Committed, as the client's admin fetched them and as the broker holds them.
    (committed,) = [e["offsets"] for e in events if e["event"] == "committed"]
    assert {TopicPartition(topic, int(p)): o for p, o in committed.items()} == ends
    assert kafka_broker.committed(group) == ends
    assert kafka_broker.group(group).state == "Empty"  # it left the group at disconnect


def test_kafkajs_idempotent_producer(
    kafka_broker: BrokerThread, kafkajs: Callable[..., Events]
) -> None:
    topic = name("kjs-idempotent")
    events = kafkajs("idempotent", topic=topic, sends=5, clientId="kafkajs-idempotent")
    assert [(e["partition"], e["offset"]) for e in events] == [(0, 2 * i) for i in range(5)]
    (offsets,) = kafka_broker.offsets(topic)
    assert (offsets.log_start, offsets.high_watermark) == (0, 10)
    assert 22 in negotiated(kafka_broker, "kafkajs-idempotent")  # InitProducerId


def test_kafkajs_transactions_read_committed_and_uncommitted(
    kafka_broker: BrokerThread, kafkajs: Callable[..., Events]
) -> None:
    topic, transactional_id = name("kjs-txn"), name("kjs-tx")
    events = kafkajs("transactions", topic=topic, transactionalId=transactional_id)
    assert [(e["event"], e["values"]) for e in events[:3]] == [
        ("commit", ["c1", "c2"]),
        ("abort", ["a1", "a2"]),
        ("commit", ["c3"]),
    ]
    reads = {e["readUncommitted"]: e["values"] for e in events[3:]}
    assert reads == {False: ["c1", "c2", "c3"], True: ["c1", "c2", "a1", "a2", "c3"]}
    # 5 records and a marker per transaction; nothing left open.
    (offsets,) = kafka_broker.offsets(topic)
    assert offsets.high_watermark == 8
    assert kafka_broker.last_stable_offset(topic) == 8
    transaction = kafka_broker.transaction(transactional_id)
    assert transaction.state == "CompleteCommit"
    assert not transaction.partitions


class LineReader:
    """A process's stdout lines through a thread, so that each read has a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.lines: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.put(line)

    def event(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"no line within {TIMEOUT:g} s") from None
        event: dict[str, Any] = json.loads(line)
        return event


@pytest.fixture
def node_process(
    kafkajs_env: dict[str, str],
) -> Iterator[Callable[[str, dict[str, Any]], subprocess.Popen[str]]]:
    """``node_process(script, args)``: a script with stdin and stdout piped, killed
    after the test if it is still running."""
    started: list[subprocess.Popen[str]] = []

    def start(script: str, args: dict[str, Any]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [need("node", "nodejs"), str(NODE_SCRIPTS / f"{script}.js"), json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=kafkajs_env,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_kafkajs_send_offsets_in_a_transaction_are_committed_at_commit_only(
    kafka_broker: BrokerThread,
    node_process: Callable[[str, dict[str, Any]], subprocess.Popen[str]],
) -> None:
    source, sink = name("kjs-in"), name("kjs-out")
    group, transactional_id = name("kjs-pipeline"), name("kjs-tx")
    kafka_broker.create_topic(source)
    process = node_process(
        "send_offsets",
        {
            "bootstrap": kafka_broker.bootstrap,
            "input": source,
            "output": sink,
            "group": group,
            "transactionalId": transactional_id,
        },
    )
    assert process.stdin is not None
    reader = LineReader(process)
    tp = TopicPartition(source, 0)
    for offset, end in [(2, "abort"), (3, "commit")]:
        # Mid-transaction: the offsets wait in the transaction, the group has none yet
        # (or the ones the previous transaction committed).
        assert reader.event() == {"event": "pending", "offset": offset, "committed": {"0": -1}}
        transaction = kafka_broker.transaction(transactional_id)
        assert transaction.state == "Ongoing"
        assert transaction.groups == {group}
        assert transaction.pending_offsets == {group: {tp: offset}}
        assert kafka_broker.committed(group) == {}
        process.stdin.write("\n")
        process.stdin.flush()
        ended = reader.event()
        assert (ended["event"], ended["offset"]) == (end, offset)
        expected = {tp: offset} if end == "commit" else {}
        assert kafka_broker.committed(group) == expected
        assert ended["committed"] == {"0": offset if end == "commit" else -1}
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert kafka_broker.transaction(transactional_id).state == "CompleteCommit"
    # The aborted record and the committed one, each followed by its marker.
    (offsets,) = kafka_broker.offsets(sink)
    assert offsets.high_watermark == kafka_broker.last_stable_offset(sink) == 4
