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


def master_identity() -> dict[str, object]:
    pid = os.getpid()
    return {
        "master_pid": pid,
        "master_host": socket.gethostname(),
        "master_started_ticks": process_start_ticks(pid),
    }


def master_alive(job: JobRow) -> bool:
    if job.master_host != socket.gethostname():
        return True  # another machine's master: not ours to judge
    pid = job.master_pid
    if not isinstance(pid, int):
        return False
    ticks = process_start_ticks(pid)
    return ticks is not None and ticks == job.master_started_ticks


def reap_interrupted(store: Store) -> list[str]:
    """Mark live jobs whose master is gone as INTERRUPTED; returns their ids."""
    reaped: list[str] = []
    for job in store.live_jobs():
        if master_alive(job):
            continue
        msg = (
            f"The master (pid {job.master_pid}) stopped while the job was "
            f"{job.state}; the job was interrupted."
        )
        if store.set_state_if(
            str(job.id),
            str(job.state),
            JobState.INTERRUPTED.value,
            time.time(),
            ended_at_s=time.time(),
            error_code=ErrorCode.MASTER_LOST,
            error_message=msg,
        ):
            store.close_open_rows(str(job.id), time.time(), "interrupted")
            reaped.append(str(job.id))
    return reaped
