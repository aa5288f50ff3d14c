"""Runs one job in this process: the embedded master of `trainguard run` (R-RUN-1)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from trainguard.backends.api import Backend
from trainguard.backends.childwatch import pidfd_child_watcher
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.mpi.backend import MpiBackend
from trainguard.errors import ResumeError
from trainguard.frameworks import preset
from trainguard.frameworks.replica_plan import plan_replicas
from trainguard.master.events import Outcome
from trainguard.master.loop import Master
from trainguard.notify.notifier import Notifier
from trainguard.records.control import check_resumable
from trainguard.records.liveness import master_identity, reap_interrupted
from trainguard.records.recorder import Recorder
from trainguard.records.rows import JobRow
from trainguard.records.store import Store
from trainguard.spec.models import JobSpec, validate_spec
from trainguard.spec.notify_rules import NotifyRule
from trainguard.states import JobState


def new_job_id() -> str:
    return f"tg-{time.strftime('%Y%m%d')}-{secrets.token_hex(3)}"


def _say_to(stream: TextIO) -> Callable[[str], None]:
    def say(msg: str) -> None:
        try:
            stream.write(f"trainguard: {msg}\n")
            stream.flush()
        except (OSError, ValueError):
            pass

    return say


def run_job(
    spec: JobSpec,
    store: Store,
    *,
    tee: TextIO | None = sys.stdout,
    status: TextIO | None = None,
    cwd: str | None = None,
    say: Callable[[str], None] | None = None,
    job_id: str | None = None,
) -> tuple[str, Outcome]:
    """Create the job, supervise it to a terminal state, and return its outcome.

    trainguard's own lines go to `say` if given, else to `status` (stderr)."""
    reap_interrupted(store)
    job_id = job_id or new_job_id()
    log_dir = store.home / "jobs" / job_id
    recorder = Recorder(store, job_id)
    cwd = cwd or os.getcwd()
    recorder.job_created(
        name=spec.name,
        spec=spec,
        log_dir=log_dir,
        at_s=time.time(),
        master={**master_identity(), "cwd": cwd},
    )
    say = say or _say_to(status or sys.stderr)
    say(f"job {job_id} ({spec.name}): {spec.world_size} replica(s), logs in {log_dir}")
    return job_id, _master_run(job_id, spec, recorder, log_dir, cwd, tee, say, None)


def resume_job(
    job: JobRow,
    store: Store,
    *,
    tee: TextIO | None = sys.stdout,
    status: TextIO | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[str, Outcome]:
    """Continue `job` under this process as its new master: same id, a new attempt."""
    reap_interrupted(store)
    job = store.job(job.id)
    check_resumable(job)
    state = JobState(job.state)
    spec = validate_spec(json.loads(job.spec_json))
    job_id = str(job.id)
    recorder = Recorder(store, job_id)
    restarts = len(store.restarts_of(job_id))
    recorder.job_resumed(state, time.time(), master_identity())
    say = say or _say_to(status or sys.stderr)
    say(f"job {job_id} ({spec.name}): resumed after {job.attempts} attempt(s)")
    log_dir, cwd = Path(job.log_dir), job.cwd or os.getcwd()
    resume_after = (int(job.attempts), restarts)
    return job_id, _master_run(job_id, spec, recorder, log_dir, cwd, tee, say, resume_after)


def run_admitted(job_id: str, store: Store, *, status: TextIO = sys.stderr) -> Outcome:
    """The master of a job the server admitted (PENDING): a first run, or a resume."""
    job = store.job(job_id)
    if job.state != JobState.PENDING.value:
        raise ResumeError(f"job {job_id} is {job.state}, not admitted (PENDING)")
    spec = validate_spec(json.loads(job.spec_json))
    recorder = Recorder(store, job_id)
    store.update_job(job_id, **master_identity())
    restarts = len(store.restarts_of(job_id))
    resume_after = (int(job.attempts), restarts) if job.attempts else None
    say = _say_to(status)
    say(f"job {job_id} ({spec.name}): admitted, attempt {job.attempts}")
    log_dir, cwd = Path(job.log_dir), job.cwd or os.getcwd()
    return _master_run(job_id, spec, recorder, log_dir, cwd, None, say, resume_after)


def _master_run(
    job_id: str,
    spec: JobSpec,
    recorder: Recorder,
    log_dir: Path,
    cwd: str,
    tee: TextIO | None,
    say: Callable[[str], None],
    resume_after: tuple[int, int] | None,
) -> Outcome:
    """This process becomes the job's master (local backend) until the job ends."""
    rules = [*spec.notifications, *_server_rules()]
    if rules:
        recorder.notifier = Notifier(rules, job_id=job_id, job_name=spec.name)
    master = Master(
        job_id=job_id,
        spec=spec,
        backend=make_backend(spec, tee),
        recorder=recorder,
        log_dir=log_dir,
        cwd=cwd,
        say=say,
        resume_after=resume_after,
    )
    try:
        return asyncio.run(_supervise(master))
    finally:
        if recorder.notifier is not None:
            recorder.notifier.close(timeout_s=5.0)


def make_backend(spec: JobSpec, tee: TextIO | None) -> Backend:
    """The spec's backend (local processes, actors on a Ray cluster, or steps of a Slurm
    allocation), as the framework wants it (mpi: behind mpirun)."""
    backend: Backend
    if spec.backend == "ray":
        from trainguard.backends.ray.backend import RayBackend

        res = {pool.role: pool.resources for pool in spec.worker_pools}
        needs = {p.name: res[p.role] for p in plan_replicas(spec)}
        backend = RayBackend(needs, spec.ray, tee=tee, preload=spec.preload)
    elif spec.backend == "slurm":
        from trainguard.backends.slurm.backend import SlurmBackend

        backend = SlurmBackend(spec.slurm, tee=tee, replicas=spec.world_size)
    else:
        backend = LocalBackend(tee=tee, preload=spec.preload)
    if preset(spec.framework).launcher == "mpi":
        backend = MpiBackend(backend)
    return backend


def _server_rules() -> list[NotifyRule]:
    """The server's own notification rules, handed to the masters it starts."""
    text = os.environ.get("TRAINGUARD_NOTIFY_RULES")
    if not text:
        return []
    return [NotifyRule.model_validate(r) for r in json.loads(text)]


async def _supervise(master: Master) -> Outcome:
    loop = asyncio.get_running_loop()
    slurm = master.spec.backend == "slurm"
    for sig, why in _CANCEL_SIGNALS:
        if slurm and sig == signal.SIGTERM:
            why = "SIGTERM from Slurm: scancel, a time limit or a preemption"
        loop.add_signal_handler(sig, master.cancel, f"cancelled ({why})")
    notice = f"{signal.Signals(_NOTICE).name} to the master (sbatch --signal=B:USR1@SECONDS)"
    loop.add_signal_handler(_NOTICE, master.preemption_notice, notice)
    try:
        with pidfd_child_watcher(loop):
            return await master.run()
    finally:
        for sig, _ in (*_CANCEL_SIGNALS, (_NOTICE, "")):
            loop.remove_signal_handler(sig)


# Signals that cancel the job cleanly; a second one stops the replicas without grace.
_CANCEL_SIGNALS = (
    (signal.SIGINT, "Ctrl+C"),
    (signal.SIGTERM, "SIGTERM to the master"),
    (signal.SIGHUP, "the terminal closed"),
)


_NOTICE = signal.SIGUSR1
"""A warning that the job will be stopped soon (Slurm's `--signal`): tell the replicas."""


def log_dir_of(store: Store, job_id: str) -> Path:
    return store.home / "jobs" / job_id
