"""The error the analysis raises for mistakes a user can make."""

from __future__ import annotations

import importlib

__all__ = ["AnalysisError", "spark_errors"]


class AnalysisError(Exception):
    """A problem with the input or the environment, told in one line.

    Missing or empty trace directories, malformed files and a missing Java runtime
    raise it; the command line prints its message and exits non-zero.
    """


def spark_errors() -> tuple[type[Exception], ...]:
    """The exceptions Spark calls raise for failures inside Spark (not in our code).

    Besides PySpark's own errors, a JVM error can surface as py4j's (classic PySpark).
    """
    from pyspark.errors import PySparkException

    try:  # py4j ships no type information; the class is all that is needed
        java_error: type[Exception] = importlib.import_module("py4j.protocol").Py4JError
    except ImportError:  # a Spark Connect client without py4j
        return (PySparkException,)
    return (PySparkException, java_error)
