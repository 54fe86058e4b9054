"""Getting a Spark session: Spark Connect, the active one, or an embedded local one.

Order of preference:

1. ``SPARK_REMOTE=sc://host:port`` set: a Spark Connect session (needs
   ``pip install 'pyspark[connect]'``, no local Java).
2. A session already active in this process (a notebook), or the job was started by
   ``spark-submit --master ...``: that session, with spark-submit's settings.
3. Otherwise a new session on ``master`` (default ``local[*]``). A local master gets
   settings for a small machine: no UI, few shuffle partitions, a fast-starting JVM,
   loopback networking and this interpreter for Python workers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from aiopurgatory.analysis.class_cache import ClassArchive
from aiopurgatory.analysis.errors import AnalysisError, spark_errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "FAST_START_JVM_OPTIONS",
    "JVM_OPTIONS",
    "LOCAL_CONFIG",
    "check_environment",
    "find_java",
    "local_cores",
    "spark_session",
]

JVM_OPTIONS: Final = "-XX:+UseSerialGC -XX:-UsePerfData"
"""A serial collector (fewest threads) for a small machine."""
FAST_START_JVM_OPTIONS: Final = f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1"
"""For many small jobs (tests): the quick JIT tier only. It starts faster but runs a
10M-row trace about a third slower, so it is not the default."""

LOCAL_CONFIG: Final = {
    # The job's shuffles carry small partial aggregates: one partition per core
    # (spark.sql.shuffle.partitions and spark.default.parallelism, set from the master).
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}

_JVM_EXIT_TIMEOUT: Final = 120.0
"""Seconds to wait for the driver JVM to write its class archive and exit."""

_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])


def check_environment() -> None:
    """Fail early, in one line, if Spark cannot run here (no Java for a local Spark)."""
    if os.environ.get("SPARK_REMOTE"):
        return
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise AnalysisError(
            "the analysis needs PySpark: install the analysis extra"
            " (pip install '.[analysis]' in a checkout)"
        ) from exc
    if SparkSession.getActiveSession() is None and find_java() is None:
        raise AnalysisError(
            "Spark needs Java 17 or later, and none was found: install a JDK"
            " (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )


def find_java() -> str | None:
    """The ``java`` Spark would run (``$JAVA_HOME/bin/java``, else on ``PATH``)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home, "bin", "java")
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


@contextmanager
def spark_session(
    *,
    master: str | None = None,
    log_file: Path | None = None,
    app_name: str = "aiopurgatory",
    java_options: str = JVM_OPTIONS,
    event_log: Path | None = None,
    class_cache: Path | None = None,
) -> Iterator[SparkSession]:
    """A Spark session for the job; one this function started is stopped on exit.

    With ``log_file``, a JVM started here writes its console output (startup notices,
    log4j, task failures) there instead of this process's stderr. ``java_options`` are
    the driver JVM's flags when a local master is started here. With ``event_log``, a
    session started here writes Spark's event log (stage and task times) into that
    directory (see :mod:`aiopurgatory.analysis.eventlog`). With ``class_cache``, a local
    driver JVM started here maps the class-data-sharing archive kept in that directory,
    or writes it when there is none (see :mod:`aiopurgatory.analysis.class_cache`).
    """
    # PySpark warns on every pandas conversion that it prefers pandas < 3; the
    # conversions this package makes are tested with the pandas it runs with.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        local = remote.startswith("local")  # pyspark starts a Spark Connect server here
        if local:
            _prepare_local_environment()
        with _stderr_to(log_file if local else None):
            session = _connect(remote, app_name)
        yield session
        return
    check_environment()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Under spark-submit: its JVM is running, with the master and settings it was given.
        session = SparkSession.builder.appName(app_name).getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        yield session
        return
    master = master or "local[*]"
    archive = None
    if class_cache is not None and master.startswith("local"):
        archive = _class_archive(class_cache, java_options)
        if archive is not None:
            java_options = f"{java_options} {archive.java_options()}".strip()
    session = _start(master, log_file, app_name, java_options, event_log)
    try:
        yield session
    finally:
        session.stop()
        if archive is not None and archive.dumping:
            _stop_gateway()
            archive.finish()


def _class_archive(directory: Path, java_options: str) -> ClassArchive | None:
    """The archive for a JVM this process is about to launch, or None if it reuses one."""
    from pyspark import SparkContext

    java = find_java()
    if SparkContext._gateway is not None or java is None:
        return None  # a JVM from an earlier session in this process: flags no longer apply
    try:
        return ClassArchive(directory, java, java_options)
    except OSError:
        return None


def _stop_gateway() -> None:
    """End the driver JVM this process launched, and wait for it (it writes its archive).

    PySpark keeps the JVM until the interpreter exits; it exits when its stdin closes.
    A later session in this process launches a new one.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=_JVM_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()  # its archive is then incomplete and not used
            process.wait()


def _connect(remote: str, app_name: str) -> SparkSession:
    try:
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    except ImportError as exc:
        raise AnalysisError(
            f"SPARK_REMOTE={remote} needs the Spark Connect client: pip install 'pyspark[connect]'"
        ) from exc


def _start(
    master: str,
    log_file: Path | None,
    app_name: str,
    java_options: str,
    event_log: Path | None = None,
) -> SparkSession:
    from pyspark.sql import SparkSession

    local = master.startswith("local")
    if local:
        _prepare_local_environment()
    builder = SparkSession.builder.master(master).appName(app_name)
    if local:
        cores = str(local_cores(master))
        for key, value in {
            **LOCAL_CONFIG,
            "spark.sql.shuffle.partitions": cores,
            "spark.default.parallelism": cores,
        }.items():
            builder = builder.config(key, value)
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        for key, value in {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_log.resolve().as_uri(),
            "spark.eventLog.compress": "false",  # plain JSON lines, one file
            "spark.eventLog.rolling.enabled": "false",
        }.items():
            builder = builder.config(key, value)
    try:
        with _stderr_to(log_file):
            session = builder.getOrCreate()
    except spark_errors() as exc:
        where = f" (see {log_file})" if log_file is not None else ""
        raise AnalysisError(f"could not start Spark on {master}{where}: {exc}") from exc
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_cores(master: str) -> int:
    """The worker threads of a ``local``, ``local[N]`` or ``local[*]`` master."""
    match = re.match(r"^local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$", master.strip())
    if match is None or match.group(1) in (None, "*"):
        return 1 if master.strip() == "local" else max(1, os.cpu_count() or 1)
    return max(1, int(match.group(1)))


def _prepare_local_environment() -> None:
    """Environment for a Spark started from here: loopback, this Python, this package."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers import aiopurgatory (the sweep's simulations) even when it runs
    # from a source checkout rather than an installed package.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _PACKAGE_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [_PACKAGE_ROOT, *paths] if p)


@contextmanager
def _stderr_to(log_file: Path | None) -> Iterator[None]:
    """Point file descriptor 2 at ``log_file`` while a JVM is spawned (it inherits it)."""
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)
