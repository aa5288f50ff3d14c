"""Asking a job to stop or go on, from any process: the CLI, or the server on its behalf."""

from __future__ import annotations

import json
import os
import signal
import time

from trainguard.errors import ResumeError
from trainguard.records.liveness import master_alive, reap_interrupted
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
    if not master_alive(job):
        reap_interrupted(store)
        return f"job {job.id}: its master is gone; marked {JobState.INTERRUPTED.value}"
    assert job.master_pid is not None  # master_alive() said it runs
    os.kill(job.master_pid, signal.SIGTERM)  # the master cancels with grace
    return f"job {job.id}: cancel requested"


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
