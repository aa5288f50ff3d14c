"""Runs one job in this process: the embedded master of `trainguard run` (R-RUN-1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from trainguard.backends.childwatch import pidfd_child_watcher
from trainguard.backends.interface import Backend
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.mpi.backend import MpiBackend
from trainguard.backends.preflight import refuse_unless_ready
from trainguard.classify.logtail import printable
from trainguard.errors import ResumeError
from trainguard.frameworks import preset
from trainguard.frameworks.replica_plan import plan_replicas
from trainguard.master.events import Outcome
from trainguard.master.loop import Master
from trainguard.notify.notifier import Notifier
from trainguard.records.control import check_resumable, claim_master
from trainguard.records.liveness import master_identity, reap_interrupted
from trainguard.records.recorder import Recorder
from trainguard.records.rows import JobRow
from trainguard.records.store import Store
from trainguard.spec.models import JobSpec, validate_spec
from trainguard.spec.notify_rules import NotifyRule
from trainguard.states import JobState
from trainguard.storage.ids import new_job_id


def _say_to(stream: TextIO) -> Callable[[str], None]:
    def say(msg: str) -> None:
        try:
            stream.write(f"trainguard: {printable(msg)}\n")
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
    refuse_unless_ready(spec.backend)
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
    refuse_unless_ready(spec.backend)
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
    # Once this pid is in the row a cancel signals it: blocked until the loop handles it.
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig for sig, _ in _CANCEL_SIGNALS])
    held_cancel = claim_master(store, job_id)  # a cancel asked before we were up
    restarts = len(store.restarts_of(job_id))
    resume_after = (int(job.attempts), restarts) if job.attempts else None
    say = _say_to(status)
    say(f"job {job_id} ({spec.name}): admitted, attempt {job.attempts}")
    log_dir, cwd = Path(job.log_dir), job.cwd or os.getcwd()
    return _master_run(job_id, spec, recorder, log_dir, cwd, None, say, resume_after, held_cancel)


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit: the master holds a few
    descriptors per replica (its pipe, log file, pidfd), so 1,024 stops a job at ~340
    ranks, and running out reads as anything but what it is. Returns (soft, hard) now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # Linux has no infinite hard limit of files: it is at most nr_open
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _master_run(
    job_id: str,
    spec: JobSpec,
    recorder: Recorder,
    log_dir: Path,
    cwd: str,
    tee: TextIO | None,
    say: Callable[[str], None],
    resume_after: tuple[int, int] | None,
    cancel: str | None = None,
) -> Outcome:
    """This process becomes the job's master (local backend) until the job ends."""
    raise_fd_limit()
    rules = [*spec.notifications, *_server_rules()]
    if rules:
        recorder.notifier = Notifier(rules, job_id=job_id, job_name=spec.name)
    outside = OutsideCancels()
    master = Master(
        job_id=job_id,
        spec=spec,
        backend=make_backend(spec, tee, outside.ended, job_id),
        recorder=recorder,
        log_dir=log_dir,
        cwd=cwd,
        say=say,
        resume_after=resume_after,
    )
    outside.cancel = master.cancel
    if cancel is not None:
        master.cancel(cancel)
    try:
        return asyncio.run(_supervise(master, outside))
    finally:
        if recorder.notifier is not None:
            recorder.notifier.close(timeout_s=5.0)


def make_backend(
    spec: JobSpec,
    tee: TextIO | None,
    on_ended: Callable[[str], None] | None = None,
    job_id: str = "",
) -> Backend:
    """The spec's backend (local processes, actors on a Ray cluster, or steps of a Slurm
    allocation), as the framework wants it (mpi: behind mpirun). `on_ended`: what Slurm
    ending the allocation calls (under salloc no signal tells the master)."""
    backend: Backend
    if spec.backend == "ray":
        from trainguard.backends.ray.agents import RayAgents
        from trainguard.backends.ray.backend import RayBackend

        res = {pool.role: pool.resources for pool in spec.worker_pools}
        needs = {p.name: res[p.role] for p in plan_replicas(spec)}
        if spec.ray.agents:
            backend = RayAgents(needs, spec.ray, tee=tee, preload=spec.preload, job=job_id)
        else:
            backend = RayBackend(needs, spec.ray, tee=tee, preload=spec.preload)
    elif spec.backend == "slurm":
        from trainguard.backends.slurm.backend import SlurmBackend

        backend = SlurmBackend(
            spec.slurm,
            tee=tee,
            replicas=spec.world_size,
            on_ended=on_ended,
            job=job_id,
            preload=spec.preload,
        )
    else:
        backend = LocalBackend(tee=tee, preload=spec.preload, one_node=True)
    if preset(spec.framework).launcher == "mpi":
        backend = MpiBackend(backend)
    return backend


def _server_rules() -> list[NotifyRule]:
    """The server's own notification rules, handed to the masters it starts."""
    text = os.environ.get("TRAINGUARD_NOTIFY_RULES")
    if not text:
        return []
    return [NotifyRule.model_validate(r) for r in json.loads(text)]


async def _supervise(master: Master, outside: OutsideCancels) -> Outcome:
    loop = asyncio.get_running_loop()
    slurm = master.spec.backend == "slurm"
    for sig, why in _CANCEL_SIGNALS:
        if slurm and sig == signal.SIGTERM:
            why = "SIGTERM from Slurm: scancel, a time limit or a preemption"
        loop.add_signal_handler(sig, outside.signalled, f"cancelled ({why})")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig for sig, _ in _CANCEL_SIGNALS])
    notice = f"{signal.Signals(_NOTICE).name} to the master (sbatch --signal=B:USR1@SECONDS)"
    loop.add_signal_handler(_NOTICE, master.preemption_notice, notice)
    try:
        with pidfd_child_watcher(loop):
            return await master.run()
    finally:
        for sig, _ in (*_CANCEL_SIGNALS, (_NOTICE, "")):
            loop.remove_signal_handler(sig)


class OutsideCancels:
    """Cancels from outside the job: a signal to the master (each one a cancel: a second
    stops the replicas without grace), or Slurm ending the allocation, which cancels only
    where no signal did first (under sbatch its SIGTERM comes with the end; under salloc
    nothing does)."""

    def __init__(self) -> None:
        self.cancel: Callable[[str], None] = lambda _why: None  # the master's
        self._signalled = False

    def signalled(self, why: str) -> None:
        self._signalled = True
        self.cancel(why)

    def ended(self, why: str) -> None:
        if not self._signalled:
            self.cancel(why)


# Signals that cancel the job cleanly; a second one stops the replicas without grace.
_CANCEL_SIGNALS = (
    (signal.SIGINT, "Ctrl+C"),
    (signal.SIGTERM, "SIGTERM to the master"),
    (signal.SIGHUP, "the terminal closed"),
)


_NOTICE = signal.SIGUSR1
"""A warning that the job will be stopped soon (Slurm's `--signal`): tell the replicas."""
