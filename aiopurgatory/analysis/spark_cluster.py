"""A Spark standalone cluster on loopback, started from the pyspark distribution.

``python -m aiopurgatory.analysis.spark_cluster`` (what ``make cluster-demo`` runs) starts a
master and one worker with pyspark's own ``spark-class``, writes a synthetic trace
(or takes ``--trace DIR``), runs ``aiopurgatory report TRACE --master spark://...`` as a
separate process against it, and stops both processes, also on failure. The tests
use :func:`standalone_cluster` the same way.

The executors are plain Spark JVMs: the job uses only the DataFrame API, so they need
nothing of this package (the demo points their Python at a path that does not exist
to prove it: a Python UDF would fail there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiopurgatory.analysis.errors import AnalysisError

__all__ = [
    "NO_PYTHON",
    "Cluster",
    "free_port",
    "main",
    "spark_home",
    "standalone_cluster",
]

NO_PYTHON: Final = "/nonexistent/python-for-executors"
"""Given to executors as their Python: the job must never start a Python worker."""
START_TIMEOUT: Final = 120.0


@dataclass(frozen=True, slots=True)
class Cluster:
    """A running standalone master and worker."""

    master_url: str
    """``spark://127.0.0.1:PORT``"""
    web_url: str
    """The master's web UI (its ``/json`` lists the workers)."""
    spark_home: Path
    env: dict[str, str]
    """The environment the cluster runs in (``SPARK_HOME``, ``SPARK_LOCAL_IP``, ...)."""
    logs: Path
    pids: tuple[int, ...]
    """The master's and the worker's process ids (each leads its own process group)."""


def spark_home() -> Path:
    """The pyspark package directory: a Spark distribution (``bin/spark-class`` etc.)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cluster_environment(home: Path, work: Path) -> dict[str, str]:
    """The environment for spark-class, spark-submit and drivers of this cluster."""
    conf = work / "conf"  # empty: no spark-defaults.conf or spark-env.sh from elsewhere
    conf.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(work / "local"),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work),
    }
    env.pop("SPARK_REMOTE", None)
    return env


def _wait(what: str, ready: Iterator[bool], process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    for ok in ready:
        if ok:
            return
        if process.poll() is not None:
            raise AnalysisError(f"the {what} exited with status {process.returncode} (see {log})")
        if time.monotonic() > deadline:
            raise AnalysisError(f"the {what} did not start within {START_TIMEOUT:g} s (see {log})")
        time.sleep(0.25)


def _port_open(port: int) -> Iterator[bool]:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            yield False
        else:
            yield True


def _alive_workers(web_url: str) -> Iterator[bool]:
    while True:
        try:
            with urllib.request.urlopen(f"{web_url}/json", timeout=2) as response:
                state = json.load(response)
        except (OSError, ValueError):
            yield False
        else:
            yield int(state.get("aliveworkers", 0)) >= 1


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group started for ``process``, SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


@contextmanager
def standalone_cluster(work: Path, *, cores: int = 2, memory: str = "1g") -> Iterator[Cluster]:
    """A master and one worker on 127.0.0.1 (free ports, state under ``work``).

    Both are stopped on exit, also when starting them or the body fails.
    """
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    env = cluster_environment(home, work)
    logs = Path(env["SPARK_LOG_DIR"])
    logs.mkdir(parents=True, exist_ok=True)
    port, web = free_port(), free_port()
    master_url, web_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}"

    def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(spark_class), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        stack.callback(_stop, process)
        return process, log

    with ExitStack() as stack:
        master, log = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web)),
        )
        _wait("Spark master", _port_open(port), master, log)
        worker, log = start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            master_url,
            *("--host", "127.0.0.1", "--port", str(free_port())),
            *("--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory),
            *("--work-dir", env["SPARK_WORKER_DIR"]),
        )
        _wait("Spark worker", _alive_workers(web_url), worker, log)
        yield Cluster(master_url, web_url, home, env, logs, (master.pid, worker.pid))


def report_on(
    cluster: Cluster, traces: Sequence[str], out: Path, *, submit: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the report on ``cluster``: ``aiopurgatory report --master`` or ``spark-submit``.

    Executors get a Python that does not exist (a Python UDF would fail).
    """
    env = {**cluster.env, "PYSPARK_PYTHON": NO_PYTHON, "PYSPARK_DRIVER_PYTHON": sys.executable}
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, os.environ.get("PYTHONPATH", "")] if p
    )
    if submit:
        command = [
            str(cluster.spark_home / "bin" / "spark-submit"),
            *("--master", cluster.master_url),
            *("--conf", "spark.executor.memory=1g", "--conf", "spark.sql.shuffle.partitions=2"),
            str(Path(__file__).with_name("submit.py")),
            *("report", *traces, "--out", str(out)),
        ]
    else:
        command = [
            sys.executable,
            *("-m", "aiopurgatory", "report", *traces),
            *("--master", cluster.master_url, "--out", str(out)),
        ]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiopurgatory.analysis.spark_cluster",
        description="Start a Spark standalone master and worker on loopback, run the report"
        " on them (aiopurgatory report --master spark://...), stop them.",
    )
    parser.add_argument("--trace", metavar="DIR", help="trace directory (default: synthetic)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="synthetic trace rows")
    parser.add_argument("--out", type=Path, default=Path("cluster-report"), metavar="DIR")
    parser.add_argument("--submit", action="store_true", help="use spark-submit instead")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aiopurgatory-cluster-") as work:
        trace = args.trace
        if trace is None:
            from aiopurgatory.analysis.synthetic import generate_trace

            trace = str(generate_trace(Path(work) / "trace", args.rows))
            print(f"synthetic trace: {args.rows:,} rows")
        with standalone_cluster(Path(work) / "cluster") as cluster:
            print(f"master {cluster.master_url} (web UI {cluster.web_url}), one worker")
            done = report_on(cluster, [trace], args.out, submit=args.submit)
        sys.stderr.write(done.stderr)
        sys.stdout.write(done.stdout)
        print("cluster stopped")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
