"""The purgatory under hostile hooks, checked against invariants on asyncio and uvloop.

Operations whose hooks raise (``Exception`` or ``CancelledError``), lie about
completing, or re-enter the purgatory (cancel, force-complete or reset another
operation, close it), an observer that raises, and timeouts no clock reaches, all
drawn at random. Whatever happens, every operation finishes exactly once, the way its
own hooks dictate, never before its deadline, and the counts stay exact.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import LoopMachine, on_both_loops

R = TypeVar("R")
KEYS = ["k0", "k1", "k2"]
TICK = 0.001
FAULTS = st.sampled_from([None, None, "error", "cancel"])
timeouts = st.one_of(
    st.none(),
    st.sampled_from([0.0, 0.001, 0.5, 1.0, 1e30, 1.8e305, 1.7976931348623157e308]),
    st.floats(0.0005, 2.0),
)
actions = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["cancel", "force", "reset"]), st.integers(0, 50), timeouts),
    st.tuples(st.just("close"), st.booleans(), st.none()),
)


class HookError(Exception):
    """What the hostile hooks raise."""


def fault(kind: str | None) -> None:
    if kind == "error":
        raise HookError(kind)
    if kind == "cancel":
        raise asyncio.CancelledError(kind)


class Hostile(ap.DelayedOperation[str]):
    def __init__(
        self,
        machine: HostileMachine,
        timeout: float | None,
        *,
        check_fault: str | None,
        lies: bool,
        complete_fault: str | None,
        expire_fault: str | None,
        action: tuple[str, object, float | None] | None,
    ) -> None:
        super().__init__(timeout)
        self.machine = machine
        self.check_fault = check_fault
        self.lies = lies
        self.complete_fault = complete_fault
        self.expire_fault = expire_fault
        self.action = action
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.check_raised = False

    def try_complete(self) -> bool:
        if not self.ready:
            return False
        if self.check_fault is not None:
            self.check_raised = True
            fault(self.check_fault)
        completed = self.force_complete()
        return completed and not self.lies

    def on_complete(self) -> str:
        self.completions += 1
        if self.action is not None:
            self.machine.perform(self.action)
        fault(self.complete_fault)
        return "expired" if self.expired else "done"

    def on_expiration(self) -> None:
        self.expirations += 1
        fault(self.expire_fault)


class Log:
    def __init__(self, machine: HostileMachine) -> None:
        self.machine = machine
        self.finished: list[tuple[ap.DelayedOperation[Any], ap.Outcome, float]] = []

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        self.finished.append((op, outcome, finished))
        fault(self.machine.observer_fault)


class HostileMachine(LoopMachine):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, context: self.errors.append(context))
        self.clock = ManualClock()
        self.log = Log(self)
        self.observer_fault: str | None = None
        self.purgatory = ap.Purgatory("hostile", clock=self.clock, observer=self.log)
        self.ops: list[Hostile] = []
        self.keys: dict[Hostile, list[str]] = {}
        self.deadline: dict[Hostile, float | None] = {}

    def set_deadline(self, op: Hostile, timeout: float | None) -> None:
        self.deadline[op] = None if timeout is None else self.clock.time() + timeout

    def perform(self, action: tuple[str, object, float | None]) -> None:
        """A hook re-entering the purgatory."""
        what, arg, timeout = action
        if what == "close":
            self.purgatory.close(expire_pending=bool(arg))
            return
        if not self.ops:
            return
        assert isinstance(arg, int)
        target = self.ops[arg % len(self.ops)]
        if what == "cancel":
            target.cancel()
        elif what == "force":
            target.force_complete()
        elif not target.done():
            target.reset_timeout(timeout)
            self.set_deadline(target, timeout)

    # -- rules ------------------------------------------------------------------------

    @precondition(lambda self: not self.purgatory.closed)
    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
        timeout=timeouts,
        ready=st.booleans(),
        check_fault=FAULTS,
        lies=st.booleans(),
        complete_fault=FAULTS,
        expire_fault=FAULTS,
        action=actions,
    )
    def register(
        self,
        keys: list[str],
        timeout: float | None,
        ready: bool,
        check_fault: str | None,
        lies: bool,
        complete_fault: str | None,
        expire_fault: str | None,
        action: tuple[str, object, float | None] | None,
    ) -> None:
        op = Hostile(
            self,
            timeout,
            check_fault=check_fault,
            lies=lies,
            complete_fault=complete_fault,
            expire_fault=expire_fault,
            action=action,
        )
        op.ready = ready
        self.ops.append(op)
        self.keys[op] = keys
        self.set_deadline(op, timeout)
        self.call(lambda: self.purgatory.try_complete_else_watch(op, keys))
        if ready or timeout == 0:
            assert op.done()

    @precondition(lambda self: not self.purgatory.closed and self.ops)
    @rule(index=st.integers(0, 50))
    def make_ready(self, index: int) -> None:
        self.ops[index % len(self.ops)].ready = True

    @precondition(lambda self: not self.purgatory.closed)
    @rule(key=st.sampled_from(KEYS), limit=st.sampled_from([None, 1, 2]))
    def check(self, key: str, limit: int | None) -> None:
        completed = self.call(lambda: self.purgatory.check_and_complete(key, limit=limit))
        assert 0 <= completed <= (limit or len(self.ops))

    @precondition(lambda self: not self.purgatory.closed)
    @rule(key=st.sampled_from(KEYS))
    def notify(self, key: str) -> None:
        async def notify_and_wait() -> None:
            self.purgatory.notify(key)
            await asyncio.sleep(0)

        self.run(notify_and_wait)

    @precondition(lambda self: not self.purgatory.closed and self.ops)
    @rule(index=st.integers(0, 50))
    def cancel(self, index: int) -> None:
        op = self.ops[index % len(self.ops)]
        was_pending = not op.done()
        assert self.call(op.cancel) is was_pending

    @precondition(lambda self: not self.purgatory.closed and self.ops)
    @rule(index=st.integers(0, 50), timeout=timeouts)
    def reset_timeout(self, index: int, timeout: float | None) -> None:
        op = self.ops[index % len(self.ops)]
        if op.done():
            with pytest.raises(asyncio.InvalidStateError):
                op.reset_timeout(timeout)
            return
        self.set_deadline(op, timeout)
        self.call(lambda: op.reset_timeout(timeout))

    @rule(fault=FAULTS)
    def observer_faults(self, fault: str | None) -> None:
        self.observer_fault = fault

    @precondition(lambda self: not self.purgatory.closed)
    @rule(step=st.floats(0, 2.5))
    def advance(self, step: float) -> None:
        target = self.clock.time() + step
        self.run(lambda: self.clock.advance(step))
        if self.purgatory.closed:
            return
        for op in self.ops:
            deadline = self.deadline[op]
            if not op.done() and deadline is not None:
                assert target < deadline + TICK, "more than one tick late"

    @precondition(lambda self: not self.purgatory.closed)
    @rule(expire=st.booleans())
    def close(self, expire: bool) -> None:
        self.call(lambda: self.purgatory.close(expire_pending=expire))

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def every_operation_finished_once_as_its_hooks_say(self) -> None:
        logged = [op for op, _, _ in self.log.finished]
        assert len(logged) == len(set(logged)), "an operation finished twice"
        outcome_of = {op: outcome for op, outcome, _ in self.log.finished}
        for op in self.ops:
            assert (op in outcome_of) is op.done()
            if not op.done():
                continue
            assert outcome_of[op] is op.outcome
            assert op.completions <= 1
            assert op.expirations == int(op.expired and op.completions == 1)
            if op.completions == 0:
                assert op.outcome is not ap.Outcome.EXPIRED
                if op.outcome is ap.Outcome.CLOSED:
                    assert isinstance(op.exception(), ap.PurgatoryClosed)
                continue
            # on_complete ran: its fault (or on_expiration's) decides the result.
            first = op.complete_fault or (op.expire_fault if op.expired else None)
            if first == "cancel":
                assert op.cancelled()
                with pytest.raises(asyncio.CancelledError):
                    op.result()
            elif first == "error":
                assert op.outcome is (ap.Outcome.EXPIRED if op.expired else ap.Outcome.COMPLETED)
                with pytest.raises(HookError):
                    op.result()
            else:
                assert op.result() == ("expired" if op.expired else "done")

    @invariant()
    def nothing_expired_early(self) -> None:
        for op, outcome, finished in self.log.finished:
            assert isinstance(op, Hostile)
            deadline = self.deadline[op]
            if op.expired and deadline is not None and not self.purgatory.closed:
                assert outcome is not ap.Outcome.CLOSED
                assert finished >= deadline, "expired before its deadline"

    @invariant()
    def counts_are_exact(self) -> None:
        pending = [op for op in self.ops if not op.done()]
        stats = self.purgatory.stats
        assert stats.pending == len(pending) == self.purgatory.num_delayed()
        assert stats.watched == sum(len(set(self.keys[op])) for op in pending)
        for key in KEYS:
            watching = sum(1 for op in pending if key in self.keys[op])
            assert self.purgatory.watchers_of(key) == watching
        assert stats.timed <= len(pending)
        outcomes = [op.outcome for op in self.ops if op.done()]
        assert stats.completed == outcomes.count(ap.Outcome.COMPLETED)
        assert stats.expired == outcomes.count(ap.Outcome.EXPIRED)
        assert stats.cancelled == outcomes.count(ap.Outcome.CANCELLED)
        assert stats.closed == outcomes.count(ap.Outcome.CLOSED)
        if self.purgatory.closed:
            assert not pending
            assert stats.timed == 0

    @invariant()
    def only_injected_faults_are_reported(self) -> None:
        for context in self.errors:
            assert isinstance(context.get("exception"), HookError | asyncio.CancelledError), context

    def teardown(self) -> None:
        self.call(self.purgatory.close)
        self.loop.run_until_complete(self.purgatory.aclose())
        self.loop.close()


hostile_settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestHostileAsyncio, TestHostileUvloop = on_both_loops(HostileMachine, hostile_settings)
