"""The transitions tables of `JobState` and `ReplicaState` (issue 39): every listed move
is legal, every other one raises; the master raises on an illegal move under strict
transitions (the tests) and records it as an internal error otherwise."""

from __future__ import annotations

import asyncio
from itertools import product
from pathlib import Path

import pytest
from fakes import FakeBackend, make_master

from trainguard import states as states_module
from trainguard.backends.interface import ReplicaExited, ReplicaStarted
from trainguard.classify.classes import ExitEvidence
from trainguard.master.loop import Master
from trainguard.master.moves import INTERNAL_EVENT
from trainguard.states import (
    JOB_MOVES,
    REPLICA_MOVES,
    IllegalTransition,
    JobState,
    ReplicaState,
    check_move,
)

State = JobState | ReplicaState


def _pairs(listed: bool) -> list[tuple[State, State]]:
    """Every move that the states' tables list (or do not), in the states' own order."""
    jobs = product(JobState, JobState)
    replicas = product(ReplicaState, ReplicaState)
    return [
        *((old, new) for old, new in jobs if (new in JOB_MOVES[old]) == listed),
        *((old, new) for old, new in replicas if (new in REPLICA_MOVES[old]) == listed),
    ]


UNLISTED = _pairs(listed=False)


def test_every_state_has_a_row() -> None:
    assert set(JOB_MOVES) == set(JobState)
    assert set(REPLICA_MOVES) == set(ReplicaState)


def test_every_listed_move_is_legal() -> None:
    for old, new in _pairs(listed=True):
        check_move(old, new)


def test_every_other_move_raises() -> None:
    for old, new in UNLISTED:
        with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
            check_move(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (JobState.SUCCEEDED, JobState.RUNNING),  # an ended job stays ended
        (JobState.FAILED, JobState.RESTARTING),
        (JobState.CANCELLING, JobState.RESTARTING),  # a cancel is not undone
        (JobState.RUNNING, JobState.PENDING),
        (JobState.RUNNING, JobState.RUNNING),
        (JobState.QUEUED, JobState.RUNNING),  # admitted first
        (ReplicaState.SUCCEEDED, ReplicaState.RUNNING),  # an ended run does not run again
        (ReplicaState.FAILED, ReplicaState.RUNNING),
        (ReplicaState.RUNNING, ReplicaState.STARTING),  # restarted only once it ended
        (JobState.RUNNING, ReplicaState.RUNNING),  # a job's state is no replica's
    ],
    ids=str,
)
def test_illegal_moves(old: State, new: State) -> None:
    assert (old, new) in UNLISTED or type(old) is not type(new)
    with pytest.raises(IllegalTransition):
        check_move(old, new)


def test_ended_jobs_move_only_when_resumed() -> None:
    for state in JobState:
        if state.is_terminal:
            assert JOB_MOVES[state] <= {JobState.QUEUED, JobState.PENDING}, state


def test_the_docstring_draws_every_state() -> None:
    doc = states_module.__doc__ or ""
    for state in [*JobState, *ReplicaState]:
        assert state.value in doc, state


async def _drain(m: Master) -> None:
    while not m._queue.empty():
        await m.step(m._queue.get_nowait())


def test_the_master_raises_on_an_illegal_move_under_strict_transitions(tmp_path: Path) -> None:
    async def scenario() -> None:
        m, _ = make_master(tmp_path, FakeBackend())
        assert m.strict_transitions  # tests/conftest.py sets it for every test
        await m.begin()
        await _drain(m)
        assert m.state is JobState.RUNNING
        with pytest.raises(IllegalTransition, match="RUNNING -> PENDING"):
            m.actions.transition(JobState.PENDING, "not a move")
        with pytest.raises(IllegalTransition, match="RUNNING -> STARTING"):
            m.actions.move(m.replicas["worker-0"], ReplicaState.STARTING)
        await m.shutdown()

    asyncio.run(scenario())


def test_in_production_an_illegal_move_is_an_internal_error_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        m, store = make_master(tmp_path, FakeBackend())
        m.strict_transitions = False
        await m.begin()
        await _drain(m)
        m.actions.move(m.replicas["worker-1"], ReplicaState.STARTING)
        assert m.replicas["worker-1"].state is ReplicaState.STARTING  # made anyway
        (ev,) = [e for e in store.events_of("job-1") if e.kind == INTERNAL_EVENT]
        assert ev.replica == "worker-1"
        assert ev.text == "illegal ReplicaState move: RUNNING -> STARTING"
        assert m.state is JobState.RUNNING
        await m.shutdown()

    asyncio.run(scenario())


def test_an_internal_error_while_cancelling_fails_the_job_instead_of_restarting_it(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make_master(tmp_path, be)
        await m.begin()
        await _drain(m)
        m.actions.transition(JobState.CANCELLING, "cancelled by the user")  # as `_on_cancel` begins
        again = await m._internal_error(RuntimeError("the backend exploded"))
        assert not again  # no new attempt
        assert m.state is JobState.FAILED
        assert store.job("job-1").error_code == "INTERNAL"
        assert [t.to_state for t in store.transitions_of("job-1")][-2:] == ["CANCELLING", "FAILED"]
        assert store.restarts_of("job-1") == []
        await m.shutdown()

    asyncio.run(scenario())


def test_an_exit_taken_before_its_start_keeps_the_replica_ended(tmp_path: Path) -> None:
    """A stop's settle takes the exits queued behind their replicas' starts (issue 39: the
    start then moved an ended replica back to RUNNING and its run was never closed)."""

    async def scenario() -> None:
        be = FakeBackend()
        m, store = make_master(tmp_path, be)
        await m.begin()
        started = [m._queue.get_nowait() for _ in range(2)]
        assert all(isinstance(e, ReplicaStarted) for e in started)
        ev = ExitEvidence("worker-1", 0, log_tail=())
        await m.step(ReplicaExited(0, "worker-1", 0, started[1].pid, ev, 2.0))  # type: ignore[union-attr]
        for e in started:
            await m.step(e)
        assert m.replicas["worker-1"].state is ReplicaState.SUCCEEDED
        runs = [r for r in store.runs_of("job-1") if r.replica == "worker-1"]
        assert len(runs) == 1 and runs[0].state == "SUCCEEDED"
        await m.shutdown()

    asyncio.run(scenario())
