"""A Faust app (faust-streaming) for the broker's tests (issue 48): an agent counting the
events of each key into a Table whose changelog is a compacted topic.

Run as a worker in a process of its own (Faust installs signal handlers and owns its
loop)::

    python -m tests.support.faust_app BOOTSTRAP DATADIR FACTS

It appends one JSON line to the file FACTS per fact a test reads (a file, not stdout:
Faust's worker sends stdout to its logger):

* ``{"recovered": {key: count, ...}}`` each time the table's recovery from its changelog
  completes (after every rebalance; the first start recovers nothing);
* ``{"key": key, "count": n}`` after each event counted.

SIGTERM stops it as Faust stops (the stream acked, offsets committed, the producer
flushed).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import faust

APP_ID = "faust-counter"
EVENTS = "faust-events"
PARTITIONS = 3
TABLE = "counts"
CHANGELOG = f"{APP_ID}-{TABLE}-changelog"  # Faust's name: {app id}-{table}-changelog
LEADER_TOPIC = f"{APP_ID}-__assignor-__leader"  # the assignor's, made by every worker


def make_app(bootstrap: str, datadir: str, facts: str) -> faust.App:
    """The app, on ``bootstrap`` (``host:port``), its data directory ``datadir``,
    appending its facts to the file ``facts``."""

    def emit(fact: dict[str, Any]) -> None:
        # One write per line, flushed: the test reads whole lines while this runs.
        with open(facts, "a", encoding="utf-8") as out:
            out.write(json.dumps(fact, sort_keys=True) + "\n")

    app = faust.App(
        APP_ID,
        broker=f"kafka://{bootstrap}",
        datadir=datadir,
        store="memory://",  # nothing on disk: a restart recovers from the changelog only
        web_enabled=False,  # and --without-web below
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        # One worker: a standby replica would be a second copy nobody reads.
        table_standby_replicas=0,
        # Faust's defaults are tuned for production; here they would make the test wait:
        # offsets are committed every 2.8 s, and the test waits to see the commit on the
        # broker before it stops the worker (a clean stop commits too; a worker killed
        # before its commit would count the same events again on restart). Not shorter:
        # at 0.1 s a loaded machine made Faust warn "Timer commit is overlapping" (a
        # commit took 0.18 s).
        broker_commit_interval=0.5,
        # A crashed worker's session would keep its partitions for 60 s; the test stops
        # the worker cleanly (LeaveGroup), so this bounds only a failure's cost.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
    )
    events = app.topic(
        EVENTS, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    counts = app.Table(TABLE, default=int, partitions=PARTITIONS)

    async def on_recovered() -> None:
        emit({"recovered": {str(key): int(value) for key, value in counts.items()}})

    counts.on_recover(on_recovered)

    async def count(stream: faust.StreamT[Any]) -> None:
        # stream.items(): (key, value). The table's key is the event's key, so each count
        # lives on the event's own partition (the changelog's partition of the same index).
        async for key, _ in stream.items():
            name = bytes(key).decode()
            counts[name] += 1
            emit({"key": name, "count": counts[name]})

    app.agent(events, name="count")(count)
    return app


def main(argv: list[str]) -> None:
    bootstrap, datadir, facts = argv
    app = make_app(bootstrap, datadir, facts)
    # Faust's command line (click) reads sys.argv: run its worker command, logging to
    # stderr at warning level (its info lines would be the test's noise). A Faust quirk:
    # the worker command sets web_enabled from its own --with-web/--without-web flag
    # (default: with), so the app's web_enabled=False alone still bound 0.0.0.0:6066.
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    app.main()


if __name__ == "__main__":
    main(sys.argv[1:])
