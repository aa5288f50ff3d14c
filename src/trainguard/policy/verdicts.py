"""The decisions besides a replica's failure: a start that finds no capacity, the wait
for capacity and its expiry, success (whole or partial), when the exit-hang timer is
armed, and whether a hang report is a hang. Pure: the master passes in what it observed
(and `now`, as a number) and executes the value it gets back.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from trainguard.policy.actions import Decision, Expire, FailJob, Ignore, Succeed, WaitForCapacity
from trainguard.spec.models import QueuePolicy
from trainguard.states import ErrorCode


def decide_no_capacity(reason: str, message: str, queue: QueuePolicy) -> WaitForCapacity | FailJob:
    """A new attempt found too few GPUs or no capacity on the cluster: wait for it
    (`queue.wait_for_capacity`, Vertex's flex-start) or fail the job."""
    if queue.wait_for_capacity:
        return WaitForCapacity(reason, message)
    return FailJob(ErrorCode.CAPACITY, message, reason)


def decide_capacity_wait(
    queue: QueuePolicy, waited_s: float, reason: str, message: str
) -> WaitForCapacity | Expire:
    """Keep waiting (a new try in `capacity_retry_s`) or, past `max_wait_s`, expire."""
    if queue.max_wait_s is not None and waited_s >= queue.max_wait_s:
        why = f"waited {waited_s:.0f} s for capacity, max_wait_s is {queue.max_wait_s:g}"
        return Expire(why, message)
    budget = "no max_wait_s" if queue.max_wait_s is None else f"max_wait_s {queue.max_wait_s:g}"
    return WaitForCapacity(
        f"waiting for capacity ({waited_s:.0f} s so far, {budget}), next try in "
        f"{queue.capacity_retry_s:g} s: {reason}",
        message,
    )


def decide_success(
    reason: str, given_up: Collection[str], replicas: int, allow_partial: bool
) -> Succeed:
    """The job succeeded; in part (PARTIAL) when some replicas (named) were given up."""
    if given_up and allow_partial:
        gone = sorted(given_up)
        message = (
            f"partial success: {replicas - len(gone)} of {replicas} replicas succeeded; "
            f"given up: {', '.join(gone)}"
        )
        return Succeed(message, ErrorCode.PARTIAL, message)
    return Succeed(reason)


def arm_exit_hang(decision: Decision, enabled: bool, armed: bool) -> bool:
    """A replica exited 0 and the job waits for the others: start the exit-hang timer,
    once (the others must follow within `job_exit_hang_interval_s`)."""
    return isinstance(decision, Ignore) and enabled and not armed


@dataclass(frozen=True)
class HangCleared:
    """The hang report was not a hang; `starting` replicas get their start-up allowance."""

    reason: str
    starting: tuple[str, ...] = ()


def judge_hang(
    kind: str, life_while_snapshotting: bool, importing: tuple[str, ...], within_startup: bool
) -> HangCleared | None:
    """Whether a hang report stands once every stack was taken; None: it is a hang.

    A sign of life while the stacks were taken clears it; so does a replica whose main
    thread is inside an import while the attempt is within its start-up allowance (torch
    takes seconds to import on a fresh machine).
    """
    if kind != "exit_hang" and life_while_snapshotting:
        return HangCleared("the job showed a sign of life while its stacks were taken")
    if kind == "hang" and importing and within_startup:
        who = ", ".join(importing)
        return HangCleared(f"{who} still importing modules", importing)
    return None
