"""The history rule and uncertain evidence (issue 13): what one log cannot tell, history does.

Pure table tests over `decide_failure` and `Budgets.after`: the same fingerprint at the
same progress point in two attempts ends the job whatever its class; an uncertain
retryable failure is retried once. Failures are classified by the rules alone: the
history rule holds whatever the classifier says.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_by_rules
from trainguard.policy.actions import FailJob, RestartJob, RestartReplica
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import STARTUP_WINDOW_S, decide_failure, repeated_at_same_point
from trainguard.spec.models import FaultTolerance

TIMEOUT = (
    "RuntimeError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds",
)


def _failure(
    attempt: int,
    progress: int | None,
    uptime_s: float | None = 3600.0,
    *,
    returncode: int = 1,
    tail: tuple[str, ...] = TIMEOUT,
    restart: int = 0,
    progressed: bool | None = True,
) -> Failure:
    ev = ExitEvidence("worker-1", returncode, log_tail=tail, progressed=progressed)
    c = classify_by_rules(ev)
    return Failure(
        "worker-1",
        "worker",
        1,
        attempt,
        100 + attempt,
        1000.0 * (attempt + 1),
        c,
        tail,
        restart=restart,
        progress=progress,
        uptime_s=uptime_s,
    )


def _after(*failures: Failure, **ft: Any) -> tuple[Budgets, FaultTolerance]:
    """Budgets after `failures`; uncertain retries are not limited, so the rule shows alone."""
    spec = FaultTolerance(**{"max_uncertain_restarts": "unlimited", **ft})
    b = Budgets()
    for f in failures:
        b = b.after(f, decide_failure(spec, b, f))
    return b, spec


def test_the_same_error_at_the_same_step_fails_the_job_with_the_reason() -> None:
    b, ft = _after(_failure(0, progress=5))
    d = decide_failure(ft, b, _failure(1, progress=5))
    assert isinstance(d, FailJob)
    assert "the same error at step 5 in attempts 0 and 1: not transient" in d.reason
    assert d.message.startswith("The replica worker-1 exited with a non-zero status of 1")


def test_the_same_error_at_another_step_is_retried() -> None:
    b, ft = _after(_failure(0, progress=5))
    assert isinstance(decide_failure(ft, b, _failure(1, progress=40)), RestartJob)


@pytest.mark.parametrize(
    ("first", "second", "decision"),
    [
        # both in start-up with no step: a misconfiguration, whatever the class
        ((None, 12.0), (None, 30.0), FailJob),
        # no step known, but the replica had run for an hour: nothing to compare
        ((None, 3600.0), (None, 3600.0), RestartJob),
        # a step once, none the other time: not the same point
        ((5, 60.0), (None, 60.0), RestartJob),
        # the uptime is not known (a test backend): nothing to compare
        ((None, None), (None, None), RestartJob),
    ],
)
def test_start_up_repeats(
    first: tuple[int | None, float | None], second: tuple[int | None, float | None], decision: type
) -> None:
    b, ft = _after(_failure(0, *first, progressed=None))
    d = decide_failure(ft, b, _failure(1, *second, progressed=None))
    assert type(d) is decision, d
    if decision is FailJob:
        assert isinstance(d, FailJob)
        assert "in start-up, before any training step in attempts 0 and 1" in d.reason


def test_a_fault_from_outside_in_start_up_twice_is_not_the_jobs_doing() -> None:
    """Two preemptions while starting say nothing about the job."""
    kill = dict(returncode=-9, tail=(), progressed=None)
    b, ft = _after(_failure(0, None, 10.0, **kill))  # type: ignore[arg-type]
    d = decide_failure(ft, b, _failure(1, None, 10.0, **kill))  # type: ignore[arg-type]
    assert isinstance(d, RestartJob), d


def test_the_same_step_holds_for_any_class_even_a_kill() -> None:
    kill = dict(returncode=-9, tail=())
    b, ft = _after(_failure(0, 25, **kill))  # type: ignore[arg-type]
    d = decide_failure(ft, b, _failure(1, 25, **kill))  # type: ignore[arg-type]
    assert isinstance(d, FailJob) and "at step 25" in d.reason


def test_the_rule_can_be_turned_off() -> None:
    b, ft = _after(_failure(0, progress=5), enable_repeat_detection=False)
    assert isinstance(decide_failure(ft, b, _failure(1, progress=5)), RestartJob)


def test_async_runs_of_one_replica_count_as_history_too() -> None:
    b, ft = _after(_failure(0, progress=7), execution_mode="async")
    d = decide_failure(ft, b, _failure(0, progress=7, restart=1))
    assert isinstance(d, FailJob)
    assert "in attempt 0 and attempt 0 (restart 1)" in d.reason
    assert isinstance(decide_failure(ft, b, _failure(0, progress=9, restart=1)), RestartReplica)


def test_the_first_occurrence_is_never_a_repeat() -> None:
    f = _failure(0, progress=5)
    assert repeated_at_same_point(Budgets(), f) is None
    # nor is a second failure seen in the same attempt (a cascade recorded twice)
    b, _ = _after(f)
    assert repeated_at_same_point(b, replace(f, time_s=f.time_s + 1)) is None


def test_start_up_is_bounded_by_the_window() -> None:
    late = STARTUP_WINDOW_S + 1
    b, ft = _after(_failure(0, None, late, progressed=None))
    assert isinstance(decide_failure(ft, b, _failure(1, None, late, progressed=None)), RestartJob)


# ---------------------------------------------------------------- uncertain evidence


def test_an_uncertain_failure_is_retried_once_then_the_job_fails() -> None:
    bare = _failure(0, None, None, returncode=-11, tail=(), progressed=None)
    assert bare.classification.uncertain and bare.classification.retryable
    ft = FaultTolerance()
    first = decide_failure(ft, Budgets(), bare)
    assert isinstance(first, RestartJob)
    assert "max_uncertain_restarts 1/1 (0 left)" in [str(c) for c in first.charges]
    b = Budgets().after(bare, first)
    second = decide_failure(ft, b, replace(bare, attempt=1, time_s=5000.0))
    assert isinstance(second, FailJob)
    assert "the evidence is uncertain (confidence 0.50)" in second.reason


def test_a_crash_mid_training_is_not_uncertain() -> None:
    crash = _failure(0, 40, returncode=-11, tail=(), progressed=True)
    assert not crash.classification.uncertain
    d = decide_failure(FaultTolerance(), Budgets(), crash)
    assert isinstance(d, RestartJob)
    assert all(c.budget != "max_uncertain_restarts" for c in d.charges)


# ---------------------------------------------------------------- retry_uncertain

UNEXPLAINED = ("loading shards", "giving up")  # exit 3, no sign the rules know: a guess


def test_an_uncertain_permanent_reading_ends_the_job_unless_asked() -> None:
    f = _failure(0, 5, tail=UNEXPLAINED, returncode=3)
    c = f.classification
    assert (c.retryable, c.uncertain) == (False, True)
    d = decide_failure(FaultTolerance(retry_uncertain=False), Budgets(), f)
    assert isinstance(d, FailJob)
    assert d.proof == ("rule nonzero-exit (uncertain: confidence 0.50); retry_uncertain is off"), (
        d.proof
    )


def test_retry_uncertain_gives_it_one_retry_and_history_ends_the_second() -> None:
    ft = FaultTolerance(retry_uncertain=True)
    f = _failure(0, 5, tail=UNEXPLAINED, returncode=3)
    first = decide_failure(ft, Budgets(), f)
    assert isinstance(first, RestartJob)
    assert "uncertain (confidence 0.50) and retry_uncertain gives it a retry" in first.reason
    assert "max_uncertain_restarts 1/1 (0 left)" in [str(c) for c in first.charges]
    b = Budgets().after(f, first)
    again = decide_failure(ft, b, _failure(1, 5, tail=UNEXPLAINED, returncode=3))
    assert isinstance(again, FailJob)
    assert "the same error at step 5 in attempts 0 and 1: not transient" in again.reason
    # at another step it is not the history rule but the spent budget that ends it
    elsewhere = decide_failure(ft, b, _failure(1, 40, tail=UNEXPLAINED, returncode=3))
    assert isinstance(elsewhere, FailJob)
    assert "max_uncertain_restarts is spent (1/1)" in elsewhere.reason


def test_retry_uncertain_leaves_a_sure_bug_alone() -> None:
    tail = ("Traceback (most recent call last):", '  File "t.py", line 1', "KeyError: 'x'")
    f = _failure(0, 5, tail=tail, progressed=None)  # after training a bug is less sure
    assert not f.classification.uncertain
    assert isinstance(decide_failure(FaultTolerance(retry_uncertain=True), Budgets(), f), FailJob)
