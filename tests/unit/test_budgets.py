"""How budgets accumulate over a failure history, and each budget's edge (R-POL-3)."""

from __future__ import annotations

from typing import Any

import pytest
from policy_cases import _charges, _failure, _ft

from trainguard.policy.actions import (
    Decision,
    FailJob,
    Ignore,
    RestartJob,
    RestartReplica,
    Succeed,
    describe,
)
from trainguard.policy.budgets import Budgets, Charge
from trainguard.policy.decisions import decide_failure
from trainguard.spec.models import FaultTolerance

# ---------------------------------------------------------------- Budgets.after


def test_budgets_accumulate_over_transient_failures() -> None:
    ft = _ft()
    b = Budgets()
    for n in (1, 2, 3):
        f = _failure("transient")
        d = decide_failure(ft, b, f)
        assert isinstance(d, RestartJob), (n, d)
        assert _charges(d) == (
            Charge("max_transient_restarts", n, 3),
            Charge("job_restarts", n, 3),
        )
        b = b.after(f, d)
        assert b.job_restarts == n
        assert b.class_restarts == {"max_transient_restarts": n}
        assert b.replica_restarts == {}
    f = _failure("transient")
    d = decide_failure(ft, b, f)
    assert isinstance(d, FailJob)
    assert d.error_code == "139"
    assert "max_transient_restarts is spent (3/3)" in d.reason
    # A decision without charges only counts the failure itself.
    after = b.after(f, d)
    assert (after.job_restarts, after.class_restarts) == (b.job_restarts, b.class_restarts)
    assert after.same_error[f.same_error_key] == 4


def test_budgets_accumulate_across_classes() -> None:
    ft = _ft(max_num_of_job_restart=5)
    b = Budgets()
    for kind in ("transient", "preemption", "transient"):
        f = _failure(kind)
        b = b.after(f, decide_failure(ft, b, f))
    assert b.job_restarts == 3
    assert b.class_restarts == {"max_transient_restarts": 2}
    assert b.failed_replicas == {"worker-1"}


def test_budgets_accumulate_in_async_then_escalate() -> None:
    ft = _ft(execution_mode="async")
    b = Budgets()
    for n in range(1, 6):
        f = _failure("preemption")
        d = decide_failure(ft, b, f)
        assert isinstance(d, RestartReplica), (n, d)
        b = b.after(f, d)
        assert b.replica_restarts == {"worker-1": n}
        assert b.job_restarts == 0
    f2 = _failure("preemption", replica="worker-2")
    b = b.after(f2, decide_failure(ft, b, f2))
    assert b.replica_restarts == {"worker-1": 5, "worker-2": 1}
    f = _failure("preemption")
    d = decide_failure(ft, b, f)
    assert isinstance(d, RestartJob)
    b = b.after(f, d)
    assert b.job_restarts == 1
    # a new attempt: every replica has its own restarts back (Vertex: 5 per worker, per try)
    assert b.replica_restarts == {}
    d = decide_failure(ft, b, _failure("preemption"))
    assert isinstance(d, RestartReplica)


def test_after_does_not_mutate() -> None:
    b = Budgets()
    f = _failure("transient")
    d = decide_failure(_ft(), b, f)
    b2 = b.after(f, d)
    assert b == Budgets()
    assert b.class_restarts == {} and b.same_error == {}
    assert b2 != b


@pytest.mark.parametrize("decision", [Succeed("done"), Ignore("wait"), FailJob("1", "m", "r")])
def test_after_without_charges_counts_only_the_failure(decision: Decision) -> None:
    b = Budgets(job_restarts=2, replica_restarts={"w": 1}, class_restarts={"x": 1})
    f = _failure("preemption")
    out = b.after(f, decision)
    assert (out.job_restarts, out.replica_restarts, out.class_restarts) == (2, {"w": 1}, {"x": 1})
    assert out.same_error == {f.same_error_key: 1}
    assert out.failed_replicas == {"worker-1"}


# ---------------------------------------------------------------- each budget's edge:
# (history, failure) -> decision, with the last allowed retry and the first refused one


def _history(ft: FaultTolerance, kinds: list[tuple[str, str]]) -> Budgets:
    b = Budgets()
    for kind, replica in kinds:
        f = _failure(kind, replica=replica)
        b = b.after(f, decide_failure(ft, b, f, world_size=10))
    return b


@pytest.mark.parametrize(
    ("ft", "history", "failure", "expected", "why"),
    [
        # job budget: 3 restarts allowed, the 4th failure fails the job
        ({}, [("preemption", "worker-1")] * 2, "preemption", RestartJob, "job_restarts 3/3"),
        ({}, [("preemption", "worker-1")] * 3, "preemption", FailJob, "budget is spent (3/3)"),
        # transient budget (3), with a larger job budget so only the class budget bites
        (
            {"max_num_of_job_restart": 9},
            [("transient", "worker-1")] * 2,
            "transient",
            RestartJob,
            "max_transient_restarts 3/3",
        ),
        (
            {"max_num_of_job_restart": 9},
            [("transient", "worker-1")] * 3,
            "transient",
            FailJob,
            "max_transient_restarts is spent (3/3)",
        ),
        # same error on one replica: 10 allowed, the 11th fails
        (
            {"max_num_of_job_restart": "unlimited"},
            [("preemption", "worker-1")] * 9,
            "preemption",
            RestartJob,
            "same_error:worker-1:",
        ),
        (
            {"max_num_of_job_restart": "unlimited"},
            [("preemption", "worker-1")] * 10,
            "preemption",
            FailJob,
            "hit the same error 11 times",
        ),
        # ... counted per replica: the same error on another replica does not add up
        (
            {"max_num_of_job_restart": "unlimited"},
            [("preemption", "worker-2")] * 10,
            "preemption",
            RestartJob,
            "same_error:worker-1:",
        ),
        # ... and 'unlimited' switches it off
        (
            {"max_num_of_job_restart": "unlimited", "max_num_of_same_error": "unlimited"},
            [("preemption", "worker-1")] * 30,
            "preemption",
            RestartJob,
            "job_restarts 31/unlimited",
        ),
        # failure rate 0.3 of 10 replicas: 3 failed replicas are tolerated, a 4th is not
        (
            {"max_num_of_job_restart": 9, "max_tolerated_failure_rate": 0.3},
            [("preemption", "worker-2"), ("preemption", "worker-3")],
            "preemption",
            RestartJob,
            "job_restarts 3/9",
        ),
        (
            {"max_num_of_job_restart": 9, "max_tolerated_failure_rate": 0.3},
            [("preemption", "worker-2"), ("preemption", "worker-3"), ("preemption", "worker-4")],
            "preemption",
            FailJob,
            "4 of 10 replicas have failed",
        ),
        # ... a replica failing again is not a new failed replica
        (
            {"max_num_of_job_restart": 9, "max_tolerated_failure_rate": 0.3},
            [("preemption", "worker-1")] * 5,
            "preemption",
            RestartJob,
            "job_restarts 6/9",
        ),
        # async: 5 restarts of one worker, then the 6th failure restarts the job
        (
            {"execution_mode": "async"},
            [("preemption", "worker-1")] * 4,
            "preemption",
            RestartReplica,
            "replica_restarts:worker-1 5/5",
        ),
        (
            {"execution_mode": "async"},
            [("preemption", "worker-1")] * 5,
            "preemption",
            RestartJob,
            "spent its 5 restarts",
        ),
        # async: after 3 job restarts (5 replica restarts before each) the job fails
        (
            {"execution_mode": "async", "max_num_of_same_error": 99},
            [("preemption", "worker-1")] * 23,
            "preemption",
            FailJob,
            "budget is spent (3/3)",
        ),
        (
            {"execution_mode": "async", "max_num_of_same_error": 99},
            [("preemption", "worker-1")] * 22,
            "preemption",
            RestartReplica,
            "replica_restarts:worker-1 5/5",
        ),
    ],
)
def test_budget_edges(
    ft: dict[str, Any], history: list[tuple[str, str]], failure: str, expected: type, why: str
) -> None:
    settings = _ft(**ft)
    b = _history(settings, history)
    d = decide_failure(settings, b, _failure(failure), world_size=10)
    assert type(d) is expected, describe(d)
    assert why in (describe(d) if not isinstance(d, FailJob) else d.reason)


def test_tally_counts_like_a_dict_through_many_folds() -> None:
    from trainguard.policy.budgets import Tally

    tally, expected = Tally(), dict[str, int]()
    for i in range(300):
        key = f"worker-{i % 7}:f{i % 3}"
        tally, before = tally.plus(key), tally
        expected[key] = expected.get(key, 0) + 1
        assert before.get(key, 0) == expected[key] - 1  # the old value is unchanged
    assert dict(tally) == expected and len(tally) == len(expected)
    assert tally.get("nobody", 0) == 0 and Tally() == {}
