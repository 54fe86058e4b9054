"""The timing wheel as a plain data structure, against a dictionary model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from aiopurgatory.wheel import NO_EXPIRATION, TimerEntry, TimingWheel

YEAR_OF_MS = 365 * 24 * 3600 * 1000

# Offsets spanning level 0 up to overflow levels many years out (1 tick = 1 ms).
offsets = st.one_of(
    st.integers(1, 40),
    st.integers(1, 20_000),
    st.integers(1, 10 * YEAR_OF_MS),
)
steps = st.one_of(st.integers(0, 30), st.integers(0, 50_000), st.integers(0, 11 * YEAR_OF_MS))


class Entry(TimerEntry):
    __slots__ = ("name",)

    def __init__(self, name: int) -> None:
        super().__init__()
        self.name = name


class WheelMachine(RuleBasedStateMachine):
    """Random add / remove / reschedule / advance; every entry is reported due at the
    first advance at or after its deadline, never before, exactly once."""

    entries = Bundle("entries")

    def __init__(self) -> None:
        super().__init__()
        self.wheel = TimingWheel(wheel_size=8, start_tick=1_000)
        self.now = 1_000
        self.model: dict[Entry, int] = {}
        self.names = 0

    @rule(target=entries, offset=offsets)
    def add(self, offset: int) -> Entry:
        if not self.model:
            self.wheel.restart(self.now)
        self.names += 1
        entry = Entry(self.names)
        self.wheel.schedule(entry, self.now + offset)
        self.model[entry] = self.now + offset
        return entry

    @rule(entry=consumes(entries))
    def remove(self, entry: Entry) -> None:
        assert self.wheel.remove(entry) is (entry in self.model)
        self.model.pop(entry, None)
        assert not entry.scheduled

    @rule(entry=entries, offset=offsets)
    def reschedule(self, entry: Entry, offset: int) -> None:
        if entry not in self.model:
            return
        self.wheel.reschedule(entry, self.now + offset)
        self.model[entry] = self.now + offset

    @rule(step=steps, limit=st.sampled_from([1, 3, 64, 10**9]))
    def advance(self, step: int, limit: int) -> None:
        self.now += step
        due: list[TimerEntry] = []
        while not self.wheel.collect_due(self.now, due, limit):
            self.wheel.check_invariants()  # also between chunks
            # Mid-split or mid-drain too: every entry still linked is listed, once.
            listed = self.wheel.entries()
            assert len(listed) == len(set(listed)) == len(self.wheel)
        expected = {e for e, deadline in self.model.items() if deadline <= self.now}
        assert len(due) == len(set(due)), "an entry was reported twice"
        assert set(due) == expected
        for entry in due:
            assert isinstance(entry, Entry)
            assert entry.deadline_tick <= self.now, "reported before its deadline"
            assert not entry.scheduled
            del self.model[entry]
        # Deadline order within one advance.
        ticks = [e.deadline_tick for e in due]
        assert ticks == sorted(ticks)

    @invariant()
    def consistent(self) -> None:
        self.wheel.check_invariants()
        assert len(self.wheel) == len(self.model)
        listed = self.wheel.entries()
        assert len(listed) == len(self.model)
        assert set(listed) == set(self.model)
        assert self.wheel.heap_size <= self.wheel.num_levels * 8
        nxt = self.wheel.next_expiration()
        if self.model:
            assert nxt is not None
            assert nxt <= min(self.model.values()), "wake-up would come after a deadline"
        else:
            assert nxt is None


TestWheelModel = WheelMachine.TestCase
TestWheelModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_overflow_levels_are_created_on_demand() -> None:
    wheel = TimingWheel(wheel_size=20)
    assert wheel.num_levels == 1
    wheel.schedule(TimerEntry(), 19)
    assert wheel.num_levels == 1
    wheel.schedule(TimerEntry(), 20)
    assert wheel.num_levels == 2
    wheel.schedule(TimerEntry(), 10 * YEAR_OF_MS)
    assert wheel.num_levels == 9  # 20**9 ms > 10 years > 20**8 ms


def test_schedule_returns_when_a_new_bucket_needs_work() -> None:
    wheel = TimingWheel(wheel_size=20)
    assert wheel.schedule(TimerEntry(), 5) == 5
    assert wheel.schedule(TimerEntry(), 5) == NO_EXPIRATION
    # Level-1 bucket [40, 60): split a quarter of its span (5 ticks) ahead of 40.
    assert wheel.schedule(TimerEntry(), 45) == 35
    assert wheel.schedule(TimerEntry(), 59) == NO_EXPIRATION
    assert wheel.heap_size == 2


def test_schedule_rejects_a_deadline_not_after_now_and_double_scheduling() -> None:
    wheel = TimingWheel(wheel_size=4, start_tick=10)
    with pytest.raises(ValueError, match="not after now"):
        wheel.schedule(TimerEntry(), 10)
    entry = TimerEntry()
    wheel.schedule(entry, 11)
    with pytest.raises(ValueError, match="already scheduled"):
        wheel.schedule(entry, 12)
    with pytest.raises(ValueError, match="wheel_size"):
        TimingWheel(wheel_size=1)


def test_a_huge_bucket_drains_in_bounded_chunks() -> None:
    wheel = TimingWheel(wheel_size=20)
    entries = [TimerEntry() for _ in range(10_000)]
    for entry in entries:
        wheel.schedule(entry, 5_000)  # level-2 bucket [4800, 5200)
    due: list[TimerEntry] = []
    calls = 1
    while not wheel.collect_due(5_000, due, 1_000):
        calls += 1
    # Each entry moves three times: split to [5000, 5020), split to [5000], collected.
    assert calls == 30
    assert due == entries  # FIFO order survives the cascades
    assert len(wheel) == 0
    assert wheel.cascaded == 20_000


def test_coarse_buckets_are_split_ahead_so_their_first_tick_is_ready_in_time() -> None:
    wheel = TimingWheel(wheel_size=20)
    first, last = TimerEntry(), TimerEntry()
    wheel.schedule(last, 5_199)
    wheel.schedule(first, 5_000)  # both in level-2 bucket [4800, 5200)
    assert wheel.next_expiration() == 4_700  # a quarter of its span before 4800
    due: list[TimerEntry] = []
    assert wheel.collect_due(4_999, due, 10**9)  # split down to tick 5000, none due
    assert due == []
    assert wheel.next_expiration() == 5_000
    assert wheel.cascaded == 3  # first: twice; last: once so far
    wheel.collect_due(5_000, due, 1)  # one unit of work is enough: it is in place
    assert due == [first]
    wheel.check_invariants()


def test_postponing_keeps_the_entry_in_place_and_fires_at_the_new_deadline() -> None:
    wheel = TimingWheel(wheel_size=20)
    entry = TimerEntry()
    wheel.schedule(entry, 5)
    assert wheel.reschedule(entry, 300) == NO_EXPIRATION  # no relinking
    due: list[TimerEntry] = []
    assert wheel.collect_due(299, due, 100)
    assert due == []
    assert wheel.next_expiration() == 300
    wheel.collect_due(300, due, 100)
    assert due == [entry]


def test_an_entry_postponed_past_its_coarse_bucket_is_placed_afresh_by_the_split() -> None:
    # The split moves entries into finer buckets by their slot within the coarse one;
    # an entry postponed in place may lie beyond the coarse bucket's span.
    wheel = TimingWheel(wheel_size=20)
    stays, postponed = TimerEntry(), TimerEntry()
    wheel.schedule(stays, 45)  # level 1: the bucket of ticks 40-59
    wheel.schedule(postponed, 50)
    assert wheel.reschedule(postponed, 5_000) == NO_EXPIRATION  # still in 40-59
    due: list[TimerEntry] = []
    assert wheel.collect_due(45, due, 100)
    assert due == [stays]
    wheel.check_invariants()
    assert wheel.collect_due(4_999, due, 100)
    assert due == [stays]
    assert wheel.collect_due(5_000, due, 100)
    assert due == [stays, postponed]
    wheel.check_invariants()


def test_a_split_paused_by_its_work_limit_resumes_into_the_same_finer_buckets() -> None:
    wheel = TimingWheel(wheel_size=20)
    entries = [TimerEntry() for _ in range(40)]
    for i, entry in enumerate(entries):
        wheel.schedule(entry, 40 + i % 20)  # two per finer slot of the 40-59 bucket
    due: list[TimerEntry] = []
    assert not wheel.collect_due(40, due, 7)  # the split pauses after 7 moves
    wheel.check_invariants()
    while not wheel.collect_due(59, due, 7):
        pass
    assert sorted(e.deadline_tick for e in due) == sorted(e.deadline_tick for e in entries)
    assert [e.deadline_tick for e in due] == sorted(e.deadline_tick for e in due)
    assert len(wheel) == 0
    wheel.check_invariants()


def test_empty_buckets_left_by_removal_are_skipped_and_reusable() -> None:
    wheel = TimingWheel(wheel_size=20)
    first = TimerEntry()
    wheel.schedule(first, 7)
    wheel.remove(first)
    assert wheel.next_expiration() is None
    again = TimerEntry()
    assert wheel.schedule(again, 7) == 7  # pushed again: the bucket forgot 7
    assert wheel.next_expiration() == 7


def test_clamp_future_is_the_first_tick_schedule_accepts() -> None:
    wheel = TimingWheel(wheel_size=4, start_tick=100)
    assert wheel.now == 100
    assert wheel.clamp_future(150) == 150  # ahead: unchanged
    assert wheel.clamp_future(101) == 101
    assert wheel.clamp_future(100) == 101  # reached: the next tick
    assert wheel.clamp_future(0) == 101
    entry = TimerEntry()
    wheel.schedule(entry, wheel.clamp_future(7))
    assert entry.deadline_tick == 101
    with pytest.raises(ValueError, match="not after now"):
        wheel.schedule(TimerEntry(), 100)


def test_entries_lists_every_scheduled_entry_and_changes_nothing() -> None:
    wheel = TimingWheel(wheel_size=8)
    near, far, gone = Entry(1), Entry(2), Entry(3)
    wheel.schedule(near, 3)
    wheel.schedule(far, 10_000)  # an upper level
    wheel.schedule(gone, 5)
    wheel.remove(gone)
    assert sorted(e.name for e in wheel.entries()) == [1, 2]  # type: ignore[attr-defined]
    assert wheel.entries() is not wheel.entries()  # a new list each time
    assert len(wheel) == 2
    assert wheel.next_expiration() == 3
    wheel.check_invariants()
    assert TimingWheel(wheel_size=8).entries() == []
