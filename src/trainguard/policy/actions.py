"""What the fault-tolerance policy tells the master to do: one value type per action.

The policy (`decisions`) returns these and never acts; the master executes them and the
records keep `describe(decision)`. Apart from the policy so that the master, the
backends' callers and the records can name an action without importing the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.policy.budgets import Charge


@dataclass(frozen=True)
class RestartJob:
    """Stop every replica and start a new attempt, `delay_s` after the stop (an outage's
    backoff: `backoff_step` is which retry in a row it is, 0 for any other failure)."""

    reason: str
    charges: tuple[Charge, ...]
    delay_s: float = 0.0
    backoff_step: int = 0


@dataclass(frozen=True)
class RestartReplica:
    """Start this replica again alone, `delay_s` after its failure (as `RestartJob`)."""

    replica: str
    reason: str
    charges: tuple[Charge, ...]
    delay_s: float = 0.0
    backoff_step: int = 0


@dataclass(frozen=True)
class RestartGroup:
    """Stop the rest of a replica group and restart the whole group alone, `after_s`
    after its failure (torchft: once the Lighthouse has dropped the dead group); every
    other group trains on untouched."""

    group: int
    replicas: tuple[str, ...]
    after_s: float
    reason: str
    charges: tuple[Charge, ...]
    backoff_step: int = 0  # an outage's retry: `after_s` holds its backoff too


@dataclass(frozen=True)
class FailJob:
    """End the job. `proof`: what proved the failure permanent, or which limit ended it
    (a bug's rule, a recurrence, a spent budget); `message` ends with it too."""

    error_code: str
    message: str
    reason: str
    proof: str = ""


@dataclass(frozen=True)
class WaitForCapacity:
    """Stop, wait, and try again without charging a budget (queue.wait_for_capacity)."""

    reason: str
    message: str = ""  # what the job's error message says meanwhile, if not the failure's


@dataclass(frozen=True)
class GiveUpReplica:
    """Leave this replica failed and let the job go on without it."""

    replica: str
    reason: str


@dataclass(frozen=True)
class Succeed:
    reason: str
    error_code: str | None = None  # PARTIAL: some replicas were given up
    message: str | None = None


@dataclass(frozen=True)
class Expire:
    """The wait for capacity ran past `queue.max_wait_s`: the job ends EXPIRED."""

    reason: str
    message: str


@dataclass(frozen=True)
class Ignore:
    reason: str


Decision = (
    RestartJob
    | RestartReplica
    | RestartGroup
    | GiveUpReplica
    | FailJob
    | WaitForCapacity
    | Expire
    | Succeed
    | Ignore
)


def describe(decision: Decision) -> str:
    """One line for records and logs: what was decided, why, and what it cost."""
    name = type(decision).__name__
    charges = getattr(decision, "charges", ())
    cost = f" [charged {', '.join(map(str, charges))}]" if charges else ""
    target = f"({decision.replica})" if isinstance(decision, RestartReplica | GiveUpReplica) else ""
    if isinstance(decision, RestartGroup):
        target = f"(group {decision.group}: {', '.join(decision.replicas)})"
    proof = (
        f" [proof: {decision.proof}]" if isinstance(decision, FailJob) and decision.proof else ""
    )
    return f"{name}{target}: {decision.reason}{cost}{proof}"
