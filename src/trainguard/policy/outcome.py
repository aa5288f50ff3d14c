"""What the policy does with a failure seen first, as a job outcome (issue 38).

A decision is scored by what it costs the job: a retryable failure that is not retried
ends a job that a restart would have saved (a *false stop*: a person must restart it,
often the next morning); a permanent failure that is retried costs one attempt (the
history rule ends it at its second occurrence at the same point). `trainguard classify`
and the corpus' scores (tests/support/corpus_real_eval.py) ask this module, so both say what the
master would do, not what a reading of the log leans to.
"""

from __future__ import annotations

from trainguard.classify.classes import Classification
from trainguard.policy.actions import (
    Decision,
    RestartGroup,
    RestartJob,
    RestartReplica,
    WaitForCapacity,
)
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.spec.models import FaultTolerance

RETRIES = (RestartJob, RestartReplica, RestartGroup, WaitForCapacity)
"""Decisions that give the job another try."""


def first_decision(
    c: Classification, ft: FaultTolerance | None = None, replica: str = "worker-0"
) -> Decision:
    """The policy's decision on `c` as the job's first failure (fresh budgets, one replica)."""
    failure = Failure(replica, "worker", 0, 1, None, 0.0, c)
    return decide_failure(ft or FaultTolerance(), Budgets(), failure)


def retries(decision: Decision) -> bool:
    return isinstance(decision, RETRIES)
