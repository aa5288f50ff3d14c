"""The torchft preset as configuration and pure policy: its spec, its CLI flags, and
what the group policy decides. The master running it: test_torchft.py; the real
thing: test_torchft_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.classify.classes import Classification, ExitKind, FailureClass
from trainguard.cli.parser import build_parser, split_command
from trainguard.cli.spec_flags import build_spec
from trainguard.errors import SpecError
from trainguard.frameworks import preset
from trainguard.policy.actions import FailJob, RestartGroup, RestartJob, RestartReplica, describe
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.spec.models import JobSpec, validate_spec


def _spec(groups: int = 3, per: int = 1, **extra: Any) -> JobSpec:
    return validate_spec(
        {
            "name": "ft",
            "framework": "torchft",
            "worker_pools": [{"replicas": groups * per, "command": ["python", "t.py"]}],
            "torchft": {"nproc_per_group": per, **extra.pop("torchft", {})},
            **extra,
        }
    )


# ---------------------------------------------------------------- the spec


def test_a_torchft_spec_gets_its_lighthouse_and_one_store_per_group() -> None:
    spec = _spec(groups=3, per=2)
    pools = {p.role: p for p in spec.worker_pools}
    assert [p.role for p in spec.worker_pools] == ["worker", "lighthouse", "store"]
    assert pools["lighthouse"].command[0].endswith("torchft_lighthouse")
    assert pools["store"].replicas == 3
    assert pools["store"].command[-2:] == ["-m", "trainguard.frameworks.torchft_tcpstore"]
    assert spec.fault_tolerance.execution_mode.value == "async"
    assert spec.success_policy.value == "all"
    # what the spec says is kept: a lighthouse of the user's own
    own = validate_spec(
        {
            "name": "ft",
            "framework": "torchft",
            "worker_pools": [
                {"replicas": 2, "command": ["python", "t.py"]},
                {"role": "lighthouse", "command": ["/opt/torchft_lighthouse"]},
            ],
        }
    )
    assert [p.command for p in own.worker_pools if p.role == "lighthouse"] == [
        ["/opt/torchft_lighthouse"]
    ]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {
                "worker_pools": [{"replicas": 3, "command": ["x"]}],
                "torchft": {"nproc_per_group": 2},
            },
            "not whole groups of torchft.nproc_per_group 2",
        ),
        ({"torchft": {"min_replicas": 4}}, "torchft.min_replicas: 4 groups for a quorum"),
        ({"fault_tolerance": {"execution_mode": "sync"}}, "a torchft job is async"),
        ({"worker_pools": [{"role": "chief", "command": ["x"]}]}, "has no role 'chief'"),
        ({"torchft": {"heartbeat_timeout_ms": 5}}, "torchft.heartbeat_timeout_ms"),
        (
            {
                "worker_pools": [
                    {"replicas": 2, "command": ["x"]},
                    {"role": "store", "replicas": 1, "command": ["x"]},
                ]
            },
            "one store per group (2), got 1",
        ),
    ],
)
def test_a_torchft_spec_that_cannot_work_names_why(change: dict[str, Any], problem: str) -> None:
    data: dict[str, Any] = {
        "name": "ft",
        "framework": "torchft",
        "worker_pools": [{"replicas": 3, "command": ["python", "t.py"]}],
        **change,
    }
    with pytest.raises(SpecError) as info:
        validate_spec(data)
    assert problem in "\n".join(info.value.problems)


def _build(*argv: str) -> JobSpec:
    head, command = split_command(["run", *argv])
    return build_spec(build_parser().parse_args(head), command)


def test_the_cli_builds_groups_of_ranks() -> None:
    spec = _build(
        "--framework", "torchft", "--groups", "3", "--nproc-per-group", "2", "--", "python", "t.py"
    )
    assert {p.role: p.replicas for p in spec.worker_pools} == {
        "worker": 6,
        "lighthouse": 1,
        "store": 3,
    }
    assert spec.torchft.nproc_per_group == 2
    assert _build("--framework", "torchft", "--nproc-per-node", "2", "--", "x").world_size == 5


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--groups", "2", "--", "x"), "--groups: applies to --framework torchft only"),
        (("--framework", "torchft", "--groups", "two", "--", "x"), "--groups: must be a whole"),
        (("--framework", "torchft", "--groups", "0", "--", "x"), "--groups: must be 1 to"),
        (
            ("--framework", "torchft", "--groups", "2", "--nproc-per-node", "2", "--", "x"),
            "give one of them",
        ),
    ],
)
def test_the_cli_refuses_group_flags_that_make_no_sense(
    argv: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(SpecError) as info:
        _build(*argv)
    assert problem in "\n".join(info.value.problems)


# ---------------------------------------------------------------- the policy


def _failure(
    replica: str,
    cls: FailureClass = FailureClass.PREEMPTION,
    retryable: bool = True,
    restart: int = 0,
    step: int | None = None,
) -> Failure:
    c = Classification(
        ExitKind.SIGNAL,
        cls,
        retryable,
        "rule-x",
        -9,
        None,
        "why",
        "message",
        fingerprint=f"fp-{cls.value}",
        confidence=0.9,
    )
    role = replica.rsplit("-", 1)[0]
    return Failure(replica, role, 0, 0, 1, 0.0, c, restart=restart, progress=step)


def test_a_failed_rank_restarts_its_whole_group_alone_within_its_budget() -> None:
    spec = _spec(groups=3, per=2, torchft={"max_group_restarts": 2, "heartbeat_timeout_ms": 1500})
    roles = preset("torchft").role_policy(spec)
    assert roles.groups[1] == ("worker-2", "worker-3", "store-1")
    b = Budgets()
    for n in (1, 2):
        failure = _failure("worker-3", step=10 * n)
        d = decide_failure(spec.fault_tolerance, b, failure, 9, roles=roles, groups_up=2)
        assert isinstance(d, RestartGroup), d
        assert (d.group, d.replicas, d.after_s) == (1, roles.groups[1], 1.5)
        assert "6 processes of the other groups keep training" in d.reason
        assert f"group_restarts:group-1 {n}/2" in describe(d)
        b = b.after(failure, d)
    spent = decide_failure(
        spec.fault_tolerance, b, _failure("worker-2", step=99), 9, roles=roles, groups_up=2
    )
    assert isinstance(spent, RestartJob) and "group 1 spent its 2 restarts" in spent.reason
    # a job restart gives every group its restarts back
    b = b.after(_failure("worker-2", step=99), spent)
    again = decide_failure(
        spec.fault_tolerance, b, _failure("worker-0", step=5), 9, roles=roles, groups_up=2
    )
    assert isinstance(again, RestartGroup) and "group_restarts:group-0 1/2" in describe(again)


def test_with_no_group_up_to_heal_from_the_job_restarts() -> None:
    spec = _spec(groups=2)
    roles = preset("torchft").role_policy(spec)
    d = decide_failure(spec.fault_tolerance, Budgets(), _failure("worker-0"), 4, roles=roles)
    assert isinstance(d, RestartJob) and "no other group is up to heal from" in d.reason


def test_a_bug_in_a_group_fails_the_job_and_a_repeated_crash_is_not_retried_forever() -> None:
    spec = _spec(groups=2, fault_tolerance={"max_num_of_same_error": 2})
    roles = preset("torchft").role_policy(spec)
    ft = spec.fault_tolerance
    bug = _failure("worker-1", FailureClass.USER_ERROR, retryable=False)
    assert isinstance(decide_failure(ft, Budgets(), bug, 4, roles=roles, groups_up=1), FailJob)
    b, decisions = Budgets(), []
    for step in range(5):  # the same crash, at a new step each time (the group healed on)
        f = _failure("worker-1", FailureClass.TRANSIENT_EXIT, step=step * 7, restart=step)
        d = decide_failure(ft, b, f, 4, roles=roles, groups_up=1)
        decisions.append(d)
        if isinstance(d, FailJob):
            break
        b = b.after(f, d)
    assert isinstance(decisions[-1], FailJob) and len(decisions) <= 3


def test_the_lighthouse_restarts_alone() -> None:
    spec = _spec(groups=2)
    roles = preset("torchft").role_policy(spec)
    f = _failure("lighthouse-0")
    d = decide_failure(spec.fault_tolerance, Budgets(), f, 4, roles=roles, groups_up=2)
    assert isinstance(d, RestartReplica) and d.replica == "lighthouse-0"
