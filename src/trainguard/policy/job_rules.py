"""The master's last rules of its own, pure: what an exit makes of its replica and whether
it is judged at all, when an attempt is running, success once replicas were given up (or
groups left down), when a wait for capacity starts, the exit-hang deferral during
start-up, a hang's culprit, what an internal error leads to, and when a replica counts
as trained. The master builds a `JobView` (and passes an event's facts) and executes the
value it gets back; nothing here reads a clock, a process or the master itself.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from trainguard.classify.classes import INTERNAL_ERROR_MESSAGE, ExitKind
from trainguard.policy.actions import Decision, FailJob, RestartJob, Succeed
from trainguard.policy.decisions import STARTUP_WINDOW_S
from trainguard.policy.verdicts import decide_success
from trainguard.spec.models import SuccessPolicy
from trainguard.states import ErrorCode, JobState, ReplicaState

_RESTARTABLE = (JobState.PENDING, JobState.RUNNING, JobState.RESTARTING)
"""Where an internal error may restart the job: not while it is cancelled, nor ended."""


@dataclass(frozen=True)
class JobView:
    """The job as the rules see it at one moment; built by the master, never kept."""

    state: JobState
    attempt: int
    torn_down: bool = False  # the attempt is being stopped: its exits decide nothing
    replicas: tuple[tuple[str, ReplicaState], ...] = ()
    given_up: frozenset[str] = frozenset()
    all_done: bool = False  # every replica that is up succeeded or was given up (where read)
    success_policy: SuccessPolicy = SuccessPolicy.ALL
    allow_partial: bool = False
    capacity_since: float | None = None  # when the current wait for capacity began
    capacity_attempt: int = -1  # the attempt that last ended waiting for capacity


def exit_state(kind: ExitKind) -> ReplicaState:
    """Where an exit leaves its replica's run: SUCCEEDED (exited 0), STOPPED (the master
    asked it to), FAILED otherwise."""
    if kind is ExitKind.CLEAN:
        return ReplicaState.SUCCEEDED
    if kind is ExitKind.STOP_REQUESTED:
        return ReplicaState.STOPPED
    return ReplicaState.FAILED


def exit_decides(view: JobView) -> bool:
    """Whether an exit of the current attempt is judged: not while the job is cancelling
    or ended, nor while the attempt is being stopped (the exit is a consequence)."""
    state = view.state
    return not (state is JobState.CANCELLING or state.is_terminal or view.torn_down)


def groups_done(reason: str, groups_down: Collection[int]) -> str:
    """Why the job succeeds, when groups that were down are not started again."""
    if not groups_down:
        return reason
    down = ", ".join(map(str, sorted(groups_down)))
    return (
        f"every group that is up exited 0 (training is done); group {down}, down for a "
        "restart, is not started again"
    )


def running_reason(view: JobView) -> str | None:
    """Why the job is RUNNING now, or None while it is not (yet).

    RUNNING once every replica of a new attempt has started; some may have exited already
    (one that finishes at once, one started last on a slow backend): counting them keeps
    the job from waiting forever to run.
    """
    if view.state not in (JobState.PENDING, JobState.RESTARTING) or view.torn_down:
        return None
    states = [state for _, state in view.replicas]
    running = states.count(ReplicaState.RUNNING)
    if any(map(holds_running, states)) or not running:
        return None
    n = len(states)
    what = f"all {n} replicas running"
    if running < n:
        what = f"all {n} replicas started, {n - running} already exited"
    return f"attempt {view.attempt}: {what}"


def holds_running(state: ReplicaState) -> bool:
    """Whether one replica in `state` keeps its attempt from RUNNING, whatever the others
    (`running_reason` is None): while one does, the master need not build a view to ask."""
    return state is ReplicaState.STARTING


def success_after_give_up(view: JobView) -> Succeed | None:
    """A replica was just given up: with `success_policy: all`, the job succeeds when the
    rest already did (in part, PARTIAL, where `allow_partial`). None: it goes on."""
    if view.success_policy is not SuccessPolicy.ALL or not view.all_done:
        return None
    reason = "every replica exited 0 or was given up"
    return decide_success(reason, view.given_up, len(view.replicas), view.allow_partial)


def capacity_wait_start(view: JobView, now_s: float) -> float:
    """When the wait for capacity that the current attempt ends in began: one wait runs
    over consecutive attempts that each ended waiting, a new one starts otherwise."""
    since = view.capacity_since
    if since is None or view.capacity_attempt < view.attempt - 1:
        return now_s
    return since


def exit_hang_deferral(kind: str, startup_left_s: float, interval_s: float) -> float | None:
    """An exit-hang report while a peer is still within its start-up allowance (it has
    shown no sign of life yet): ask again after this many seconds. None: judge it now."""
    if kind != "exit_hang" or startup_left_s <= 0:
        return None
    return min(startup_left_s, interval_s)


def hang_culprit(
    diagnosed: str | None, reported: str | None, group_ranks: Sequence[str], primary: str
) -> str:
    """Whom a hang is blamed on: the replica the stacks name, else the one the report
    names, else the group's first rank (a group's hang), else the primary replica."""
    if diagnosed:
        return diagnosed
    if reported:
        return reported
    return group_ranks[0] if group_ranks else primary


def after_internal_error(view: JobView, decision: Decision, reason: str) -> RestartJob | FailJob:
    """What a fault of trainguard leads to: the restart the failure policy decided (as
    Vertex retries its own errors), while the job is live and not being cancelled; the
    job fails with INTERNAL otherwise (a cancel is not undone by a restart)."""
    if isinstance(decision, RestartJob) and view.state in _RESTARTABLE:
        return decision
    return fail_internal(reason)


def fail_internal(reason: str) -> FailJob:
    """The job fails with INTERNAL (its message says it was trainguard's fault)."""
    return FailJob(ErrorCode.INTERNAL, INTERNAL_ERROR_MESSAGE, reason)


def trained(
    sdk_step: int | None, printed_step: int | None, started_s: float | None, now_s: float
) -> bool:
    """Whether a replica is past start-up: the SDK reported a step, its output printed a
    step past 0, or it ran for STARTUP_WINDOW_S."""
    if sdk_step is not None or printed_step:
        return True
    return started_s is not None and now_s - started_s >= STARTUP_WINDOW_S


def within_startup(attempt_started_s: float, allowance_s: float, now_s: float) -> bool:
    """Whether the attempt is younger than its start-up allowance."""
    return now_s - attempt_started_s < allowance_s
