"""The command line: ``python -m aiopurgatory.kafka`` and ``aiopurgatory kafka``.

Ground rules: parsing needs no kio (``--help`` works without the ``kafka`` extra); the
broker is imported when it is about to run. The first line printed is
``listening on HOST:PORT``; SIGINT or SIGTERM stops the broker, which then prints what
each client negotiated and how each purgatory's operations ended. What the user can
put right (an option, a missing extra, a port in use) is one line on stderr and a
non-zero status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import gc
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ._extra import KAFKA_EXTRA_HINT
from .limits import (
    DEFAULT_PARTITIONS,
    DEFAULT_REBALANCE_DELAY_MS,
    DEFAULT_REPLICAS,
    LIMIT_HELP,
    MAX_REPLICAS,
    REPLICA_LAG_SECONDS,
    Limits,
)
from .sasl import MECHANISMS, parse_user

if TYPE_CHECKING:
    from .broker import KafkaBroker

__all__ = ["CannotListen", "add_arguments", "main", "purgatory_summary", "run", "serve"]


GC_THRESHOLD: Final = (100_000, 50, 100)
"""The collector's thresholds of ``python -m aiopurgatory.kafka`` (the process is the
broker's own; :class:`KafkaBroker` in a test's process leaves them alone). Each parked
fetch lives until its max wait, long enough to be promoted to the oldest generation,
and 10,000 long-polling consumers hold a few hundred thousand objects (connections,
tasks, streams): at CPython's 700 10 10 the full collections walking them were about
30% of the broker's CPU (py-spy), and its CPU per answered empty fetch 76-83 us against
39-43 us with these, the RSS the same (bench/kafka-idle-gc-2026-11-26.json)."""


class CannotListen(Exception):
    """The broker could not listen where it was told: the one line the command prints."""


def cannot_listen(broker: KafkaBroker, exc: OSError) -> CannotListen:
    """Which address could not be listened on, and why, in one line (for a port in use,
    what to do instead: 9092, the default, is also a local Kafka's)."""
    nodes = broker.nodes
    # The nodes listen in order: the first without a server is the one that failed.
    failed = next((node for node, server in enumerate(nodes.servers) if server is None), 0)
    where = f"{nodes.host}:{nodes.ports[failed]}"
    if broker.node_count > 1:
        where += f" (node {failed})"
    if exc.errno == errno.EADDRINUSE:
        return CannotListen(f"{where} is in use (by a local Kafka?): --port 0 picks free ports")
    return CannotListen(f"cannot listen on {where}: {exc.strerror or exc}")


async def serve(args: argparse.Namespace, limits: Limits) -> None:
    """Run the broker until SIGINT or SIGTERM, then print what it served."""
    from .broker import KafkaBroker

    observer: Any = None
    recorder: Any = None
    if args.trace is not None:
        from aiopurgatory.trace import TraceRecorder

        recorder = TraceRecorder(args.trace, clock=asyncio.get_running_loop().time)
        observer = recorder
    broker = KafkaBroker(
        ssl_context=args.ssl_context,
        sasl_users=args.sasl_users,
        sasl_mechanisms=args.sasl_mechanism,
        host=args.host,
        port=args.port,
        nodes=args.nodes,
        partitions=args.partitions,
        replicas=args.replicas,
        replica_lag_time_max_ms=args.replica_lag_time_max_ms,
        follower_delay_ms=args.follower_delay_ms,
        limits=limits,
        advertised_host=args.advertised_host or args.host,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        log_cleanup_policy=args.log_cleanup_policy,
        observer=observer,
    )
    try:
        host, port = await broker.start()
    except OSError as exc:
        error = cannot_listen(broker, exc)
        await broker.aclose()  # the nodes that did listen
        raise error from None
    gc.set_threshold(*args.gc_threshold)
    # The handlers before the first line: a supervisor may send SIGTERM as soon as it
    # reads it, and the broker is to answer that with its summary, not die unreported.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if broker.node_count == 1:
        print(f"listening on {host}:{port}", flush=True)
    else:
        for node in range(broker.node_count):
            print(f"listening on {broker.node_address(node)} (node {node})", flush=True)
        print(f"bootstrap: {broker.bootstrap}", flush=True)
    if broker.security_protocol != "PLAINTEXT":
        print(f"security protocol: {broker.security_protocol}", flush=True)
    try:
        await stop.wait()
    finally:
        await broker.aclose()
        if recorder is not None:
            recorder.close()
        for (client, api_key, version), count in sorted(broker.negotiated.items()):
            print(f"negotiated: client={client!r} api={api_key} version={version} requests={count}")
        for line in purgatory_summary(broker):
            print(line)
        sys.stdout.flush()


def purgatory_summary(broker: KafkaBroker) -> list[str]:
    """One line per purgatory: how its delayed operations ended (``closed``: still
    parked when the broker stopped) and how late its timer ever ran."""
    purgatories = (
        broker.core.produce_purgatory,
        broker.core.fetch_purgatory,
        broker.groups.join_purgatory,
        broker.groups.heartbeat_purgatory,
        broker.transactions.purgatory,
    )
    lines = []
    for purgatory in purgatories:
        stats = purgatory.stats
        lines.append(
            f"purgatory: {stats.name} completed={stats.completed} expired={stats.expired} "
            f"cancelled={stats.cancelled} closed={stats.closed} "
            f"timer_lag_max_ms={stats.timer_lag_max * 1e3:.1f}"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The broker's options: ``python -m aiopurgatory.kafka`` and ``aiopurgatory kafka``."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        default=9092,
        help="node n listens on PORT + n; 0 picks free ports",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="brokers in this process, each on its own port: partitions' leaders and "
        "replicas and the coordinators are spread over them (default 1)",
    )
    parser.add_argument(
        "--advertised-host", help="the host clients are told to connect to (default --host)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help=f"of an auto-created topic (Kafka's num.partitions; default {DEFAULT_PARTITIONS})",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=DEFAULT_REPLICAS,
        help="replicas per partition, the leader included (default.replication.factor): on "
        "one node the followers are simulated in process, on several they are other nodes' "
        f"(default {DEFAULT_REPLICAS}: no followers)",
    )
    parser.add_argument(
        "--replica-lag-time-max-ms",
        type=int,
        default=round(REPLICA_LAG_SECONDS * 1000),
        help="a follower lagging this long leaves the ISR (replica.lag.time.max.ms; "
        f"default {round(REPLICA_LAG_SECONDS * 1000)})",
    )
    parser.add_argument(
        "--follower-delay-ms",
        type=int,
        default=0,
        help="each follower waits this long after a fetch that brought data",
    )
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=DEFAULT_REBALANCE_DELAY_MS,
        help="an empty group's first rebalance waits this long for more members "
        f"(default {DEFAULT_REBALANCE_DELAY_MS}, as Kafka's development server.properties; "
        "Kafka's built-in default is 3000)",
    )
    parser.add_argument(
        "--log-cleanup-policy",
        default="delete",
        help="a topic's cleanup.policy unless it sets one: delete, compact or "
        "compact,delete (Kafka's log.cleanup.policy; default delete)",
    )
    defaults = Limits()
    for field in dataclasses.fields(Limits):
        default = getattr(defaults, field.name)
        option = "--" + field.name.replace("_", "-")
        described = LIMIT_HELP.get(field.name)
        text = f"{described} (default {default})" if described else f"default {default}"
        parser.add_argument(option, type=type(default), default=default, help=text)
    parser.add_argument(
        "--tls",
        nargs=2,
        metavar=("CERT", "KEY"),
        help="listen with TLS: the certificate chain and its private key, PEM files",
    )
    parser.add_argument(
        "--sasl-user",
        action="append",
        metavar="NAME:PASSWORD",
        help="a SASL user (repeat for more): the listener then takes SASL only",
    )
    parser.add_argument(
        "--sasl-mechanism",
        action="append",
        choices=MECHANISMS,
        help="a SASL mechanism to enable (repeat for more; default all with --sasl-user)",
    )
    parser.add_argument("--trace", metavar="DIR", help="record every delayed operation here")
    parser.add_argument(
        "--gc-threshold",
        nargs=3,
        type=int,
        metavar=("G0", "G1", "G2"),
        default=list(GC_THRESHOLD),
        help="the cyclic collector's thresholds for the broker's process, each >= 1 "
        f"(gc.set_threshold; default {' '.join(map(str, GC_THRESHOLD))}, CPython's 700 10 10)",
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Check the parsed options (``parser.error`` on a bad one) and run the broker."""
    try:
        limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    except ValueError as exc:
        parser.error(str(exc))
    if not 1 <= args.replicas <= MAX_REPLICAS:
        parser.error(f"--replicas must be between 1 and {MAX_REPLICAS}")
    if any(threshold < 1 for threshold in args.gc_threshold):
        parser.error("--gc-threshold takes three integers >= 1")
    if not 1 <= args.nodes <= limits.max_nodes:
        parser.error(f"--nodes must be between 1 and {limits.max_nodes} (--max-nodes)")
    if args.nodes > 1 and args.replicas > args.nodes:
        parser.error("--replicas must be at most --nodes")
    if args.replica_lag_time_max_ms < 1:
        parser.error("--replica-lag-time-max-ms must be >= 1")
    if args.follower_delay_ms < 0:
        parser.error("--follower-delay-ms must be >= 0")
    policies = {item.strip() for item in args.log_cleanup_policy.split(",") if item.strip()}
    if not policies or not policies <= {"compact", "delete"}:
        parser.error("--log-cleanup-policy is delete, compact or compact,delete")
    if args.group_initial_rebalance_delay_ms < 0:
        parser.error("--group-initial-rebalance-delay-ms must be >= 0")
    if not 1 <= args.partitions <= limits.max_partitions:
        parser.error(f"--partitions must be between 1 and {limits.max_partitions}")
    args.ssl_context = None
    if args.tls is not None:
        from .tls import server_context

        try:
            args.ssl_context = server_context(*args.tls)
        except ValueError as exc:
            parser.error(f"--tls: {exc}")
    args.sasl_users = None
    if args.sasl_user:
        args.sasl_users = {}
        for text in args.sasl_user:
            try:
                name, password = parse_user(text)
            except ValueError as exc:
                parser.error(f"--sasl-user: {exc}")
            if name in args.sasl_users:
                parser.error(f"--sasl-user: {name!r} given twice")
            args.sasl_users[name] = password
        if len(args.sasl_users) > limits.max_sasl_users:
            parser.error(f"at most {limits.max_sasl_users} --sasl-user (--max-sasl-users)")
    elif args.sasl_mechanism:
        parser.error("--sasl-mechanism needs --sasl-user")
    if args.advertised_host is None and args.host in ("", "0.0.0.0", "::"):
        parser.error(
            "listening on every interface: say which host clients reach, --advertised-host"
        )
    try:
        import kio  # noqa: F401  (the message below rather than a traceback)
    except ImportError:
        parser.exit(2, f"{parser.prog}: {KAFKA_EXTRA_HINT}\n")
    logging.basicConfig(level=logging.WARNING)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args, limits))
    except CannotListen as exc:
        # Status 1, not argparse's 2: the options were right, the machine said no.
        parser.exit(1, f"{parser.prog}: {exc}\n")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m aiopurgatory.kafka [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m aiopurgatory.kafka",
        description="A Kafka-protocol broker on aiopurgatory, for tests.",
    )
    add_arguments(parser)
    run(parser.parse_args(argv), parser)
