"""Every async test runs on asyncio's default loop and on uvloop (anyio's plugin), in
asyncio's debug mode: a callback that blocks the loop is logged, and an exception
nobody retrieved (from a task or future the library made) fails the test that left it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop


def pytest_configure(config: pytest.Config) -> None:
    # Reports started by the tests do not write Spark's class archive (~180 MB, ~15 s
    # once) into the user's cache; tests/analysis/test_class_cache.py gives it a directory.
    os.environ.setdefault("AIOPURGATORY_SPARK_CLASS_CACHE", "off")
    # looptime's pytest_pyfunc_call asks the loop policy for the current loop before each
    # test. While set_event_loop() has never been called in the main thread, asyncio's
    # policy makes a new loop there and then, and nobody closes it: the cyclic GC later
    # finds it in whatever test it happens to run, and its __del__ fails on sockets
    # already closed (an unraisable exception, an error under -W error; seen when
    # tests/core/test_purgatory.py and tests/core/test_gc.py ran alone, in that order). Once
    # set_event_loop(None) has been called, the policy answers "no current event loop"
    # instead, which looptime takes as a test that is not its business.
    asyncio.set_event_loop(None)


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(
            ("asyncio", {"loop_factory": uvloop.new_event_loop, "debug": True}), id="uvloop"
        ),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    backend: tuple[str, dict[str, Any]] = request.param
    return backend


class _Unretrieved(logging.Handler):
    """Collects asyncio's "... exception was never retrieved" reports."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "never retrieved" in message:
            self.messages.append(message)


@pytest.fixture(autouse=True)
def no_unretrieved_exceptions() -> Iterator[None]:
    handler = _Unretrieved()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
        gc.collect()  # futures report an unretrieved exception when collected
    finally:
        logger.removeHandler(handler)
    assert not handler.messages, handler.messages
