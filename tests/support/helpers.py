"""Operations the tests share."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import unittest
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import uvloop
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

import aiopurgatory as ap

R = TypeVar("R")


class Flag(ap.DelayedOperation[str]):
    """Completes when ``ready`` is set; records every hook call."""

    def __init__(self, timeout: float | None, ready: Callable[[], bool] = lambda: False) -> None:
        super().__init__(timeout)
        self.ready = ready
        self.checks = 0
        self.completions = 0
        self.expirations = 0

    def try_complete(self) -> bool:
        self.checks += 1
        return self.ready() and self.force_complete()

    def on_complete(self) -> str:
        self.completions += 1
        return "expired" if self.expired else "done"

    def on_expiration(self) -> None:
        assert self.expired, "on_expiration before expired was set"
        assert self.completions == 1, "on_expiration before on_complete"
        self.expirations += 1


class LoopMachine(RuleBasedStateMachine):
    """A state machine whose rules run on an event loop of its own."""

    uvloop = False

    def __init__(self) -> None:
        super().__init__()
        self.loop = uvloop.new_event_loop() if self.uvloop else asyncio.new_event_loop()

    def run(self, make: Callable[[], Awaitable[R]]) -> R:
        """Await ``make()`` on the machine's loop."""

        async def body() -> R:
            return await make()

        return self.loop.run_until_complete(body())

    def call(self, fn: Callable[[], R]) -> R:
        """Call ``fn`` from inside the machine's running loop."""

        async def body() -> R:
            return fn()

        return self.loop.run_until_complete(body())


def on_both_loops(
    machine: type[LoopMachine], config: settings
) -> tuple[type[unittest.TestCase], type[unittest.TestCase]]:
    """The machine's test cases on asyncio's default loop and on uvloop."""
    cases = []
    for use_uvloop in (False, True):
        name = machine.__name__ + ("Uvloop" if use_uvloop else "")
        variant: type[LoopMachine] = type(name, (machine,), {"uvloop": use_uvloop})
        case = variant.TestCase
        case.settings = config
        cases.append(case)
    return cases[0], cases[1]


@contextlib.contextmanager
def watchdog(seconds: float = 10.0) -> Iterator[None]:
    """Turn a frozen loop or a hung synchronous test into a failure (main thread only)."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"froze for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


REPLAYED = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
"""The same examples every run (derandomized, no example database), no deadline, slow
steps and filtered draws allowed: for state machines over a real broker."""


def run_derandomized(
    machine: type[RuleBasedStateMachine], *, max_examples: int, steps: int
) -> None:
    """Run ``machine`` on :data:`REPLAYED` settings with these sizes."""
    config = settings(REPLAYED, max_examples=max_examples, stateful_step_count=steps)
    run_state_machine_as_test(machine, settings=config)
