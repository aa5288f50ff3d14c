"""The master's last rules of its own, as pure functions over a frozen view (issue 39):
what an exit makes of its replica and whether it is judged, when an attempt runs,
success once replicas were given up (or groups left down), when a wait for capacity
starts, the exit-hang deferral during start-up, a hang's culprit, what an internal error
leads to, and when a replica counts as trained. Tables; nothing runs."""

from __future__ import annotations

import dataclasses

import pytest

from trainguard.classify.classes import INTERNAL_ERROR_MESSAGE, ExitKind
from trainguard.policy.actions import Decision, FailJob, Ignore, RestartJob, Succeed
from trainguard.policy.decisions import STARTUP_WINDOW_S
from trainguard.policy.job_rules import (
    JobView,
    after_internal_error,
    capacity_wait_start,
    exit_decides,
    exit_hang_deferral,
    exit_state,
    groups_done,
    hang_culprit,
    running_reason,
    success_after_give_up,
    trained,
    within_startup,
)
from trainguard.spec.models import SuccessPolicy
from trainguard.states import ErrorCode, JobState, ReplicaState

S, R, OK, F, X = (
    ReplicaState.STARTING,
    ReplicaState.RUNNING,
    ReplicaState.SUCCEEDED,
    ReplicaState.FAILED,
    ReplicaState.STOPPED,
)


def view(state: JobState = JobState.PENDING, *replicas: ReplicaState, **values: object) -> JobView:
    named = tuple((f"worker-{i}", s) for i, s in enumerate(replicas))
    return JobView(state=state, attempt=2, replicas=named, **values)  # type: ignore[arg-type]


def test_the_view_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        view().state = JobState.RUNNING  # type: ignore[misc]


@pytest.mark.parametrize(
    ("state", "replicas", "torn_down", "expected"),
    [
        (JobState.PENDING, (R, R), False, "attempt 2: all 2 replicas running"),
        (JobState.RESTARTING, (R, R, R), False, "attempt 2: all 3 replicas running"),
        (
            JobState.PENDING,
            (R, OK, R),
            False,
            "attempt 2: all 3 replicas started, 1 already exited",
        ),
        (JobState.PENDING, (R, F), False, "attempt 2: all 2 replicas started, 1 already exited"),
        (JobState.PENDING, (R, S), False, None),  # one still starting
        (JobState.PENDING, (OK, F), False, None),  # none runs: nothing to watch
        (JobState.RESTARTING, (R, R), True, None),  # the attempt is being stopped
        (JobState.RUNNING, (R, R), False, None),  # already running
        (JobState.CANCELLING, (R, R), False, None),
        (JobState.SUCCEEDED, (R, R), False, None),
    ],
)
def test_the_job_runs_once_every_replica_started(
    state: JobState, replicas: tuple[ReplicaState, ...], torn_down: bool, expected: str | None
) -> None:
    assert running_reason(view(state, *replicas, torn_down=torn_down)) == expected


PARTIAL_1 = "partial success: 1 of 2 replicas succeeded; given up: worker-1"


@pytest.mark.parametrize(
    ("policy", "all_done", "allow_partial", "expected"),
    [
        (SuccessPolicy.ALL, True, False, Succeed("every replica exited 0 or was given up")),
        (SuccessPolicy.ALL, True, True, Succeed(PARTIAL_1, ErrorCode.PARTIAL, PARTIAL_1)),
        (SuccessPolicy.ALL, False, True, None),  # others still run
        (SuccessPolicy.CHIEF, True, True, None),  # the chief's exit decides, not a give-up
        (SuccessPolicy.CHIEF, False, False, None),
    ],
)
def test_success_after_a_replica_is_given_up(
    policy: SuccessPolicy, all_done: bool, allow_partial: bool, expected: Succeed | None
) -> None:
    v = view(
        JobState.RUNNING,
        OK,
        F,
        given_up=frozenset({"worker-1"}),
        all_done=all_done,
        success_policy=policy,
        allow_partial=allow_partial,
    )
    assert success_after_give_up(v) == expected


@pytest.mark.parametrize(
    ("since", "last_attempt", "attempt", "expected"),
    [
        (None, -1, 0, 100.0),  # the first wait starts now
        (40.0, 1, 2, 40.0),  # the previous attempt ended waiting too: the same wait
        (40.0, 2, 2, 40.0),  # the same attempt waits again (its start found none)
        (40.0, 0, 2, 100.0),  # an attempt in between ran: a new wait
    ],
)
def test_a_wait_for_capacity_runs_over_consecutive_attempts(
    since: float | None, last_attempt: int, attempt: int, expected: float
) -> None:
    v = dataclasses.replace(
        view(), attempt=attempt, capacity_since=since, capacity_attempt=last_attempt
    )
    assert capacity_wait_start(v, 100.0) == expected


@pytest.mark.parametrize(
    ("kind", "startup_left_s", "interval_s", "expected"),
    [
        ("exit_hang", 30.0, 60.0, 30.0),  # the start-up allowance runs out first
        ("exit_hang", 90.0, 60.0, 60.0),  # asked again after one interval at most
        ("exit_hang", 0.0, 60.0, None),  # every peer showed life: judge it now
        ("hang", 30.0, 60.0, None),  # a hang has its own start-up rule (judge_hang)
    ],
)
def test_an_exit_hang_waits_for_the_start_up_allowance(
    kind: str, startup_left_s: float, interval_s: float, expected: float | None
) -> None:
    assert exit_hang_deferral(kind, startup_left_s, interval_s) == expected


@pytest.mark.parametrize(
    ("diagnosed", "reported", "ranks", "expected"),
    [
        ("worker-3", "worker-1", ("worker-2",), "worker-3"),  # the stacks name it
        (None, "worker-1", ("worker-2",), "worker-1"),  # the report names it
        ("", "", ("worker-2", "worker-3"), "worker-2"),  # a group's hang: its first rank
        (None, None, (), "worker-0"),  # the job's hang: the primary
    ],
)
def test_the_culprit_of_a_hang(
    diagnosed: str | None, reported: str | None, ranks: tuple[str, ...], expected: str
) -> None:
    assert hang_culprit(diagnosed, reported, ranks, "worker-0") == expected


RESTART = RestartJob("internal errors are retried", ())
FAIL = FailJob(ErrorCode.INTERNAL, INTERNAL_ERROR_MESSAGE, "internal error: boom")


@pytest.mark.parametrize(
    ("state", "decision", "expected"),
    [
        (JobState.PENDING, RESTART, RESTART),
        (JobState.RUNNING, RESTART, RESTART),
        (JobState.RESTARTING, RESTART, RESTART),
        (JobState.CANCELLING, RESTART, FAIL),  # a cancel is not undone by a restart
        (JobState.SUCCEEDED, RESTART, FAIL),  # ended: nothing to restart
        (JobState.RUNNING, FailJob("7", "budget spent", "no"), FAIL),  # the budget is spent
        (JobState.RUNNING, Ignore("nothing to do"), FAIL),
    ],
)
def test_what_an_internal_error_leads_to(
    state: JobState, decision: Decision, expected: Decision
) -> None:
    assert after_internal_error(view(state), decision, "internal error: boom") == expected


W = STARTUP_WINDOW_S


@pytest.mark.parametrize(
    ("sdk_step", "printed_step", "started_s", "now_s", "expected"),
    [
        (0, None, None, 0.0, True),  # the SDK reported a step, even step 0
        (None, 12, 100.0, 101.0, True),  # its output printed a step
        (None, 0, 100.0, 101.0, False),  # a printed "step 0" comes before training
        (None, None, 100.0, 100.0 + W, True),  # ran through the start-up window
        (None, None, 100.0, 100.0 + W - 1, False),
        (None, None, None, 1e9, False),  # never seen starting
    ],
)
def test_when_a_replica_counts_as_trained(
    sdk_step: int | None,
    printed_step: int | None,
    started_s: float | None,
    now_s: float,
    expected: bool,
) -> None:
    assert trained(sdk_step, printed_step, started_s, now_s) is expected


@pytest.mark.parametrize(
    ("now_s", "expected"), [(100.0, True), (159.9, True), (160.0, False), (500.0, False)]
)
def test_an_attempt_within_its_start_up_allowance(now_s: float, expected: bool) -> None:
    assert within_startup(100.0, 60.0, now_s) is expected


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (ExitKind.CLEAN, OK),
        (ExitKind.STOP_REQUESTED, X),
        (ExitKind.NONZERO, F),
        (ExitKind.SIGNAL, F),
        (ExitKind.SPAWN_ERROR, F),
        (ExitKind.NODE_LOST, F),
        (ExitKind.HANG, F),
    ],
)
def test_what_an_exit_makes_of_its_replica(kind: ExitKind, expected: ReplicaState) -> None:
    assert exit_state(kind) is expected


@pytest.mark.parametrize(
    ("state", "torn_down", "expected"),
    [
        (JobState.PENDING, False, True),
        (JobState.RUNNING, False, True),
        (JobState.RESTARTING, False, True),  # the next attempt's exits are judged
        (JobState.RESTARTING, True, False),  # the attempt being stopped: a consequence
        (JobState.CANCELLING, False, False),
        (JobState.SUCCEEDED, False, False),
        (JobState.FAILED, False, False),
        (JobState.CANCELLED, False, False),
        (JobState.EXPIRED, False, False),
    ],
)
def test_which_exits_are_judged(state: JobState, torn_down: bool, expected: bool) -> None:
    assert exit_decides(view(state, R, R, torn_down=torn_down)) is expected


@pytest.mark.parametrize(
    ("down", "expected"),
    [
        ((), "every replica exited 0"),
        (
            (2,),
            "every group that is up exited 0 (training is done); group 2, down for a restart, "
            "is not started again",
        ),
        (
            (3, 1),
            "every group that is up exited 0 (training is done); group 1, 3, down for a "
            "restart, is not started again",
        ),
    ],
)
def test_why_a_job_succeeds_with_groups_down(down: tuple[int, ...], expected: str) -> None:
    assert groups_done("every replica exited 0", down) == expected
