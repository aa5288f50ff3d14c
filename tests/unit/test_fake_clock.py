"""The fake clock's timers (tests/support/fakes.py), which every zero-time test of the master and
the hang watch relies on: due order, cancel, timers set by timers, the clock at each."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeClock

from trainguard.timers import LOOP_TIMERS, Timers


def test_timers_fire_in_due_order_with_the_clock_at_their_time() -> None:
    clock = FakeClock(100.0)
    fired: list[tuple[str, float]] = []
    clock.later(3, lambda: fired.append(("c", clock())))
    clock.later(1, lambda: fired.append(("a", clock())))
    clock.later(2, lambda: fired.append(("b", clock())))
    clock.later(2, lambda: fired.append(("b2", clock())))  # the same time: in the order set
    assert clock.advance(1.5) == 101.5
    assert fired == [("a", 101.0)]
    clock.advance(10)
    assert fired == [("a", 101.0), ("b", 102.0), ("b2", 102.0), ("c", 103.0)]
    assert clock() == 111.5 and clock.pending() == []


def test_nothing_fires_inside_later_nor_before_its_time() -> None:
    clock = FakeClock()
    fired: list[str] = []
    clock.later(0, lambda: fired.append("now"))
    clock.later(-5, lambda: fired.append("overdue"))  # due now, not in the past
    clock.later(1, lambda: fired.append("later"))
    assert fired == []
    clock.advance(0)
    assert fired == ["now", "overdue"]
    clock.advance(0.999)
    assert fired == ["now", "overdue"]
    clock.advance(0.001)
    assert fired == ["now", "overdue", "later"]


def test_a_cancelled_timer_never_fires() -> None:
    clock = FakeClock()
    fired: list[str] = []
    keep = clock.later(1, lambda: fired.append("kept"))
    gone = clock.later(1, lambda: fired.append("cancelled"))
    gone.cancel()
    assert clock.pending() == [clock() + 1]
    clock.advance(5)
    assert fired == ["kept"]
    keep.cancel()  # cancelling one that fired already changes nothing
    clock.advance(5)
    assert fired == ["kept"]


def test_a_timer_cancelled_by_an_earlier_one_in_the_same_advance_does_not_fire() -> None:
    clock = FakeClock()
    fired: list[str] = []
    second = clock.later(2, lambda: fired.append("second"))
    clock.later(1, second.cancel)
    clock.advance(3)
    assert fired == []


def test_timers_set_by_a_firing_timer_fire_in_the_same_advance_when_due() -> None:
    clock = FakeClock(0.0)
    fired: list[tuple[str, float]] = []

    def first() -> None:
        fired.append(("first", clock()))
        clock.later(1, lambda: fired.append(("nested", clock())))  # due at 2: fires
        clock.later(5, lambda: fired.append(("beyond", clock())))  # due at 6: waits

    clock.later(1, first)
    clock.later(2.5, lambda: fired.append(("other", clock())))
    clock.advance(3)
    assert fired == [("first", 1.0), ("nested", 2.0), ("other", 2.5)]
    assert clock.pending() == [6.0]
    clock.advance(3)
    assert fired[-1] == ("beyond", 6.0)


def test_time_runs_forward_only() -> None:
    clock = FakeClock(10.0)
    with pytest.raises(AssertionError, match="forward only"):
        clock.advance_to(9.0)


def test_the_loop_timers_fire_soon_after_and_never_inside_later() -> None:
    """Production's timers keep the promise the fake keeps (and the fake is a `Timers`:
    mypy checks the annotation below)."""
    fake: Timers = FakeClock()
    fake.later(0, lambda: None).cancel()

    async def scenario() -> list[str]:
        fired: list[str] = []
        LOOP_TIMERS.later(0.0, lambda: fired.append("soon"))
        LOOP_TIMERS.later(0.0, lambda: fired.append("cancelled")).cancel()
        assert fired == []  # never inside `later`
        await asyncio.sleep(0.01)
        return fired

    assert asyncio.run(scenario()) == ["soon"]
