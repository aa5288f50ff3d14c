"""Decide on outcomes (issue 38): what the default policy does with a first failure.

A job ends at once only on proof; an error of the job's code that a deterministic program
meets at its first step is no proof once the job had trained: it gets one retry, and the
history rule ends it if it recurs at the same step.
"""

from __future__ import annotations

import pytest

from trainguard.policy.actions import FailJob, RestartJob
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.classes import ExitEvidence
from trainguard.policy.classify import classify_by_rules, classify_exit
from trainguard.policy.decisions import decide_failure
from trainguard.policy.outcome import first_decision, retries
from trainguard.spec.models import FaultTolerance

KEY_ERROR = (
    "Traceback (most recent call last):",
    '  File "train.py", line 30, in <module>',
    "    batch = shards[name]",
    "KeyError: 'shard-0042'",
)
ABORT = ("double free or corruption (fasttop)", "Aborted (core dumped)")


def test_the_default_retries_what_the_evidence_does_not_settle() -> None:
    assert FaultTolerance().retry_uncertain
    bare = classify_exit(ExitEvidence("w", 1))  # a bare exit 1: nothing settles it
    assert bare.uncertain and not bare.retryable
    assert retries(first_decision(bare))
    assert isinstance(first_decision(bare, FaultTolerance(retry_uncertain=False)), FailJob)


@pytest.mark.parametrize(("progressed", "stops"), [(False, True), (None, True), (True, False)])
def test_a_bug_after_training_is_no_proof(progressed: bool | None, stops: bool) -> None:
    ev = ExitEvidence("w", 1, log_tail=KEY_ERROR, progressed=progressed)
    rules = classify_by_rules(ev)
    assert rules.rule == "python-bug" and not rules.retryable
    assert rules.uncertain is not stops
    assert retries(first_decision(classify_exit(ev))) is not stops  # the model as well
    if not stops:
        assert "a deterministic bug would have struck at its first step" in rules.notes[-1]


def test_a_crash_with_a_cause_after_training_is_retried_once() -> None:
    start = classify_by_rules(ExitEvidence("w", -6, log_tail=ABORT, progressed=False))
    later = classify_by_rules(ExitEvidence("w", -6, log_tail=ABORT, progressed=True))
    assert start.rule == later.rule == "crash-with-cause-SIGABRT"
    assert not start.uncertain and later.uncertain
    assert not retries(first_decision(start)) and retries(first_decision(later))


def test_the_bug_after_training_ends_the_job_when_it_recurs_at_the_same_step() -> None:
    ft = FaultTolerance()
    c = classify_exit(ExitEvidence("w", 1, log_tail=KEY_ERROR, progressed=True))
    first = Failure("w", "worker", 0, 1, 100, 10.0, c, progress=500, uptime_s=900.0)
    d1 = decide_failure(ft, Budgets(), first)
    assert isinstance(d1, RestartJob)
    again = Failure("w", "worker", 0, 2, 101, 20.0, c, progress=500, uptime_s=900.0)
    d2 = decide_failure(ft, Budgets().after(first, d1), again)
    assert isinstance(d2, FailJob)
    assert "the same error at step 500" in d2.reason
