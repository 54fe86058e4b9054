"""The purgatory against a model: each operation finishes exactly once, rightly."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    invariant,
    precondition,
    rule,
)

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag, LoopMachine, on_both_loops

R = TypeVar("R")
KEYS = ["k0", "k1", "k2", "k3"]
TICK = 0.001
key_sets = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)
# Repeated values put operations in shared buckets, where arming bugs hide.
timeouts = st.one_of(st.none(), st.sampled_from([0.0, 0.001, 0.5, 1.5]), st.floats(0.0005, 2.0))


class Log:
    """An observer that keeps every finish it is told of."""

    def __init__(self) -> None:
        self.finished: list[tuple[ap.DelayedOperation[Any], ap.Outcome, float]] = []

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        self.finished.append((op, outcome, finished))


class PurgatoryMachine(LoopMachine):
    ops = Bundle("ops")

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.log = Log()
        self.purgatory = ap.Purgatory("model", clock=self.clock, observer=self.log)
        self.ready: dict[Flag, bool] = {}
        self.keys: dict[Flag, list[str]] = {}
        self.deadline: dict[Flag, float | None] = {}
        self.pending: set[Flag] = set()
        self.expected: dict[Flag, ap.Outcome] = {}
        self.order: list[Flag] = []  # registration order

    def finish(self, op: Flag, outcome: ap.Outcome) -> None:
        self.pending.discard(op)
        self.expected[op] = outcome

    # -- rules ------------------------------------------------------------------------

    @precondition(lambda self: not self.purgatory.closed)
    @rule(target=ops, keys=key_sets, timeout=timeouts, ready=st.booleans())
    def register(self, keys: list[str], timeout: float | None, ready: bool) -> Flag:
        op = Flag(timeout, lambda: self.ready[op])
        self.ready[op] = ready
        self.keys[op] = keys
        self.pending.add(op)
        self.order.append(op)
        self.call(lambda: self.purgatory.try_complete_else_watch(op, keys))
        assert op.created == self.clock.time()
        if ready:
            self.finish(op, ap.Outcome.COMPLETED)
        elif timeout == 0:
            self.finish(op, ap.Outcome.EXPIRED)
        self.deadline[op] = None if timeout is None else self.clock.time() + timeout
        return op

    @precondition(lambda self: not self.purgatory.closed)
    @rule(op=ops)
    def make_ready(self, op: Flag) -> None:
        self.ready[op] = True

    @precondition(lambda self: not self.purgatory.closed)
    @rule(key=st.sampled_from(KEYS))
    def check(self, key: str) -> None:
        expected = {op for op in self.pending if key in self.keys[op] and self.ready[op]}
        assert self.call(lambda: self.purgatory.check_and_complete(key)) == len(expected)
        for op in expected:
            self.finish(op, ap.Outcome.COMPLETED)

    @precondition(lambda self: not self.purgatory.closed)
    @rule(keys=key_sets)
    def notify(self, keys: list[str]) -> None:
        async def notify_and_wait() -> None:
            for key in keys:
                self.purgatory.notify(key)
            await asyncio.sleep(0)

        expected = {op for op in self.pending if self.ready[op] and set(keys) & set(self.keys[op])}
        self.run(notify_and_wait)
        for op in expected:
            self.finish(op, ap.Outcome.COMPLETED)

    @precondition(lambda self: not self.purgatory.closed)
    @rule(op=ops)
    def cancel(self, op: Flag) -> None:
        assert self.call(op.cancel) is (op in self.pending)
        if op in self.pending:
            self.finish(op, ap.Outcome.CANCELLED)

    @precondition(lambda self: not self.purgatory.closed)
    @rule(key=st.sampled_from(KEYS))
    def cancel_for_key(self, key: str) -> None:
        expected = {op for op in self.pending if key in self.keys[op]}
        cancelled = self.call(lambda: self.purgatory.cancel_for_key(key))
        assert set(cancelled) == expected
        for op in expected:
            self.finish(op, ap.Outcome.CANCELLED)

    @precondition(lambda self: not self.purgatory.closed)
    @rule(op=ops, timeout=timeouts)
    def reset_timeout(self, op: Flag, timeout: float | None) -> None:
        if op not in self.pending:
            return
        self.call(lambda: op.reset_timeout(timeout))
        if timeout == 0:
            self.finish(op, ap.Outcome.EXPIRED)
        self.deadline[op] = None if timeout is None else self.clock.time() + timeout

    @precondition(lambda self: not self.purgatory.closed)
    @rule(step=st.floats(0, 3.0))
    def advance(self, step: float) -> None:
        target = self.clock.time() + step
        self.run(lambda: self.clock.advance(step))
        for op in list(self.pending):
            deadline = self.deadline[op]
            if deadline is None:
                continue
            if deadline > target:
                assert not op.done(), "expired early"
            elif op.done():
                self.finish(op, ap.Outcome.EXPIRED)
            else:
                # Rounded up to the next tick; the clock stops at every wake-up.
                assert target < deadline + TICK, "more than one tick late"

    @precondition(lambda self: not self.purgatory.closed)
    @rule(expire=st.booleans())
    def close(self, expire: bool) -> None:
        outcome = ap.Outcome.EXPIRED if expire else ap.Outcome.CLOSED
        for op in list(self.pending):
            self.finish(op, outcome)
        self.call(lambda: self.purgatory.close(expire_pending=expire))
        self.call(lambda: self.purgatory.close())  # idempotent

    @precondition(lambda self: self.purgatory.closed)
    @rule(keys=key_sets)
    def use_after_close(self, keys: list[str]) -> None:
        op = Flag(1.0)
        with pytest.raises(ap.PurgatoryClosed):
            self.call(lambda: self.purgatory.try_complete_else_watch(op, keys))
        assert not op.done()
        assert op.checks == 0
        with pytest.raises(ap.PurgatoryClosed):
            self.call(lambda: self.purgatory.check_and_complete(keys[0]))

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def outcomes_are_right_and_exactly_once(self) -> None:
        logged = [op for op, _, _ in self.log.finished]
        assert len(logged) == len(set(logged)), "an operation finished twice"
        assert {op: outcome for op, outcome, _ in self.log.finished} == self.expected
        for op, outcome in self.expected.items():
            assert op.outcome is outcome
            ran = outcome in (ap.Outcome.COMPLETED, ap.Outcome.EXPIRED)
            assert op.completions == int(ran)
            assert op.expirations == int(outcome is ap.Outcome.EXPIRED)
        for done, outcome, finished in self.log.finished:
            assert isinstance(done, Flag)
            deadline = self.deadline.get(done)
            if outcome is ap.Outcome.EXPIRED and deadline is not None and not self.purgatory.closed:
                assert finished >= deadline, "expired before its deadline"

    @invariant()
    def counts_are_exact(self) -> None:
        stats = self.purgatory.stats
        assert stats.pending == len(self.pending) == self.purgatory.num_delayed()
        assert stats.watched == sum(len(set(self.keys[op])) for op in self.pending)
        for key in KEYS:
            watching = sum(1 for op in self.pending if key in self.keys[op])
            assert self.purgatory.watchers_of(key) == watching
        if not self.purgatory.closed:
            timed = sum(1 for op in self.pending if self.deadline[op] is not None)
            assert stats.timed == timed
        outcomes = list(self.expected.values())
        assert stats.completed == outcomes.count(ap.Outcome.COMPLETED)
        assert stats.expired == outcomes.count(ap.Outcome.EXPIRED)
        assert stats.cancelled == outcomes.count(ap.Outcome.CANCELLED)
        assert stats.closed == outcomes.count(ap.Outcome.CLOSED)

    @invariant()
    def every_key_lists_its_pending_watchers_oldest_first(self) -> None:
        # Whichever way they left (in the middle, first, last, from a key they shared
        # or watched alone), the rest keep their order: checks run oldest first.
        for key in KEYS:
            expected = [op for op in self.order if op in self.pending and key in self.keys[op]]
            assert self.purgatory._watching(key) == expected

    def teardown(self) -> None:
        self.call(self.purgatory.close)
        self.loop.close()


model_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPurgatoryModelAsyncio, TestPurgatoryModelUvloop = on_both_loops(
    PurgatoryMachine, model_settings
)
