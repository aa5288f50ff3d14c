"""Table tests for the fault-tolerance policy (R-POL-1..3, R-POL-5): pure decisions."""

from __future__ import annotations

from typing import Any

import pytest
from policy_cases import _charges, _failure, _ft

from trainguard.classify.classes import (
    INTERNAL_ERROR_MESSAGE,
    Classification,
    ExitEvidence,
    ExitKind,
    FailureClass,
)
from trainguard.classify.exits import classify_exit
from trainguard.policy.actions import (
    Decision,
    FailJob,
    Ignore,
    RestartJob,
    RestartReplica,
    Succeed,
    WaitForCapacity,
    describe,
)
from trainguard.policy.budgets import Budgets, Charge, Failure
from trainguard.policy.decisions import decide_clean_exit, decide_failure
from trainguard.spec.models import SuccessPolicy

JOB_1 = Charge("job_restarts", 1, 3)
TRANSIENT_1 = Charge("max_transient_restarts", 1, 3)

# ---------------------------------------------------------------- policy x failure class

ECEM = "ExitCodeAndErrorMsg"


@pytest.mark.parametrize(
    ("policy", "kind", "decision", "charges"),
    [
        # user errors: only OnFailure retries them
        (ECEM, "user", FailJob, None),
        ("OnFailure", "user", RestartJob, (JOB_1,)),
        ("Never", "user", FailJob, None),
        (ECEM, "user_plain", FailJob, None),
        ("OnFailure", "user_plain", RestartJob, (JOB_1,)),
        (ECEM, "sigbus", FailJob, None),
        ("OnFailure", "sigbus", RestartJob, (JOB_1,)),
        # spawn errors: a retry cannot help, whatever the policy
        (ECEM, "spawn", FailJob, None),
        ("OnFailure", "spawn", FailJob, None),
        ("Never", "spawn", FailJob, None),
        # transient: charged to the transient budget and the job budget
        (ECEM, "transient", RestartJob, (TRANSIENT_1, JOB_1)),
        (ECEM, "abort", RestartJob, (TRANSIENT_1, JOB_1)),
        ("OnFailure", "transient", RestartJob, (TRANSIENT_1, JOB_1)),
        ("Never", "transient", FailJob, None),
        # preemption and host OOM: the job budget only
        (ECEM, "preemption", RestartJob, (JOB_1,)),
        (ECEM, "sigterm", RestartJob, (JOB_1,)),
        ("OnFailure", "preemption", RestartJob, (JOB_1,)),
        ("Never", "preemption", FailJob, None),
        (ECEM, "oom", FailJob, None),  # as Vertex: out of memory is not retried
        ("Never", "oom", FailJob, None),
    ],
)
def test_policy_by_failure_class(
    policy: str, kind: str, decision: type, charges: tuple[Charge, ...] | None
) -> None:
    failure = _failure(kind)
    ft = _ft(fault_tolerant_policy=policy, retry_uncertain=False)  # the strict reading
    d = decide_failure(ft, Budgets(), failure)
    assert type(d) is decision
    if charges is not None:
        assert _charges(d) == charges
    if isinstance(d, FailJob):
        assert d.proof and d.message == f"{failure.classification.message} (proof: {d.proof})"


UNCERTAIN_1 = Charge("max_uncertain_restarts", 1, 1)


@pytest.mark.parametrize(
    ("kind", "decision", "charges"),
    [
        # unsettled: a bare exit status, a bare signal get one retry
        ("user_plain", RestartJob, (UNCERTAIN_1, JOB_1)),
        ("sigbus", RestartJob, (UNCERTAIN_1, JOB_1)),
        # proof: a traceback, a cgroup OOM, a command that cannot start
        ("user", FailJob, None),
        ("oom", FailJob, None),
        ("spawn", FailJob, None),
    ],
)
def test_retry_uncertain_retries_only_what_is_unproven(
    kind: str, decision: type, charges: tuple[Charge, ...] | None
) -> None:
    d = decide_failure(_ft(retry_uncertain=True), Budgets(), _failure(kind))
    assert type(d) is decision, d
    if charges is not None:
        assert _charges(d) == charges


@pytest.mark.parametrize(
    ("kind", "error_code", "message"),
    [
        (
            "user",
            "1",
            "The replica worker-1 exited with a non-zero status of 1. "
            "Termination reason: KeyError: 'x'.",
        ),
        (
            "spawn",
            "SPAWN_ERROR",
            "The replica worker-1 could not be started: command not found: 'nope'.",
        ),
        (
            "sigbus",
            "135",
            "The replica worker-1 exited with a non-zero status of 135. "
            "Termination reason: SIGBUS.",
        ),
    ],
)
def test_fail_job_carries_code_and_message(kind: str, error_code: str, message: str) -> None:
    d = decide_failure(_ft(retry_uncertain=False), Budgets(), _failure(kind))
    assert isinstance(d, FailJob)
    assert (d.error_code, d.message) == (error_code, f"{message} (proof: {d.proof})")
    assert "not retryable" in d.reason or "cannot be started" in d.reason


def test_user_error_reason_names_the_rule() -> None:
    d = decide_failure(_ft(), Budgets(), _failure("user"))
    assert isinstance(d, FailJob)
    assert d.reason == "user_error is not retryable (rule python-bug)"


def test_never_reason() -> None:
    d = decide_failure(_ft(fault_tolerant_policy="Never"), Budgets(), _failure("transient"))
    assert isinstance(d, FailJob)
    assert d.reason == "fault_tolerant_policy is Never"
    assert d.error_code == "139"


def test_spawn_error_fails_even_under_on_failure() -> None:
    d = decide_failure(_ft(fault_tolerant_policy="OnFailure"), Budgets(), _failure("spawn"))
    assert isinstance(d, FailJob)
    assert d.error_code == "SPAWN_ERROR"
    assert "cannot be started" in d.reason


def test_on_failure_restart_reason() -> None:
    d = decide_failure(_ft(fault_tolerant_policy="OnFailure"), Budgets(), _failure("user"))
    assert isinstance(d, RestartJob)
    assert d.reason == "fault_tolerant_policy is OnFailure"


# ---------------------------------------------------------------- budgets


@pytest.mark.parametrize(
    ("kind", "error_code"),
    [("transient", "139"), ("preemption", "137"), ("sigterm", "143")],
)
def test_job_budget_exhausted_fails_with_the_classification(kind: str, error_code: str) -> None:
    failure = _failure(kind)
    # The transient budget is not the one spent here.
    ft = _ft(max_num_of_job_restart=3, max_transient_restarts=10)
    d = decide_failure(ft, Budgets(job_restarts=3), failure)
    assert isinstance(d, FailJob)
    assert d.error_code == error_code
    assert d.message == f"{failure.classification.message} (proof: {d.proof})"
    assert d.proof == "max_num_of_job_restart is spent (3/3)"
    assert "job restart budget is spent (3/3)" in d.reason


def test_job_budget_not_yet_exhausted() -> None:
    d = decide_failure(_ft(), Budgets(job_restarts=2), _failure("preemption"))
    assert isinstance(d, RestartJob)
    assert _charges(d) == (Charge("job_restarts", 3, 3),)


def test_enable_job_restart_false_fails() -> None:
    failure = _failure("transient")
    d = decide_failure(_ft(enable_job_restart=False), Budgets(), failure)
    assert isinstance(d, FailJob)
    assert d.error_code == "139"
    assert d.message == f"{failure.classification.message} (proof: enable_job_restart is False)"
    assert d.reason.endswith("but enable_job_restart is False")


@pytest.mark.parametrize("limit", ["unlimited", -1, "-1"])
def test_unlimited_job_budget(limit: Any) -> None:
    d = decide_failure(
        _ft(max_num_of_job_restart=limit), Budgets(job_restarts=1000), _failure("preemption")
    )
    assert isinstance(d, RestartJob)
    assert _charges(d) == (Charge("job_restarts", 1001, "unlimited"),)


def test_zero_job_budget_fails() -> None:
    d = decide_failure(_ft(max_num_of_job_restart=0), Budgets(), _failure("preemption"))
    assert isinstance(d, FailJob)
    assert d.error_code == "137"
    assert "(0/0)" in d.reason


def test_transient_budget_exhausted_fails() -> None:
    failure = _failure("transient")
    b = Budgets(job_restarts=0, class_restarts={"max_transient_restarts": 3})
    d = decide_failure(_ft(max_num_of_job_restart="unlimited"), b, failure)
    assert isinstance(d, FailJob)
    assert d.error_code == "139"
    assert d.message == (
        "The replica worker-1 exited with a non-zero status of 139. Termination reason: SIGSEGV. "
        "(proof: max_transient_restarts is spent (3/3))"
    )
    assert "max_transient_restarts is spent (3/3)" in d.reason


def test_transient_budget_does_not_limit_preemption() -> None:
    b = Budgets(class_restarts={"max_transient_restarts": 3})
    d = decide_failure(_ft(), b, _failure("preemption"))
    assert isinstance(d, RestartJob)
    assert _charges(d) == (JOB_1,)


# ---------------------------------------------------------------- async mode


@pytest.mark.parametrize(
    ("kind", "charges"),
    [
        ("preemption", (Charge("replica_restarts:worker-1", 1, 5),)),
        ("transient", (TRANSIENT_1, Charge("replica_restarts:worker-1", 1, 5))),
    ],
)
def test_async_worker_restarts_alone(kind: str, charges: tuple[Charge, ...]) -> None:
    d = decide_failure(_ft(execution_mode="async"), Budgets(), _failure(kind))
    assert isinstance(d, RestartReplica)
    assert d.replica == "worker-1"
    assert _charges(d) == charges


def test_async_worker_escalates_after_its_budget() -> None:
    ft = _ft(execution_mode="async")
    b = Budgets(replica_restarts={"worker-1": 5})
    d = decide_failure(ft, b, _failure("preemption"))
    assert isinstance(d, RestartJob)
    assert _charges(d) == (JOB_1,)
    assert "worker-1 spent its 5 restarts, so the job restarts" in d.reason


def test_async_budget_is_per_replica() -> None:
    ft = _ft(execution_mode="async")
    b = Budgets(replica_restarts={"worker-1": 5})
    d = decide_failure(ft, b, _failure("preemption", replica="worker-2"))
    assert isinstance(d, RestartReplica)
    assert d.replica == "worker-2"
    assert _charges(d) == (Charge("replica_restarts:worker-2", 1, 5),)


def test_async_escalation_respects_enable_job_restart() -> None:
    ft = _ft(execution_mode="async", enable_job_restart=False)
    b = Budgets(replica_restarts={"worker-1": 5})
    d = decide_failure(ft, b, _failure("preemption"))
    assert isinstance(d, FailJob)
    assert d.error_code == "137"


@pytest.mark.parametrize("role", ["ps", "chief", "master", "evaluator"])
@pytest.mark.parametrize(
    ("enable", "decision"), [(True, RestartJob), (False, FailJob)], ids=["restart", "no-restart"]
)
def test_async_non_worker_role_restarts_the_job(role: str, enable: bool, decision: type) -> None:
    ft = _ft(execution_mode="async", enable_job_restart=enable)
    d = decide_failure(ft, Budgets(), _failure("preemption", replica=f"{role}-0", role=role))
    assert type(d) is decision
    if isinstance(d, RestartJob):
        assert _charges(d) == (JOB_1,)


def test_sync_worker_restarts_the_job() -> None:
    d = decide_failure(_ft(execution_mode="sync"), Budgets(), _failure("preemption"))
    assert isinstance(d, RestartJob)


def test_async_user_error_still_fails() -> None:
    d = decide_failure(_ft(execution_mode="async"), Budgets(), _failure("user"))
    assert isinstance(d, FailJob)


def test_async_unlimited_replica_budget() -> None:
    ft = _ft(execution_mode="async", max_replica_restarts="unlimited")
    d = decide_failure(ft, Budgets(replica_restarts={"worker-1": 99}), _failure("preemption"))
    assert isinstance(d, RestartReplica)
    assert _charges(d) == (Charge("replica_restarts:worker-1", 100, "unlimited"),)


# ---------------------------------------------------------------- clean exits


@pytest.mark.parametrize(
    ("policy", "replica", "all_succeeded", "decision"),
    [
        (SuccessPolicy.CHIEF, "chief-0", False, Succeed),
        (SuccessPolicy.CHIEF, "chief-0", True, Succeed),
        (SuccessPolicy.CHIEF, "worker-1", False, Ignore),
        (SuccessPolicy.CHIEF, "worker-1", True, Ignore),
        (SuccessPolicy.ALL, "chief-0", False, Ignore),
        (SuccessPolicy.ALL, "worker-1", False, Ignore),
        (SuccessPolicy.ALL, "worker-1", True, Succeed),
        (SuccessPolicy.ALL, "chief-0", True, Succeed),
    ],
)
def test_decide_clean_exit(
    policy: SuccessPolicy, replica: str, all_succeeded: bool, decision: type
) -> None:
    d = decide_clean_exit(policy, replica, "chief-0", all_succeeded)
    assert type(d) is decision


def test_decide_clean_exit_reasons() -> None:
    assert decide_clean_exit(SuccessPolicy.CHIEF, "worker-0", "worker-0", False) == Succeed(
        "the primary replica worker-0 exited 0"
    )
    assert decide_clean_exit(SuccessPolicy.CHIEF, "worker-1", "worker-0", False) == Ignore(
        "worker-1 exited 0; waiting for the primary replica worker-0"
    )
    assert decide_clean_exit(SuccessPolicy.ALL, "worker-1", "worker-0", True) == Succeed(
        "every replica exited 0"
    )
    assert decide_clean_exit(SuccessPolicy.ALL, "worker-1", "worker-0", False) == Ignore(
        "worker-1 exited 0; waiting for the other replicas"
    )


# ---------------------------------------------------------------- describe


def test_describe_restart_job_with_charges() -> None:
    d = decide_failure(_ft(), Budgets(), _failure("transient"))
    assert describe(d) == (
        "RestartJob: transient_exit is retryable (rule transient-signal-SIGSEGV) "
        "[charged same_error:worker-1:bc1e4bcc8704 1/10 (9 left), "
        "max_transient_restarts 1/3 (2 left), job_restarts 1/3 (2 left)]"
    )


def test_describe_mentions_job_restarts() -> None:
    d = decide_failure(_ft(), Budgets(job_restarts=1), _failure("preemption"))
    assert "job_restarts 2/3 (1 left)" in describe(d)


def test_describe_restart_replica() -> None:
    d = decide_failure(_ft(execution_mode="async"), Budgets(), _failure("preemption"))
    text = describe(d)
    assert text.startswith("RestartReplica(worker-1): ")
    assert text.endswith("replica_restarts:worker-1 1/5 (4 left)]")


def test_describe_unlimited() -> None:
    d = decide_failure(
        _ft(max_num_of_job_restart="unlimited"), Budgets(job_restarts=7), _failure("preemption")
    )
    assert "job_restarts 8/unlimited" in describe(d)


@pytest.mark.parametrize(
    ("decision", "text"),
    [
        (FailJob("1", "msg", "not retryable"), "FailJob: not retryable"),
        (Succeed("every replica exited 0"), "Succeed: every replica exited 0"),
        (Ignore("waiting"), "Ignore: waiting"),
    ],
)
def test_describe_without_charges(decision: Decision, text: str) -> None:
    assert describe(decision) == text


def test_charge_str() -> None:
    assert str(Charge("job_restarts", 1, 3)) == "job_restarts 1/3 (2 left)"
    assert str(Charge("job_restarts", 4, "unlimited")) == "job_restarts 4/unlimited"


def test_direct_classification_internal_error_code() -> None:
    # Built directly: an INTERNAL failure is reported with the INTERNAL error code.
    c = Classification(
        ExitKind.NONZERO,
        FailureClass.INTERNAL,
        True,
        "internal",
        1,
        None,
        "internal",
        INTERNAL_ERROR_MESSAGE,
    )
    failure = Failure("worker-0", "worker", 0, 1, None, 0.0, c)
    ft = _ft(enable_job_restart=False)
    d = decide_failure(ft, Budgets(), failure)
    assert isinstance(d, FailJob)
    assert (d.error_code, d.message) == (
        "INTERNAL",
        f"{INTERNAL_ERROR_MESSAGE} (proof: enable_job_restart is False)",
    )
    restart = decide_failure(_ft(), Budgets(), failure)
    assert isinstance(restart, RestartJob)
    assert _charges(restart) == (Charge("max_internal_restarts", 1, 2), JOB_1)


def _capacity_failure() -> Failure:
    c = classify_exit(
        ExitEvidence("worker-1", 1, log_tail=("RuntimeError: No CUDA GPUs are available",))
    )
    assert c.failure_class is FailureClass.CAPACITY
    return Failure("worker-1", "worker", 1, 1, 42, 100.0, c)


def test_capacity_budget_spent_waits_for_capacity_only_when_asked() -> None:
    b = Budgets(class_restarts={"max_capacity_restarts": 3})
    failed = decide_failure(_ft(), b, _capacity_failure())
    assert isinstance(failed, FailJob) and "max_capacity_restarts is spent (3/3)" in failed.reason
    waits = decide_failure(_ft(), b, _capacity_failure(), wait_for_capacity=True)
    assert isinstance(waits, WaitForCapacity) and "waits for capacity" in waits.reason
    assert b.after(_capacity_failure(), waits).job_restarts == 0  # waiting charges nothing
    # Another class with its budget spent still fails.
    transient = Budgets(class_restarts={"max_transient_restarts": 3})
    d = decide_failure(_ft(), transient, _failure("transient"), wait_for_capacity=True)
    assert isinstance(d, FailJob)
