"""What the purgatory and the timer leave for the cyclic GC: objects per registration
and expiry, pending timed operations and timer tasks hidden from it while they wait in
the wheel (compiled build), and finished ones collected.

Counts, not timings: net GC-tracked objects are counted with ``gc.get_objects()``
while the collector is disabled.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock
from aiopurgatory.timer import Timer, TimerTask, collectable

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


N = 2000
KEYS: tuple[Hashable, ...] = ("topic-1", "topic-2", "topic-3")


class Slotted(ap.DelayedOperation[bool]):
    """An operation with no ``__dict__``: the only tracked object a request makes."""

    __slots__ = ("__weakref__", "link", "ready")

    def __init__(self, timeout: float | None) -> None:
        super().__init__(timeout)
        self.ready = False
        self.link: object = None

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> bool:
        return not self.expired


@contextmanager
def tracked_growth() -> Iterator[Callable[[], int]]:
    """With the GC off, how many more objects it tracks than on entry."""
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        yield lambda: len(gc.get_objects()) - before - 1  # the list get_objects made
    finally:
        gc.enable()


async def test_registration_leaves_at_most_the_operation_tracked(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        p.try_complete_else_watch(Slotted(5.0), KEYS)  # binds the loop, starts the timer
        ops: list[Slotted] = []
        with tracked_growth() as growth:
            for _ in range(N):  # 3 distinct keys in a tuple: no copy of them
                ops.append(p.try_complete_else_watch(Slotted(5.0), KEYS))
            grown = growth()
        # Compiled, the pending timed operations are untracked too, and so are their
        # entries in the keys' shared watcher lists. Pure Python cannot untrack: there
        # each registration adds the operation and an entry per shared key, no more.
        tracked_ops = 0 if ap.COMPILED else N
        tracked_links = 0 if ap.COMPILED else N * len(KEYS)
        # Beyond those: the wheel's buckets and heap items, and the three lists.
        assert grown - tracked_ops - tracked_links <= 20
        assert sum(gc.is_tracked(op) for op in ops) == tracked_ops


async def test_shared_key_entries_are_tracked_as_their_operation_is(clock: ManualClock) -> None:
    # An entry in a shared key's watcher list follows its operation: hidden from the GC
    # with a timed one (compiled), visible with an untimed one, which only the purgatory
    # holds (so a purgatory dropped without closing stays collectable through it).
    async with ap.Purgatory("p", clock=clock) as p:
        timed = [p.try_complete_else_watch(Slotted(5.0), KEYS) for _ in range(3)]
        untimed = [p.try_complete_else_watch(Slotted(None), KEYS) for _ in range(3)]
        assert all(op._links is not None for op in timed + untimed)
        assert [gc.is_tracked(op._links) for op in timed] == [not ap.COMPILED] * 3
        assert all(gc.is_tracked(op._links) for op in untimed)
        # An operation whose timeout is reset to None leaves the timer, and only the
        # purgatory holds it: its entries are tracked again with it.
        timed[0].reset_timeout(None)
        assert gc.is_tracked(timed[0]._links)
        assert gc.is_tracked(timed[0])
        links = [op._links for op in timed + untimed]
        for op in timed + untimed:
            op.cancel()
            assert op._links is None
        assert p.watched() == 0
        assert p.keys() == []
        # Nothing else holds an entry that left (this list, the loop's name and the
        # call's argument are the three references): no cycle is left for the GC.
        assert [sys.getrefcount(link) for link in links] == [3] * len(links)


async def test_a_dropped_purgatory_with_untimed_operations_on_shared_keys_is_collected() -> None:
    p = ap.Purgatory("dropped")
    ops = [p.try_complete_else_watch(Flag(None), ["shared", "also-shared"]) for _ in range(10)]
    ops[0].link = p  # type: ignore[attr-defined]
    ref = weakref.ref(ops[5])
    del ops, p
    gc.collect()
    assert ref() is None


async def test_an_expiry_batch_leaves_nothing_tracked(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        p.try_complete_else_watch(Slotted(0.5), KEYS)
        await clock.advance(1.0)  # the first expiry's one-time set-up is not counted
        ops = [p.try_complete_else_watch(Slotted(1.0), KEYS) for _ in range(N)]
        with tracked_growth() as growth:
            await clock.advance(2.0)
            grown = growth()
        assert all(op.expired for op in ops)
        # Expired operations are tracked again (compiled) and nothing else is left.
        assert grown - (N if ap.COMPILED else 0) <= 20
        assert all(gc.is_tracked(op) for op in ops)


def _finish_by(path: str, p: ap.Purgatory, op: Slotted) -> Any:
    if path == "complete":
        op.ready = True
        return p.check_and_complete(KEYS[0])
    if path == "force":
        return op.force_complete()
    if path == "cancel":
        return op.cancel()
    if path == "close":
        return p.close()
    raise AssertionError(path)


@pytest.mark.parametrize("path", ["complete", "force", "cancel", "close", "expire"])
async def test_a_pending_timed_operation_is_untracked_until_it_finishes(
    clock: ManualClock, path: str
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slotted(1.0), KEYS)
        assert gc.is_tracked(op) is not ap.COMPILED
        if path == "expire":
            await clock.advance(1.0)
        else:
            _finish_by(path, p, op)
        assert op.done()
        assert gc.is_tracked(op)


async def test_an_operation_without_a_timeout_stays_tracked(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slotted(None), KEYS)
        assert gc.is_tracked(op)  # only the purgatory holds it: it must stay collectable
        timed = p.try_complete_else_watch(Slotted(1.0), KEYS)
        timed.reset_timeout(None)  # leaves the timer
        assert gc.is_tracked(timed)
        assert not timed.done()


async def test_tracked_again_before_the_hooks_run(clock: ManualClock) -> None:
    seen: list[bool] = []

    class Looking(Slotted):
        __slots__ = ()

        def on_complete(self) -> bool:
            seen.append(gc.is_tracked(self))
            return True

    async with ap.Purgatory("p", clock=clock) as p:
        p.try_complete_else_watch(Looking(1.0), KEYS)
        await clock.advance(1.0)
    assert seen == [True]


@pytest.mark.parametrize("path", ["complete", "cancel", "close", "expire"])
async def test_a_finished_operation_in_a_cycle_is_collected(clock: ManualClock, path: str) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slotted(1.0), KEYS)
        op.link = [op]  # a cycle through the operation
        ref = weakref.ref(op)
        del op
        gc.collect()
        assert ref() is not None  # pending: the purgatory holds it
        if path == "expire":
            await clock.advance(1.0)
        else:
            live = ref()
            assert live is not None
            _finish_by("force" if path == "complete" else path, p, live)
            del live
        gc.collect()
        assert ref() is None


async def test_a_pending_operation_keeps_what_it_references_alive(clock: ManualClock) -> None:
    class Payload:
        pass

    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slotted(1.0), KEYS)
        payload = Payload()
        payload_ref = weakref.ref(payload)
        op.link = [payload, op]  # reachable only through the (untracked) operation
        del payload, op
        gc.collect()
        assert payload_ref() is not None
        await clock.advance(1.0)
        gc.collect()
        assert payload_ref() is None


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")
def test_a_run_that_ends_with_timed_operations_pending_releases_them() -> None:
    refs: list[weakref.ref[Slotted]] = []

    async def main() -> None:
        p = ap.Purgatory("never-closed")  # the loop's clock, never closed
        for _ in range(100):
            op = p.try_complete_else_watch(Slotted(3600.0), KEYS)
            op.link = [op, p]
            refs.append(weakref.ref(op))
        await asyncio.sleep(0)

    asyncio.run(main())  # cancels the timer task, which closes the purgatory
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0


async def test_a_dropped_purgatory_with_untimed_operations_is_collected() -> None:
    p = ap.Purgatory("dropped")
    ops = [p.try_complete_else_watch(Flag(None), ["k", i]) for i in range(10)]
    for op in ops:
        op.link = p  # type: ignore[attr-defined]
    ref = weakref.ref(ops[0])
    del ops, op, p
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize(
    ("keys", "unique"),
    [
        (("a", "b", "a"), ("a", "b")),
        ((1, 1.0, True, 2), (1, 2)),  # equal keys, as a dict sees them
        (("a", "b", "c"), ("a", "b", "c")),
        ((*range(9), 0), tuple(range(9))),  # longer than the pairwise check
    ],
)
async def test_duplicate_keys_in_a_tuple_are_watched_once(
    clock: ManualClock, keys: tuple[Hashable, ...], unique: tuple[Hashable, ...]
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slotted(1.0), keys)
        assert op.num_keys == len(unique)
        assert p.watched() == len(unique)
        assert [p.watchers_of(key) for key in unique] == [1] * len(unique)


async def test_an_unhashable_key_in_a_small_tuple_is_refused(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        with pytest.raises(TypeError, match=r"key \[\] is not hashable"):
            p.try_complete_else_watch(Slotted(1.0), ("a", []))  # type: ignore[arg-type]
        assert (p.num_delayed(), p.watched()) == (0, 0)


# -- the timer: what waits in its wheel is hidden from the GC (compiled build) --------


class Task(TimerTask):
    """A timer task that records whether the GC tracked it when its hook ran."""

    __slots__ = ("__weakref__", "hook", "link", "seen")

    def __init__(self, hook: Callable[[], object] = lambda: None) -> None:
        super().__init__()
        self.hook = hook
        self.link: object = None
        self.seen: list[bool] = []

    def _timer_fired(self) -> None:
        self.seen.append(gc.is_tracked(self))
        self.hook()


@pytest.mark.parametrize("path", ["cancel", "fire", "reset_to_now", "close"])
async def test_a_timer_task_is_untracked_while_it_waits_in_the_wheel(
    clock: ManualClock, path: str
) -> None:
    timer = Timer(clock, name="gc")
    task = Task()
    assert gc.is_tracked(task)
    timer.add(task, 1.0)
    assert gc.is_tracked(task) is not ap.COMPILED  # pure Python cannot untrack
    timer.reset(task, 5.0)  # moved within the wheel: still waiting
    assert gc.is_tracked(task) is not ap.COMPILED
    if path == "cancel":
        assert timer.cancel(task)
    elif path == "fire":
        await clock.advance(5.0)
        assert task.seen == [True]  # tracked again before its hook ran
    elif path == "reset_to_now":
        timer.reset(task, 0.0)
        assert task.seen == [True]
    else:
        timer.close()
    assert gc.is_tracked(task)
    timer.close()
    await timer.wait_closed()


@pytest.mark.parametrize("path", ["cancel", "fire", "close"])
async def test_a_cycle_through_a_timer_task_is_collected_once_it_leaves(
    clock: ManualClock, path: str
) -> None:
    timer = Timer(clock, name="gc")
    task = Task()
    task.link = [task]
    ref = weakref.ref(task)
    timer.add(task, 1.0)
    del task
    gc.collect()
    live = ref()
    assert live is not None  # waiting: the timer holds it
    if path == "cancel":
        timer.cancel(live)
    elif path == "fire":
        await clock.advance(1.0)
    else:
        timer.close()
    del live
    gc.collect()
    assert ref() is None
    timer.close()
    await timer.wait_closed()


async def test_a_task_cancelled_in_the_batch_that_collected_it_is_tracked(
    clock: ManualClock,
) -> None:
    timer = Timer(clock, name="gc")
    second = Task()
    seen: list[bool] = []

    def cancel_second() -> None:
        assert not timer.cancel(second)  # collected as due: no longer in the wheel
        seen.append(gc.is_tracked(second))

    first = Task(cancel_second)
    timer.add(first, 1.0)
    timer.add(second, 1.0)  # the same tick: one batch, first then second
    await clock.advance(1.0)
    assert first.seen == [True]
    assert seen == [True]
    assert second.seen == []  # cancelled: never fired
    timer.close()
    await timer.wait_closed()


async def test_closing_in_a_batch_makes_the_rest_of_it_collectable(clock: ManualClock) -> None:
    timer = Timer(clock, name="gc")
    rest = [Task() for _ in range(3)]
    first = Task(timer.close)
    timer.add(first, 1.0)
    for task in rest:
        timer.add(task, 1.0)
    await clock.advance(1.0)
    assert first.seen == [True]
    assert all(task.seen == [] for task in rest)  # closed before their turn
    assert all(gc.is_tracked(task) for task in rest)
    await timer.wait_closed()


async def test_an_operation_finished_in_the_batch_that_collected_it_is_tracked_for_its_hooks(
    clock: ManualClock,
) -> None:
    seen: list[bool] = []

    class Looking(Slotted):
        __slots__ = ("other",)

        def __init__(self, timeout: float, other: Slotted | None) -> None:
            super().__init__(timeout)
            self.other = other

        def on_complete(self) -> bool:
            seen.append(gc.is_tracked(self))
            if self.other is not None:
                self.other.force_complete()  # due in this batch, not fired yet
            return True

    async with ap.Purgatory("p", clock=clock) as p:
        second = Looking(1.0, None)
        first = Looking(1.0, second)
        p.try_complete_else_watch(first, KEYS)
        p.try_complete_else_watch(second, KEYS)
        await clock.advance(1.0)
        assert first.expired
        assert not second.expired  # completed by first's hook before its own expiry
        assert seen == [True, True]


def test_collectable_leaves_a_tracked_task_and_none_alone() -> None:
    task = Task()
    collectable(task)  # never in a timer: tracked, and stays so
    assert gc.is_tracked(task)
    collectable(None)  # type: ignore[arg-type]  # not a crash in either build
