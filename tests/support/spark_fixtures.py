"""One Spark session per test session, for the tests marked ``spark``.

Import the fixture into a test module (``from tests.support.spark_fixtures import spark``).
The session is the embedded local one the command line uses, with a fast-start JVM
(quiet logs, its console output in a log file); tests are skipped when there is no Java.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from aiopurgatory.analysis.session import FAST_START_JVM_OPTIONS, find_java, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PANDAS_WARNINGS", "spark"]

PANDAS_WARNINGS = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]
"""PySpark 4.3 about pandas 3: it prefers pandas < 3 and calls a deprecated argument.
Add these to the ``pytestmark`` of a module whose tests run Spark."""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if find_java() is None:
        pytest.skip("Spark needs Java, and none is installed")
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    with spark_session(
        log_file=log, app_name="aiopurgatory-tests", java_options=FAST_START_JVM_OPTIONS
    ) as session:
        yield session
