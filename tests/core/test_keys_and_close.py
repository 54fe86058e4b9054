"""The keys an operation is watched under, however they are passed, and the error a
close leaves on the operations still pending (its message formatted when read).

Both builds run these (``AIOPURGATORY_NO_EXTENSIONS=1`` for the pure one): the short
paths for lists and tuples must watch exactly what the general path does.
"""

from __future__ import annotations

import asyncio
import gc
import pickle
import weakref
from collections.abc import Hashable, Iterable, Iterator

import pytest

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Weak(ap.DelayedOperation[bool]):
    """Never completes by itself; can be watched by a weak reference."""

    __slots__ = ("__weakref__",)

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> bool:
        return True


class Mine(Weak):
    """An operation with a repr of its own."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<mine>"


# -- keys -------------------------------------------------------------------------------


def generate(keys: Iterable[Hashable]) -> Iterator[Hashable]:
    yield from keys


@pytest.mark.parametrize("make", [list, tuple, generate, dict.fromkeys], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("keys", "unique"),
    [
        (["a"], ["a"]),
        (["b", "a"], ["b", "a"]),
        (["b", "a", "b", "c", "a"], ["b", "a", "c"]),
        ([1, 1.0, True], [1]),  # equal keys are one key, the first kept
        ([f"k{i}" for i in range(12)] + ["k0"], [f"k{i}" for i in range(12)]),
    ],
)
async def test_keys_are_watched_once_each_in_order(
    clock: ManualClock, make: type, keys: list[Hashable], unique: list[Hashable]
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(1.0), make(keys))
        assert p.keys() == unique
        assert p.watched() == len(unique)
        assert [p.watchers_of(key) for key in unique] == [1] * len(unique)
        assert p.check_and_complete(unique[-1]) == 0  # watched, re-checked
        assert op.checks == 2


async def test_a_list_changed_after_registration_changes_nothing(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        keys: list[Hashable] = ["a"]
        op = Flag(1.0)
        p.try_complete_else_watch(op, keys)
        keys[0] = "b"
        keys.append("c")
        assert p.keys() == ["a"]
        op.ready = lambda: True
        assert p.check_and_complete("a") == 1
        assert (p.num_delayed(), p.watched(), p.keys()) == (0, 0, [])


@pytest.mark.parametrize(
    "keys",
    [[[]], ([],), ["a", []], ("a", []), [[], "a", "a"], ("a", "b", []) * 4],
    ids=["list-of-one", "tuple-of-one", "small-list", "small-tuple", "list-dup", "long-tuple"],
)
@pytest.mark.parametrize("make", [list, tuple, generate], ids=lambda f: f.__name__)
async def test_an_unhashable_key_is_refused_before_anything_changes(
    clock: ManualClock, keys: Iterable[Hashable], make: type
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = Flag(1.0)
        with pytest.raises(TypeError, match=r"^key \[\] is not hashable$"):
            p.try_complete_else_watch(op, make(keys))
        assert (op.checks, op.done(), p.num_delayed(), p.watched()) == (0, False, 0, 0)
        p.try_complete_else_watch(op, ["a"])  # still new: it can be registered
        assert p.num_delayed() == 1


@pytest.mark.parametrize("keys", [[], (), iter([])], ids=["list", "tuple", "iterator"])
async def test_no_keys_is_refused(clock: ManualClock, keys: Iterable[Hashable]) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        with pytest.raises(ValueError, match="must not be empty"):
            p.try_complete_else_watch(Flag(1.0), keys)
        assert p.num_delayed() == 0


# -- the error a close leaves -------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0.25, 1e-7, 12345.678, None])
async def test_close_fails_pending_operations_with_the_message_of_their_repr(
    clock: ManualClock, timeout: float | None
) -> None:
    p = ap.Purgatory("orders", clock=clock)
    op = p.try_complete_else_watch(Weak(timeout), ["a"])
    await p.aclose()
    with pytest.raises(ap.PurgatoryClosed) as caught:
        op.result()
    error = caught.value
    expected = f"purgatory 'orders' closed before <Weak pending timeout={timeout!r}> completed"
    assert type(error) is ap.PurgatoryClosed
    assert isinstance(error, RuntimeError)
    assert str(error) == expected
    assert repr(error) == f"PurgatoryClosed({expected!r})"
    assert error.args == (expected,)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.args, str(copy)) == (ap.PurgatoryClosed, (expected,), expected)
    assert op.exception() is error
    assert op.outcome is ap.Outcome.CLOSED
    assert repr(op) == f"<Weak closed timeout={timeout!r}>"  # the message says: at close


async def test_close_formats_a_repr_of_the_users_own_at_once(clock: ManualClock) -> None:
    p = ap.Purgatory("p", clock=clock)
    op = p.try_complete_else_watch(Mine(1.0), ["a"])
    await p.aclose()
    error = op.exception()
    assert isinstance(error, ap.PurgatoryClosed)
    assert str(error) == "purgatory 'p' closed before <mine> completed"
    assert error.args == ("purgatory 'p' closed before <mine> completed",)


async def test_the_close_error_keeps_its_cause(clock: ManualClock) -> None:
    p = ap.Purgatory("p", clock=clock)
    op = p.try_complete_else_watch(Weak(1.0), ["a"])
    cause = asyncio.CancelledError()  # the timer task cancelled: closes, nothing reported
    p._timer_failed(cause)
    error = op.exception()
    assert isinstance(error, ap.PurgatoryClosed)
    assert error.__cause__ is cause
    assert "closed before <Weak pending timeout=1.0> completed" in str(error)


async def test_operations_closed_are_freed_without_the_cyclic_gc(clock: ManualClock) -> None:
    # The error's message must not refer back to its operation: the operation holds
    # the error, and every closed operation would wait for a collection.
    p = ap.Purgatory("p", clock=clock)
    ops = [p.try_complete_else_watch(Weak(1.0 + i), [i]) for i in range(100)]
    refs = [weakref.ref(op) for op in ops]
    gc.disable()
    try:
        await p.aclose()
        assert all(op.done() for op in ops)
        del ops
        assert [ref() for ref in refs] == [None] * 100
    finally:
        gc.enable()
