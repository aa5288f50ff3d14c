"""Is a job's master still alive? If not, the job is INTERRUPTED, not RUNNING forever.

A pid alone can be reused, so a master is identified by (host, pid, start time in
clock ticks since boot, from /proc/<pid>/stat).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from trainguard.records.rows import JobRow
from trainguard.records.store import Store
from trainguard.states import ErrorCode, JobState


def process_start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot); None if it is gone, or dead and
    not yet reaped by its parent (a zombie runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # field 3 overall: the state (zombie, dead)
        return None
    return int(fields[19])  # field 22 overall: starttime


def _identity(prefix: str) -> dict[str, object]:
    pid = os.getpid()
    return {
        f"{prefix}_pid": pid,
        f"{prefix}_host": socket.gethostname(),
        f"{prefix}_started_ticks": process_start_ticks(pid),
    }


def master_identity() -> dict[str, object]:
    """This process, as the job's master (written by the master itself, and only by it)."""
    return _identity("master")


def starter_identity() -> dict[str, object]:
    """This process, as the server that admitted a job whose master is not up yet."""
    return _identity("starter")


def master_up(job: JobRow) -> bool:
    """Whether the job's master has written its identity (a server job's, once started)."""
    return job.master_pid is not None


def master_alive(job: JobRow) -> bool:
    """The master's process still runs; before it is up, the server that starts it does."""
    if not master_up(job) and job.starter_pid is not None:
        return _alive(job.starter_host, job.starter_pid, job.starter_started_ticks)
    return _alive(job.master_host, job.master_pid, job.master_started_ticks)


def _alive(host: str | None, pid: int | None, started_ticks: int | None) -> bool:
    if host != socket.gethostname():
        return True  # another machine's process: not ours to judge
    if not isinstance(pid, int):
        return False
    ticks = process_start_ticks(pid)
    return ticks is not None and ticks == started_ticks


def reap_interrupted(store: Store) -> list[str]:
    """Mark live jobs whose master is gone as INTERRUPTED (CANCELLED if a cancel waited for a
    master that never came up); returns their ids."""
    reaped: list[str] = []
    for job in store.live_jobs():
        if master_alive(job):
            continue
        state, code = JobState.INTERRUPTED, ErrorCode.MASTER_LOST
        if master_up(job):
            msg = (
                f"The master (pid {job.master_pid}) stopped while the job was "
                f"{job.state}; the job was interrupted."
            )
        else:
            msg = f"The server (pid {job.starter_pid}) stopped before the job's master was up."
            if job.cancel_requested_at_s is not None:  # the held cancel: never auto-resumed
                state, code = JobState.CANCELLED, ErrorCode.CANCELLED
                msg += " It had been cancelled meanwhile."
        if store.set_state_if(
            str(job.id),
            str(job.state),
            state.value,
            time.time(),
            ended_at_s=time.time(),
            error_code=code,
            error_message=msg,
        ):
            store.close_open_rows(str(job.id), time.time(), "interrupted")
            reaped.append(str(job.id))
    return reaped
