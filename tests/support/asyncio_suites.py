"""Run CPython's own ``test.test_asyncio`` suites on the stock loop or the wheel loop.

Used by tests/loop/test_loop.py and tests/core/test_timeouts.py (and by hand): ``python -m
tests.support.asyncio_suites MODE OUT MODULE...`` with MODE ``stock``, ``wheel`` or
``timeouts`` runs the named suites of the running interpreter, unmodified, and writes
``{test id: outcome}`` as JSON to OUT.

In timeouts mode the stock loop runs, and ``asyncio.timeout`` and ``asyncio.timeout_at``
are the wheel timeouts of a purgatory made for each loop (``Purgatory.timeout``): the
suites' ``async with asyncio.timeout(...)`` tests them, and so does ``asyncio.wait_for``
from 3.12 on, which is built on ``asyncio.timeouts.timeout``.

In wheel mode the wheel loop's class is swapped in where the suites get their loops: the selector
tests build ``asyncio.SelectorEventLoop(selector)`` at call time, the others ask the
default policy (its ``_loop_factory``), and the virtual-time tests build
``test_utils.TestLoop``, which becomes its wheel subclass too. Tests that build
``base_events.BaseEventLoop`` directly run the base loop in both modes.
"""

from __future__ import annotations

import asyncio
import asyncio.unix_events
import json
import sys
import unittest
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiopurgatory.timeouts import Timeout

USED = {"loops": 0, "wakeups": 0, "test_loops": 0, "test_wakeups": 0, "timeouts": 0, "expired": 0}
"""Wheel loops made and wheel wake-ups (due alarms) on them in wheel mode, wheel timeouts
made and those that expired in timeouts mode: proof the swap took."""


def swap_in_wheel_loop() -> type[object]:
    from aiopurgatory import loop as apl

    cls = apl.wheel_loop_class(asyncio.SelectorEventLoop)
    base_init, base_due = cls.__init__, cls._wheel_due

    def counted_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        USED["loops"] += 1
        base_init(self, *args, **kwargs)

    # Counted where no caller's frame is added (a wrapper of call_at would change the
    # handles' source tracebacks, which test_events checks).
    def counted_due(self):  # type: ignore[no-untyped-def]
        USED["wakeups"] += 1
        base_due(self)

    cls.__init__ = counted_init
    cls._wheel_due = counted_due
    # The suites' virtual-time loop (test_utils.TestLoop, a BaseEventLoop subclass that
    # overrides call_at to record each deadline) gets the wheel too.
    from test.test_asyncio import utils as test_utils  # type: ignore[import-not-found]

    test_cls = apl.wheel_loop_class(test_utils.TestLoop)
    test_init, test_due = test_cls.__init__, test_cls._wheel_due

    def counted_test_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        USED["test_loops"] += 1
        test_init(self, *args, **kwargs)

    def counted_test_due(self):  # type: ignore[no-untyped-def]
        USED["test_wakeups"] += 1
        test_due(self)

    test_cls.__init__ = counted_test_init
    test_cls._wheel_due = counted_test_due
    test_utils.TestLoop = test_cls
    asyncio.SelectorEventLoop = cls
    asyncio.unix_events.SelectorEventLoop = cls
    asyncio.unix_events._UnixDefaultEventLoopPolicy._loop_factory = cls  # type: ignore[attr-defined]
    if hasattr(asyncio, "EventLoop"):  # 3.13: the platform's loop class, by another name
        setattr(asyncio, "EventLoop", cls)  # noqa: B010  # no such name in 3.11's stubs
        setattr(asyncio.unix_events, "EventLoop", cls)  # noqa: B010
    return cls


def swap_in_wheel_timeouts() -> list[Timeout]:
    """``asyncio.timeout`` and ``timeout_at`` become a purgatory's, one purgatory per loop
    (made on first use, closed with its loop); returns the list of timeouts made."""
    import asyncio.timeouts
    import weakref

    import aiopurgatory as ap

    purgatories: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ap.Purgatory] = (
        weakref.WeakKeyDictionary()
    )
    made: list[Timeout] = []

    def purgatory() -> ap.Purgatory:
        loop = asyncio.get_running_loop()
        found = purgatories.get(loop)
        if found is None:
            found = purgatories[loop] = ap.Purgatory(f"suite-{len(purgatories)}")
        return found

    def timeout(delay: float | None) -> Timeout:
        made.append(t := purgatory().timeout(delay))
        return t

    def timeout_at(when: float | None) -> Timeout:
        made.append(t := purgatory().timeout_at(when))
        return t

    for module in (asyncio, asyncio.timeouts):
        setattr(module, "timeout", timeout)  # noqa: B010  # typed as asyncio's
        setattr(module, "timeout_at", timeout_at)  # noqa: B010
    return made


class _Recorder(unittest.TextTestResult):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.outcomes: dict[str, str] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.outcomes[test.id()] = "pass"

    def addFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addFailure(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "fail"

    def addError(self, test: unittest.TestCase, err: object) -> None:
        super().addError(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "error"

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skip"

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addExpectedFailure(test, err)  # type: ignore[arg-type]
        self.outcomes[test.id()] = "xfail"

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "xpass"

    def addSubTest(self, test, subtest, err):  # type: ignore[no-untyped-def]
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.outcomes[test.id()] = "fail"


def main(argv: list[str]) -> int:
    mode, out, *modules = argv
    made: list[Timeout] = []
    if mode == "wheel":
        swap_in_wheel_loop()
    elif mode == "timeouts":
        made = swap_in_wheel_timeouts()
    elif mode != "stock":
        raise SystemExit(f"mode must be stock, wheel or timeouts, got {mode!r}")
    suite = unittest.defaultTestLoader.loadTestsFromNames(
        [f"test.test_asyncio.{m}" for m in modules]
    )
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=0, stream=sys.stderr)
    result = runner.run(suite)
    outcomes = result.outcomes  # type: ignore[attr-defined]
    USED["timeouts"] = len(made)
    USED["expired"] = sum(1 for t in made if t.expired())
    with open(out, "w") as f:
        json.dump({"outcomes": outcomes, "used": USED}, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
