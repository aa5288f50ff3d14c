"""The hang timer (R-HANG-1, R-HANG-2) in a real event loop, with short intervals."""

from __future__ import annotations

import asyncio
import time

from trainguard.hangs.watch import HangDetected, HangWatch


def _watch(
    interval: float,
    enabled: bool = True,
    output: list[float] | None = None,
    startup: float = 600.0,
) -> tuple[HangWatch, list[HangDetected]]:
    seen: list[HangDetected] = []
    last = output if output is not None else [0.0]
    watch = HangWatch(
        enabled=enabled,
        interval_s=interval,
        post=seen.append,
        output_activity=lambda: last[0],
        startup_timeout_s=startup,
    )
    return watch, seen


async def _run_for(watch: HangWatch, seconds: float) -> None:
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(seconds)
    task.cancel()


def test_silence_for_the_interval_is_reported_once() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.2)
        watch.arm(attempt=3)
        t0 = time.time()
        await _run_for(watch, 0.6)
        assert len(seen) == 1  # one report per attempt until the master re-arms
        assert (seen[0].kind, seen[0].attempt) == ("hang", 3)
        assert 0.2 <= seen[0].idle_s < 0.4 and time.time() - t0 >= 0.2

    asyncio.run(scenario())


def test_output_keeps_the_job_alive() -> None:
    async def scenario() -> None:
        output = [time.time()]
        watch, seen = _watch(0.3, output=output)
        watch.arm(0)
        task = asyncio.create_task(watch.run())
        for _ in range(8):
            await asyncio.sleep(0.1)
            output[0] = time.time()
        assert seen == []
        await asyncio.sleep(0.45)
        task.cancel()
        assert len(seen) == 1

    asyncio.run(scenario())


def test_heartbeats_count_and_record_steps() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.3)
        watch.arm(0)
        task = asyncio.create_task(watch.run())
        for step in range(6):
            await asyncio.sleep(0.1)
            watch.beat("worker-0", step)
        task.cancel()
        assert seen == []
        assert [s for s, _ in watch.beats()["worker-0"]] == [0, 1, 2, 3, 4, 5]

    asyncio.run(scenario())


def test_scopes_the_shortest_wins_and_off_wins_over_all() -> None:
    watch, _ = _watch(1800)
    assert watch.interval() == 1800
    watch.scope("worker-0", 180)
    watch.scope("worker-1", 60)
    assert watch.interval() == 60
    watch.scope("worker-1", -1)
    assert watch.interval() is None
    watch.scope("worker-1", None)
    assert watch.interval() == 180
    disabled, _ = _watch(1800, enabled=False)
    assert disabled.interval() is None
    disabled.scope("worker-0", 5)
    assert disabled.interval() == 5  # a scope turns detection on where it applies


def test_a_quiet_phase_inside_hang_detect_off_is_not_a_hang() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.2)
        watch.arm(0)
        watch.scope("worker-0", -1)
        await _run_for(watch, 0.5)
        assert seen == []
        watch.scope("worker-0", None)  # leaving the scope is a sign of life too
        await _run_for(watch, 0.1)
        assert seen == []

    asyncio.run(scenario())


def test_disarmed_while_restarting_and_rearmed_after_a_stale_report() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.1)
        watch.arm(0)
        watch.disarm()
        await _run_for(watch, 0.3)
        assert seen == []
        watch.arm(1)
        await _run_for(watch, 0.15)
        assert len(seen) == 1
        watch.rearm()
        await _run_for(watch, 0.15)
        assert len(seen) == 2

    asyncio.run(scenario())


def test_before_every_replica_shows_life_the_start_up_allowance_applies() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.1, startup=0.5)
        watch.arm(0, ["worker-0", "worker-1"])
        await _run_for(watch, 0.3)
        assert seen == [] and watch.pending() == {"worker-0", "worker-1"}
        assert 0 < watch.startup_left() <= 0.5
        await _run_for(watch, 0.35)
        assert [h.kind for h in seen] == ["startup_hang"]  # nobody showed a sign of life

    asyncio.run(scenario())


def test_the_interval_counts_once_every_replica_has_shown_life() -> None:
    async def scenario() -> None:
        watch, seen = _watch(0.2, startup=60)
        watch.alive("worker-0")  # printed before the attempt was armed: kept
        watch.arm(0, ["worker-0", "worker-1"])
        assert watch.pending() == {"worker-1"}
        await _run_for(watch, 0.4)
        assert seen == []  # worker-1 is still starting: the 60 s allowance holds
        watch.beat("worker-1", None)  # an SDK call is a sign of life too
        assert watch.pending() == frozenset() and watch.startup_left() == 0
        await _run_for(watch, 0.35)
        assert [h.kind for h in seen] == ["hang"]

    asyncio.run(scenario())


def test_a_replica_restarted_alone_is_starting_again() -> None:
    watch, _ = _watch(0.2, startup=30)
    watch.arm(0, ["worker-0"])
    watch.alive("worker-0")
    assert watch.startup_left() == 0
    watch.starting("worker-0")
    assert watch.pending() == {"worker-0"} and 29 < watch.startup_left() <= 30


def test_the_allowance_is_never_shorter_than_the_interval() -> None:
    watch, _ = _watch(5.0, startup=1.0)
    watch.arm(0, ["worker-0"])
    assert 4.9 < watch.startup_left() <= 5.0
