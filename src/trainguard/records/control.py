"""Asking a job to stop or go on, from any process: the CLI, or the server on its behalf."""

from __future__ import annotations

import json
import os
import signal
import time

from trainguard.errors import ResumeError
from trainguard.records.liveness import (
    master_alive,
    master_identity,
    master_up,
    reap_interrupted,
)
from trainguard.records.rows import JobRow
from trainguard.records.store import Store
from trainguard.states import ErrorCode, JobState

RESUMABLE = (JobState.INTERRUPTED, JobState.CANCELLED)
"""A job stopped from outside can go on; one that succeeded or failed on its own is done."""


def request_cancel(store: Store, job: JobRow) -> str:
    """Cancel `job` without waiting: a queued job at once, a running one via its master."""
    state = JobState(job.state)
    if state.is_terminal:
        return f"job {job.id} is already {state.value}; nothing to cancel"
    if state is JobState.QUEUED and store.set_state_if(
        job.id,
        JobState.QUEUED.value,
        JobState.CANCELLED.value,
        time.time(),
        ended_at_s=time.time(),
        error_code=ErrorCode.CANCELLED,
        error_message="cancelled while queued",
        queued_reason=None,
    ):
        return f"job {job.id} CANCELLED (it was queued)"
    job = store.job(job.id)  # as it is now: admitted meanwhile, or its master up
    if not master_up(job):
        # Admitted, its master starting: the row holds no master to ask (and never the
        # server's pid), so the cancel waits in the row for the master, which applies it.
        if store.hold_cancel(job.id, time.time()):
            if not master_alive(job):  # the server starting it is gone: no master will come
                reap_interrupted(store)
                return f"job {job.id} CANCELLED (its master never came up)"
            return f"job {job.id}: cancel requested (its master applies it as it starts)"
        job = store.job(job.id)  # it came up (or the job ended) meanwhile
    if JobState(job.state).is_terminal:
        return f"job {job.id} is already {job.state}; nothing to cancel"
    if not master_alive(job):
        reap_interrupted(store)
        return f"job {job.id}: its master is gone; marked {JobState.INTERRUPTED.value}"
    assert job.master_pid is not None  # master_alive() said it runs
    os.kill(job.master_pid, signal.SIGTERM)  # the master cancels with grace
    return f"job {job.id}: cancel requested"


HELD_CANCEL = "cancelled before its master was up"


def claim_master(store: Store, job_id: str) -> str | None:
    """This process becomes the master of an admitted job; returns the reason of a cancel
    held for it meanwhile (the master then cancels), else None.

    Call it with the cancel signals blocked until the master handles them: once this pid
    is in the row, a cancel signals it instead of waiting in the row.
    """
    job = store.claim_master(job_id, master_identity())
    if job is None:
        now = store.job(job_id).state
        raise ResumeError(f"job {job_id} is {now}, not admitted (PENDING)")
    return HELD_CANCEL if job.cancel_requested_at_s is not None else None


def cancel_deadline_s(job: JobRow) -> float:
    """How long a master may take to stop its replicas after a cancel."""
    grace = json.loads(job.spec_json)["fault_tolerance"]["stop_grace_period_s"]
    return float(grace) + 30.0


def check_resumable(job: JobRow) -> None:
    state = JobState(job.state)
    if state not in RESUMABLE:
        live = "" if state.is_terminal else f" (its master, pid {job.master_pid}, is alive)"
        raise ResumeError(
            f"job {job.id} is {state.value}{live}; only an interrupted or cancelled "
            "job can be resumed"
        )
