"""Bounded input: huge numbers, too many replicas and fractional cpus get one line each."""

from __future__ import annotations

import pytest
from conftest import TG

from trainguard.errors import SpecError
from trainguard.service.quota import MIN_CPUS_PER_REPLICA, request_of
from trainguard.spec.limits import MAX_LIMIT
from trainguard.spec.models import validate_spec


def _problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(SpecError) as exc:
        validate_spec(data)
    return exc.value.problems


@pytest.mark.parametrize(
    ("ft", "field"),
    [
        ({"max_num_of_job_restart": 10**30}, "fault_tolerance.max_num_of_job_restart"),
        ({"max_num_of_job_restart": str(10**30)}, "fault_tolerance.max_num_of_job_restart"),
        ({"job_hang_interval_s": 1e30}, "fault_tolerance.job_hang_interval_s"),
        ({"startup_timeout_s": 1e30}, "fault_tolerance.startup_timeout_s"),
        ({"job_hang_interval_s": float("nan")}, "fault_tolerance.job_hang_interval_s"),
        ({"job_hang_interval_s": float("inf")}, "fault_tolerance.job_hang_interval_s"),
        ({"job_hang_interval_s": 0.001}, "fault_tolerance.job_hang_interval_s"),
        ({"job_exit_hang_interval_s": 0.01}, "fault_tolerance.job_exit_hang_interval_s"),
        ({"startup_timeout_s": 0.1}, "fault_tolerance.startup_timeout_s"),
        ({"max_tolerated_failure_rate": float("nan")}, "fault_tolerance.max_tolerated"),
    ],
)
def test_huge_numbers_are_refused_by_name(ft: dict[str, object], field: str) -> None:
    problems = _problems({"name": "j", "worker_pools": [{"command": ["x"]}], "fault_tolerance": ft})
    assert any(p.startswith(field) for p in problems), problems
    assert all(len(p) < 200 for p in problems)


def test_the_largest_budget_and_unlimited_still_work() -> None:
    spec = validate_spec(
        {
            "name": "j",
            "worker_pools": [{"command": ["x"]}],
            "fault_tolerance": {"max_num_of_job_restart": MAX_LIMIT},
        }
    )
    assert spec.fault_tolerance.max_num_of_job_restart == MAX_LIMIT


def test_too_many_replicas_in_all_pools() -> None:
    pools = [{"role": f"r{i}", "replicas": 4000, "command": ["x"]} for i in range(2)]
    problems = _problems({"name": "j", "worker_pools": pools, "framework": "generic"})
    assert any("8000 replicas in all, at most 4096" in p for p in problems), problems


def test_fractional_cpus_cannot_slip_under_a_quota() -> None:
    spec = validate_spec(
        {
            "name": "j",
            "worker_pools": [{"replicas": 1000, "command": ["x"], "resources": {"cpus": 0.0001}}],
        }
    )
    assert request_of(spec).cpus == pytest.approx(1000 * MIN_CPUS_PER_REPLICA)


@pytest.mark.slow
def test_a_huge_flag_is_exit_2_with_one_line(tg: TG) -> None:
    res = tg("run", "--max-restarts", str(10**30), "--", "true")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "max_num_of_job_restart" in res.stderr and "10000" in res.stderr


def test_the_servers_quota_caps_running_replicas_in_all() -> None:
    from trainguard.service.quota import DEFAULT_MAX_REPLICAS, Quota, Request

    quota = Quota()
    assert quota.replicas == DEFAULT_MAX_REPLICAS
    used = Request(replicas=4000)
    assert quota.shortage(Request(cpus=1, replicas=96), used) is None
    assert quota.shortage(Request(cpus=1, replicas=97), used) == "97 replicas, 96 free"


def _spec(**extra: object) -> dict[str, object]:
    return {"name": "j", "worker_pools": [{"replicas": 2, "command": ["x"]}], **extra}


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"fault_injection": ["exit:worker-1:300@5s"]}, "an exit status is 0 to 255"),
        ({"fault_injection": ["signal:worker-1:KILL@1s,attempt=4"]}, "attempts 0 to 3 only"),
        ({"fault_injection": ["signal:worker-1:KILL@99999999999s"]}, "at most"),
        ({"fault_injection": ["stop:worker-1@step=10000000000000000000"]}, "at most"),
        ({"gpu_inventory": [0, -1]}, "gpu_inventory"),
    ],
)
def test_settings_that_can_never_take_effect_are_refused(
    extra: dict[str, object], words: str
) -> None:
    problems = _problems(_spec(**extra))
    assert any(words in p for p in problems), problems


def test_an_injection_within_the_budget_or_unlimited_is_accepted() -> None:
    validate_spec(_spec(fault_injection=["signal:worker-1:KILL@1s,attempt=3"]))
    validate_spec(
        _spec(
            fault_injection=["signal:worker-1:KILL@1s,attempt=40"],
            fault_tolerance={"max_num_of_job_restart": "unlimited"},
        )
    )
    no_restart = _spec(
        fault_injection=["signal:worker-1:KILL@1s,attempt=1"],
        fault_tolerance={"enable_job_restart": False},
    )
    assert any("attempts 0 to 0 only" in p for p in _problems(no_restart))


@pytest.mark.parametrize(
    "argv",
    [
        ("logs", "x", "--tail", "-5"),
        ("logs", "x", "--tail", "0"),
        ("logs", "x", "--attempt", "-1"),
        ("jobs", "--limit", "0"),
        ("jobs", "--limit", str(10**30)),
        ("stacks", "x", "--attempt", "abc"),
        ("server", "--port", "70000"),
    ],
)
@pytest.mark.slow
def test_nonsense_numbers_on_the_command_line_are_exit_2(tg: TG, argv: tuple[str, ...]) -> None:
    res = tg(*argv)
    assert res.returncode == 2, res
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert argv[-2] in res.stderr  # the flag is named
