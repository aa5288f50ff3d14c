"""Transient outages ridden out with backoff (issue 38): pure, no clock, no process.

A failure read as an outage of something outside the job -- a remote service, storage,
the network, the rendezvous -- is retried after a wait that doubles with each such retry
in a row (`transient_backoff_s`, then 2x, 4x ... up to `transient_backoff_max_s`): a
retry at once only meets the same outage again.

Which failures are outages: the catalogue's classes do not say (`retryable_message` also
covers GPU faults and collective timeouts, which a wait does not cure), so the category
comes from the rule that decided, the signature id `Classification.rule` carries
(`<id>-untrained` where the start-up context re-read it). Classification is untouched.

A *sure* outage is one read with confidence (not `uncertain`) and not re-read as a
possible start-up misconfiguration (`-untrained`): only those are spared by the history
rule while their backoff lasts (see `trainguard.policy.decisions`).

The streak (which retry in a row this is) lives in `Budgets`: it restarts at 1 after a
failure that is not an outage, and when the job trained past the step of the last outage.
The backoff is *spent* once a retry has waited the cap: `ladder(ft)` retries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainguard.classify.classes import Classification
from trainguard.policy.actions import Decision, RestartGroup, RestartJob, RestartReplica
from trainguard.policy.budgets import Budgets, Failure
from trainguard.spec.models import FaultTolerance

OUTAGE_RULES: dict[str, str] = {
    "remote-5xx": "remote service",
    "remote-connection-dropped": "remote service",
    "object-store-throttle": "remote service",
    "image-pull-timeout": "remote service",
    "scheduler-unreachable": "remote service",
    "remote-io": "storage",
    "stale-nfs": "storage",
    "storage-io": "storage",
    "network-timeout": "network",
    "connection-refused": "network",
    "rendezvous-failure": "rendezvous",
}
"""Catalogue signatures that name an outage outside the job, and what went out. Not
here: peer-connection-lost, collective timeouts, NCCL errors (a peer's death or a slow
rank, which the node check and the history rule deal with), GPU faults."""

_UNTRAINED = "-untrained"


def outage_kind(c: Classification) -> str | None:
    """What a retryable failure says went out (None: not an outage)."""
    if not c.retryable:
        return None
    rule = c.rule.removesuffix(_UNTRAINED)
    return OUTAGE_RULES.get(rule)


def is_sure_outage(c: Classification) -> bool:
    """An outage the evidence is sure of: the history rule waits for its backoff."""
    return outage_kind(c) is not None and not c.uncertain and not c.rule.endswith(_UNTRAINED)


def ladder(ft: FaultTolerance) -> int:
    """How many retries in a row the backoff takes to reach its cap (its budget)."""
    base, cap = ft.transient_backoff_s, ft.transient_backoff_max_s
    if base <= 0:
        return 0
    steps, delay = 1, base
    while delay < cap:
        steps, delay = steps + 1, delay * 2
    return steps


def delay_s(ft: FaultTolerance, step: int) -> float:
    """The wait before the `step`-th retry in a row (1-based)."""
    return min(ft.transient_backoff_max_s, ft.transient_backoff_s * 2.0 ** (step - 1))


def next_step(b: Budgets, failure: Failure) -> int:
    """Which retry in a row this outage's would be."""
    if b.outage_streak == 0:
        return 1
    now, then = failure.progress, b.outage_progress
    if now is not None and (then is None or now > then):
        return 1  # the job trained on since the last outage: a new outage
    return b.outage_streak + 1


@dataclass(frozen=True)
class Backoff:
    """The wait a decision carries before its restart, and where on the ladder it is."""

    kind: str
    step: int
    steps: int
    delay_s: float

    def __str__(self) -> str:
        where = f"backoff {self.step} of {self.steps}"
        if self.step > self.steps:
            where = f"backoff {self.step}, at its cap"
        return f"a {self.kind} outage: retried in {self.delay_s:g} s ({where})"

    @property
    def spent(self) -> bool:
        """Past the ladder: a start-up recurrence is the history rule's again."""
        return self.step > self.steps


def backoff_for(ft: FaultTolerance, b: Budgets, failure: Failure) -> Backoff | None:
    """The backoff of a failure about to be retried, or None (not an outage, or off)."""
    kind = outage_kind(failure.classification)
    steps = ladder(ft)
    if kind is None or steps == 0:
        return None
    step = next_step(b, failure)
    return Backoff(kind, step, steps, delay_s(ft, step))


def rides_out(backoff: Backoff | None, failure: Failure) -> bool:
    """A sure outage recurring in start-up (no step known) while its backoff lasts: the
    history rule leaves it be."""
    sure = is_sure_outage(failure.classification)
    return sure and backoff is not None and not backoff.spent and failure.progress is None


def waiting(d: Decision, backoff: Backoff) -> Decision:
    """A restart that waits out an outage's backoff first (other decisions as they are)."""
    if isinstance(d, RestartJob | RestartReplica):
        why = f"{d.reason}; {backoff}"
        return replace(d, reason=why, delay_s=backoff.delay_s, backoff_step=backoff.step)
    if isinstance(d, RestartGroup):
        after_s = max(d.after_s, backoff.delay_s)
        why = f"{d.reason}; {backoff}"
        return replace(d, reason=why, after_s=after_s, backoff_step=backoff.step)
    return d
