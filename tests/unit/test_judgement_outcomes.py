"""Decide on outcomes (issue 38): what the default policy does with a first failure.

A job ends at once only on proof (a bug is never retried); what the evidence does not
settle gets one retry, and the history rule ends it if it recurs at the same point.
"""

from __future__ import annotations

import pytest

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.policy.actions import FailJob, RestartJob
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.policy.outcome import first_decision, retries
from trainguard.spec.models import FaultTolerance

KEY_ERROR = (
    "Traceback (most recent call last):",
    '  File "train.py", line 30, in <module>',
    "    batch = cfg['lr']",
    "KeyError: 'lr'",
)


def test_the_default_retries_what_the_evidence_does_not_settle() -> None:
    assert FaultTolerance().retry_uncertain
    bare = classify_exit(ExitEvidence("w", 1))  # a bare exit 1: nothing settles it
    assert bare.uncertain and not bare.retryable
    assert retries(first_decision(bare))
    assert isinstance(first_decision(bare, FaultTolerance(retry_uncertain=False)), FailJob)


@pytest.mark.parametrize("progressed", [False, None, True])
def test_a_bug_is_never_retried_whenever_it_strikes(progressed: bool | None) -> None:
    c = classify_exit(ExitEvidence("w", 1, log_tail=KEY_ERROR, progressed=progressed))
    assert c.rule == "python-bug" and not c.retryable and not c.uncertain
    d = first_decision(c)
    assert isinstance(d, FailJob) and d.proof


def test_an_unsettled_failure_after_training_is_retried_once_then_ended_at_the_same_step() -> None:
    ft = FaultTolerance()
    c = classify_exit(ExitEvidence("w", 3, log_tail=("step 500 loss 0.1",), progressed=True))
    assert c.uncertain and not c.retryable
    first = Failure("w", "worker", 0, 1, 100, 10.0, c, progress=500, uptime_s=900.0)
    d1 = decide_failure(ft, Budgets(), first)
    assert isinstance(d1, RestartJob)
    again = Failure("w", "worker", 0, 2, 101, 20.0, c, progress=500, uptime_s=900.0)
    d2 = decide_failure(ft, Budgets().after(first, d1), again)
    assert isinstance(d2, FailJob)
    assert "the same error at step 500" in d2.reason
