"""The policy simulator (bench/simulate.py): a seeded failure schedule through the real
policy, in simulated time. Small runs only: the default 30-day job has ~160 failures."""

from __future__ import annotations

import importlib.util
import math
import sys
from types import ModuleType

import pytest
from conftest import ROOT

from trainguard.spec.models import ExecutionMode

BENCH = ROOT / "bench" / "simulate.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("simulate", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sim = load_bench()
SYNC, ASYNC = ExecutionMode.SYNC, ExecutionMode.ASYNC


def parts(r: object) -> float:
    """What a result's wall time was spent on, added up (it must be all of it)."""
    return float(
        sum(
            getattr(r, name)
            for name in (
                "productive_s",
                "checkpoint_s",
                "redone_s",
                "restart_s",
                "replica_restart_s",
            )
        )
    )


def test_same_seed_same_result_and_another_seed_differs() -> None:
    ft = sim.fault_tolerance(SYNC, "unlimited")
    a = sim.simulate(sim.Setup(seed=7), ft, 3600)
    assert a == sim.simulate(sim.Setup(seed=7), ft, 3600)
    assert a != sim.simulate(sim.Setup(seed=8), ft, 3600)
    assert a.failures > 100 and a.job_restarts == a.failures and a.ended is None
    assert a.wall_s == 30 * sim.DAY_S
    assert parts(a) == pytest.approx(a.wall_s)


def test_without_failures_the_ratio_is_one_minus_cost_over_interval() -> None:
    setup = sim.Setup(replica_mtbf_s=math.inf, duration_s=10 * sim.DAY_S, checkpoint_cost_s=120)
    r = sim.simulate(setup, sim.fault_tolerance(SYNC, "unlimited"), 3600)
    assert r.failures == 0
    assert r.ratio == pytest.approx(1 - 120 / 3600)
    assert r.checkpoint_s == pytest.approx(240 * 120)
    assert sim.expected_ratio(setup, 3600, SYNC) == pytest.approx(1 - 120 / 3600)


def test_young_interval_beats_a_badly_chosen_one_and_agrees_with_the_closed_form() -> None:
    setup = sim.Setup()
    ft = sim.fault_tolerance(SYNC, "unlimited")
    young = sim.young_interval_s(setup.checkpoint_cost_s, setup.job_mtbf_s)
    assert young == pytest.approx(math.sqrt(2 * 120 * 5 * sim.YEAR_H * 3600 / 10_000))
    for seed in range(3):
        s = sim.Setup(seed=seed)
        good, hourly = sim.simulate(s, ft, young), sim.simulate(s, ft, 3600)
        bad = sim.simulate(s, ft, 12 * 3600)
        assert good.ratio > bad.ratio + 0.1
        assert good.ratio >= hourly.ratio - 0.01
        assert good.ratio == pytest.approx(sim.expected_ratio(s, young, SYNC), abs=0.03)
        assert bad.redone_s > good.redone_s


def test_a_permanent_error_ends_the_job_with_failjob_and_says_why() -> None:
    setup = sim.Setup(mix=sim.parse_mix("segv=0.9,bug=0.1"), seed=1)
    r = sim.simulate(setup, sim.fault_tolerance(SYNC, "unlimited"), 3600)
    assert r.ended is not None and r.ended.startswith("FailJob")
    assert "not retryable" in r.ended and "KeyError: 'lr'" in r.ended
    assert r.wall_s < setup.duration_s
    assert r.job_restarts == r.failures - 1  # every failure before the bug restarted the job
    assert parts(r) == pytest.approx(r.wall_s)


def test_default_budgets_end_a_30_day_10k_replica_job_within_days() -> None:
    r = sim.simulate(sim.Setup(), sim.fault_tolerance(SYNC, "default"), 3600)
    assert r.ended is not None and "(3/3)" in r.ended
    assert r.failures == 4 and r.job_restarts == 3
    assert r.wall_s < 5 * sim.DAY_S


def test_async_workers_restart_alone_and_cost_one_replicas_share() -> None:
    setup = sim.Setup(seed=3)
    r = sim.simulate(setup, sim.fault_tolerance(ASYNC, "unlimited"), 3600)
    assert r.failures > 100 and r.replica_restarts == r.failures and r.job_restarts == 0
    assert r.redone_s == 0 and r.restart_s == 0
    assert r.replica_restart_s == pytest.approx(r.failures * 600 / 10_000)
    assert r.ratio == pytest.approx(sim.expected_ratio(setup, 3600, ASYNC), abs=1e-3)


def test_mix_is_validated() -> None:
    assert sim.parse_mix("segv=1,bug=0") == (("segv", 1.0),)
    for bad in ("oops=1", "segv=-1", "segv=x", "bug=0"):
        with pytest.raises(ValueError, match="mix"):
            sim.parse_mix(bad)


def test_setup_is_validated() -> None:
    with pytest.raises(ValueError, match="replicas"):
        sim.Setup(replicas=0)
    with pytest.raises(ValueError, match="restart_cost_s"):
        sim.Setup(restart_cost_s=-1)
    with pytest.raises(ValueError, match="longer than the checkpoint cost"):
        sim.simulate(sim.Setup(), sim.fault_tolerance(SYNC, "unlimited"), 60)


def test_main_prints_the_three_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--days", "3", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "effective training time ratio" in out and "closed-form approximation" in out
    assert "Young, unlimited" in out and "given, default" in out
    assert "events/s" in out
