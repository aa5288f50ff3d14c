"""The hang timer (R-HANG-1, R-HANG-2) on the fake clock: time moves only when a test
advances it, and a report comes exactly when it is due (zero real time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from fakes import FakeClock

from trainguard.hangs.watch import HangDetected, HangWatch
from trainguard.timers import LOOP_TIMERS, Timer, Timers


def _watch(
    interval: float,
    enabled: bool = True,
    output: list[float] | None = None,
    startup: float = 600.0,
    timers: Callable[[FakeClock], Timers] | None = None,
) -> tuple[HangWatch, list[HangDetected], FakeClock]:
    """A watch on a fake clock; `output[0]` is when the replicas printed last; `timers`:
    what sets its timers, given the clock (default: the clock itself)."""
    clock = FakeClock()
    seen: list[HangDetected] = []
    last = output if output is not None else [0.0]
    watch = HangWatch(
        enabled=enabled,
        interval_s=interval,
        post=seen.append,
        output_activity=lambda: last[0],
        clock=clock,
        startup_timeout_s=startup,
        timers=clock if timers is None else timers(clock),
    )
    return watch, seen, clock


def test_silence_for_the_interval_is_reported_once() -> None:
    watch, seen, clock = _watch(0.2)
    watch.arm(attempt=3)
    clock.advance(0.19)
    assert seen == []
    clock.advance(0.41)
    assert len(seen) == 1  # one report per attempt until the master re-arms
    assert (seen[0].kind, seen[0].attempt) == ("hang", 3)
    assert 0.2 <= seen[0].idle_s < 0.4
    assert seen[0].idle_s == pytest.approx(0.2)  # reported when due, not later
    assert clock.pending() == []  # and nothing left to look at


def test_output_keeps_the_job_alive() -> None:
    output = [0.0]
    watch, seen, clock = _watch(0.3, output=output)
    output[0] = clock()
    watch.arm(0)
    for _ in range(8):
        clock.advance(0.1)
        output[0] = clock()
    assert seen == []
    clock.advance(0.45)
    assert len(seen) == 1
    assert seen[0].idle_s == pytest.approx(0.3)


def test_heartbeats_count_and_record_steps() -> None:
    watch, seen, clock = _watch(0.3)
    watch.arm(0)
    for step in range(6):
        clock.advance(0.1)
        watch.beat("worker-0", step)
    assert seen == []
    assert [s for s, _ in watch.beats()["worker-0"]] == [0, 1, 2, 3, 4, 5]
    assert [t for _, t in watch.beats()["worker-0"]] == pytest.approx(
        [1000.1, 1000.2, 1000.3, 1000.4, 1000.5, 1000.6]
    )


def test_scopes_the_shortest_wins_and_off_wins_over_all() -> None:
    watch, _, _ = _watch(1800)
    assert watch.interval() == 1800
    watch.scope("worker-0", 180)
    watch.scope("worker-1", 60)
    assert watch.interval() == 60
    watch.scope("worker-1", -1)
    assert watch.interval() is None
    watch.scope("worker-1", None)
    assert watch.interval() == 180
    disabled, _, _ = _watch(1800, enabled=False)
    assert disabled.interval() is None
    disabled.scope("worker-0", 5)
    assert disabled.interval() == 5  # a scope turns detection on where it applies


def test_a_quiet_phase_inside_hang_detect_off_is_not_a_hang() -> None:
    watch, seen, clock = _watch(0.2)
    watch.arm(0)
    watch.scope("worker-0", -1)
    clock.advance(0.5)
    assert seen == [] and clock.pending() == []  # off: no timer at all
    watch.scope("worker-0", None)  # leaving the scope is a sign of life too
    clock.advance(0.1)
    assert seen == []
    clock.advance(0.1)
    assert [h.kind for h in seen] == ["hang"]  # the interval counts from leaving it


def test_disarmed_while_restarting_and_rearmed_after_a_stale_report() -> None:
    watch, seen, clock = _watch(0.1)
    watch.arm(0)
    watch.disarm()
    clock.advance(0.3)
    assert seen == []
    watch.arm(1)
    clock.advance(0.15)
    assert len(seen) == 1
    watch.rearm()
    clock.advance(0.15)
    assert len(seen) == 2
    assert [h.attempt for h in seen] == [1, 1]


def test_before_every_replica_shows_life_the_start_up_allowance_applies() -> None:
    watch, seen, clock = _watch(0.1, startup=0.5)
    watch.arm(0, ["worker-0", "worker-1"])
    clock.advance(0.3)
    assert seen == [] and watch.pending() == {"worker-0", "worker-1"}
    assert 0 < watch.startup_left() <= 0.5
    clock.advance(0.35)
    assert [h.kind for h in seen] == ["startup_hang"]  # nobody showed a sign of life
    assert seen[0].interval_s == 0.5  # the allowance is what ran out


def test_the_interval_counts_once_every_replica_has_shown_life() -> None:
    watch, seen, clock = _watch(0.2, startup=60)
    watch.alive("worker-0")  # printed before the attempt was armed: kept
    watch.arm(0, ["worker-0", "worker-1"])
    assert watch.pending() == {"worker-1"}
    clock.advance(0.4)
    assert seen == []  # worker-1 is still starting: the 60 s allowance holds
    watch.beat("worker-1", None)  # an SDK call is a sign of life too
    assert watch.pending() == frozenset() and watch.startup_left() == 0
    clock.advance(0.35)
    assert [h.kind for h in seen] == ["hang"]


def test_a_first_sign_of_life_sets_the_timer_again_only_when_it_was_the_last_awaited() -> None:
    """1,024 ranks' first lines (or a stop's exits) set the timer once, not 1,024 times:
    while others are awaited, the allowance's end stands; the last one ends the allowance."""
    set_at: list[float] = []

    class Counted:
        def __init__(self, clock: FakeClock) -> None:
            self.clock = clock

        def later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
            set_at.append(self.clock() + delay_s)
            return self.clock.later(delay_s, fn)

    watch, seen, clock = _watch(0.2, startup=60, timers=Counted)
    names = [f"worker-{i}" for i in range(100)]
    watch.arm(0, names)
    assert set_at == [pytest.approx(1060.0)]  # the allowance's end
    for name in names[:-1]:
        watch.alive(name)
    assert len(set_at) == 1 and clock.pending() == [pytest.approx(1060.0)]
    clock.advance(0.1)
    watch.alive(names[-1])  # the interval counts from now on
    assert len(set_at) == 2 and clock.pending() == [pytest.approx(1000.2)]
    clock.advance(0.15)
    assert [h.kind for h in seen] == ["hang"] and seen[0].idle_s == pytest.approx(0.2)


def test_a_silent_start_up_past_the_allowance_is_a_hang_when_one_replica_spoke() -> None:
    watch, seen, clock = _watch(0.2, startup=60)
    watch.arm(0, ["worker-0", "worker-1"])
    watch.alive("worker-0")
    clock.advance(59.9)
    assert seen == []
    clock.advance(0.2)
    assert [h.kind for h in seen] == ["hang"]  # not every replica was silent


def test_on_the_loop_timers_the_watch_reports_in_real_time() -> None:
    """Production's `LOOP_TIMERS`: the same watch on the event loop and the real clock."""

    async def scenario() -> list[HangDetected]:
        seen: list[HangDetected] = []
        watch = HangWatch(
            enabled=True,
            interval_s=0.05,
            post=seen.append,
            output_activity=lambda: 0.0,
            timers=LOOP_TIMERS,
        )
        watch.arm(0)
        await asyncio.sleep(0.02)
        assert seen == []
        await asyncio.sleep(0.2)
        return seen

    assert [h.kind for h in asyncio.run(scenario())] == ["hang"]


def test_a_replica_restarted_alone_is_starting_again() -> None:
    watch, _, _ = _watch(0.2, startup=30)
    watch.arm(0, ["worker-0"])
    watch.alive("worker-0")
    assert watch.startup_left() == 0
    watch.starting("worker-0")
    assert watch.pending() == {"worker-0"} and 29 < watch.startup_left() <= 30


def test_the_allowance_is_never_shorter_than_the_interval() -> None:
    watch, _, _ = _watch(5.0, startup=1.0)
    watch.arm(0, ["worker-0"])
    assert 4.9 < watch.startup_left() <= 5.0
