"""The server's core (R-RUN-2, R-REC-3): a queue over the store, and one master per job.

Everything the server knows lives in the store, so a restarted server loses nothing:
queued jobs are still QUEUED; masters run in their own sessions and outlive the server,
so running jobs go on and still count against the quota; a job whose master died is
INTERRUPTED, and the server puts it back in the queue as a resume (`auto_resume` times).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.backends.preflight import refuse_unless_ready
from trainguard.errors import SpecError, TrainguardError
from trainguard.records.control import HELD_CANCEL, check_resumable, request_cancel
from trainguard.records.liveness import master_up, reap_interrupted, starter_identity
from trainguard.records.rows import JobRow
from trainguard.records.schema import jobs
from trainguard.records.store import Store, spec_json
from trainguard.service.config import ServerConfig
from trainguard.service.quota import (
    NOTHING,
    Admit,
    Expire,
    QueuedJob,
    Reject,
    Request,
    Wait,
    plan,
    request_of,
    too_big,
)
from trainguard.spec.models import JobSpec, validate_spec
from trainguard.states import ErrorCode, JobState
from trainguard.storage.ids import new_job_id
from trainguard.storage.private import private_dir, private_file

ORIGIN = "server"
HOLDING = [
    s.value for s in (JobState.PENDING, JobState.RUNNING, JobState.RESTARTING, JobState.CANCELLING)
]
"""The states in which a job holds its share of the quota."""

AUTO_RESUME = "auto-resume: its master was lost"


def _spec_of(job: JobRow) -> JobSpec:
    return validate_spec(json.loads(job.spec_json))


class Service:
    """Submit, cancel and resume (from the API's threads), and the scheduling loop."""

    def __init__(
        self,
        store: Store,
        config: ServerConfig,
        *,
        say: Callable[[str], None] = lambda m: print(f"trainguard server: {m}", flush=True),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config
        self.quota = config.quota.quota()
        self.say = say
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._children: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.masters_started = 0
        self._specs: dict[tuple[str, str], JobSpec] = {}

    # -------------------------------------------------------------- operations

    def submit(self, data: Any, cwd: str | None = None) -> JobRow:
        """Validate and queue a job; SpecError names every problem and nothing is stored.
        Its masters start here, so a backend this server cannot run (slurm outside an
        allocation, ray that does not import) is refused now, as `run` refuses it."""
        spec = validate_spec(data)
        refuse_unless_ready(spec.backend)
        workdir = Path(cwd) if cwd else Path.cwd()
        if not workdir.is_absolute() or not workdir.is_dir():
            raise SpecError([f"cwd: not a folder on the server: {cwd!r}"])
        want = request_of(spec)
        never = too_big(self.quota, want)
        if never is not None and not spec.queue.wait_for_capacity:
            raise SpecError(
                [
                    f"resources: the job asks for more than the server's quota ({never}); "
                    "set queue.wait_for_capacity: true to wait for capacity instead"
                ]
            )
        job_id = new_job_id()
        now = self.clock()
        self.store.insert(
            jobs,
            id=job_id,
            name=spec.name,
            spec_json=spec_json(spec),
            state=JobState.QUEUED.value,
            created_at_s=now,
            attempts=0,
            log_dir=str(self.store.home / "jobs" / job_id),
            cwd=str(workdir),
            origin=ORIGIN,
            priority=spec.queue.priority,
            queued_at_s=now,
            queued_reason="submitted",
        )
        self.store.record_transition(job_id, None, JobState.QUEUED.value, now, "submitted")
        self.wake()
        return self.store.job(job_id)

    def cancel(self, ref: str) -> str:
        message = request_cancel(self.store, self.store.resolve_job(ref))
        self.wake()
        return message

    def resume(self, ref: str) -> JobRow:
        """Put an interrupted or cancelled job back in the queue; its master resumes it."""
        job = self.store.resolve_job(ref)
        check_resumable(job)
        self._requeue(job, "resume requested")
        self.wake()
        return self.store.job(job.id)

    def _requeue(self, job: JobRow, reason: str) -> bool:
        now = self.clock()
        return self.store.set_state_if(
            job.id,
            job.state,
            JobState.QUEUED.value,
            now,
            reason,
            origin=ORIGIN,
            queued_at_s=now,
            queued_reason=reason,
            ended_at_s=None,
            error_code=None,
            error_message=None,
        )

    def queue_view(self) -> dict[str, Any]:
        used, _ = self._holding()
        queued = self.store.jobs_in([JobState.QUEUED.value], ORIGIN)
        return {
            "quota": self.quota.as_dict(),
            "used": used.as_dict(),
            "running": len(self.store.jobs_in(HOLDING, ORIGIN)),
            "queued": [
                {
                    "id": j.id,
                    "name": j.name,
                    "priority": j.priority,
                    "queued_at_s": j.queued_at_s,
                    "reason": j.queued_reason,
                }
                for j in sorted(queued, key=lambda j: (-(j.priority or 0), j.queued_at_s or 0.0))
            ],
        }

    # -------------------------------------------------------------- the loop

    def wake(self) -> None:
        """Schedule now (thread-safe: the API calls it from its worker threads)."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.say(f"scheduling; quota {self.quota.as_dict()}")
        while True:
            try:
                await self.tick()
            except Exception as exc:  # one bad tick must not stop the queue
                self.say(f"scheduler error: {exc.__class__.__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.tick_s)
            self._wake.clear()

    async def tick(self) -> None:
        """One pass: the store work runs in a thread, so the API keeps answering."""
        for admit in await asyncio.to_thread(self._plan_pass):
            await self._admit(admit)

    def _plan_pass(self) -> list[Admit]:
        reap_interrupted(self.store)
        self._auto_resume()
        used, busy_ids = self._holding()
        rows = {j.id: j for j in self.store.jobs_in([JobState.QUEUED.value], ORIGIN)}
        if not rows:
            return []
        queue = [self._queued(j) for j in rows.values()]
        admits: list[Admit] = []
        for decision in plan(queue, used, self.quota, self.clock(), busy_ids):
            match decision:
                case Admit():
                    admits.append(decision)
                case Wait():
                    if rows[decision.job_id].queued_reason != decision.reason:
                        self.store.update_job(decision.job_id, queued_reason=decision.reason)
                case Expire():
                    self._end_queued(
                        decision.job_id, JobState.EXPIRED, ErrorCode.EXPIRED, decision.reason
                    )
                case Reject():
                    self._end_queued(
                        decision.job_id, JobState.FAILED, ErrorCode.QUOTA, decision.reason
                    )
        return admits

    def _parsed(self, job: JobRow) -> JobSpec:
        """A job's spec, parsed once per version of its text (it is read on every pass)."""
        key = (job.id, job.spec_json)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 10_000:
                self._specs.clear()
            spec = self._specs[key] = _spec_of(job)
        return spec

    def _holding(self) -> tuple[Request, list[int]]:
        used, ids = NOTHING, []
        for job in self.store.jobs_in(HOLDING, ORIGIN):
            spec = self._parsed(job)
            used = used + request_of(spec)
            if self.quota.gpu_ids is not None and spec.gpu_inventory:
                ids.extend(spec.gpu_inventory)
        return used, ids

    def _queued(self, job: JobRow) -> QueuedJob:
        spec = self._parsed(job)
        return QueuedJob(
            id=job.id,
            request=request_of(spec),
            priority=job.priority or 0,
            queued_at_s=job.queued_at_s or job.created_at_s,
            max_wait_s=spec.queue.max_wait_s,
            wait_for_capacity=spec.queue.wait_for_capacity,
        )

    def _auto_resume(self) -> None:
        for job in self.store.jobs_in([JobState.INTERRUPTED.value], ORIGIN):
            if job.error_code != "MASTER_LOST":
                continue
            if self.store.count_transitions(job.id, AUTO_RESUME) >= self.config.auto_resume:
                continue
            if self._requeue(job, AUTO_RESUME):
                self.say(f"job {job.id}: its master was lost; queued to resume")

    def _end_queued(self, job_id: str, state: JobState, code: str, reason: str) -> None:
        now = self.clock()
        if self.store.set_state_if(
            job_id,
            JobState.QUEUED.value,
            state.value,
            now,
            reason,
            ended_at_s=now,
            error_code=code,
            error_message=reason,
        ):
            self.say(f"job {job_id} {state.value}: {reason}")

    async def _admit(self, decision: Admit) -> None:
        job = self.store.job(decision.job_id)
        # No master yet (a resumed job's old one is gone): the row names this server as the
        # job's starter, which answers for it until the master writes its own identity.
        values: dict[str, Any] = {
            "queued_reason": None,
            "master_pid": None,
            "master_host": None,
            "master_started_ticks": None,
            "cancel_requested_at_s": None,
            **starter_identity(),
        }
        if decision.gpu_ids is not None:
            spec = json.loads(job.spec_json)
            spec["gpu_inventory"] = list(decision.gpu_ids)
            values["spec_json"] = json.dumps(spec, sort_keys=True)
        if not self.store.set_state_if(
            job.id,
            JobState.QUEUED.value,
            JobState.PENDING.value,
            self.clock(),
            "admitted",
            **values,
        ):
            return  # cancelled meanwhile
        try:
            await self._start_master(job)
        except OSError as exc:
            msg = f"cannot start the job's master: {exc}"
            self.store.set_state_if(
                job.id,
                JobState.PENDING.value,
                JobState.FAILED.value,
                self.clock(),
                msg,
                ended_at_s=self.clock(),
                error_code=ErrorCode.INTERNAL,
                error_message=msg,
            )

    async def _start_master(self, job: JobRow) -> None:
        log_dir = Path(job.log_dir)
        private_dir(log_dir)
        argv = [sys.executable, "-m", "trainguard", "--home", str(self.store.home)]
        if self.store.engine.url.get_backend_name() != "sqlite":
            argv += ["--db", self.store.engine.url.render_as_string(hide_password=False)]
        argv += ["_master", job.id]
        env = dict(os.environ)
        if self.config.notifications:
            env["TRAINGUARD_NOTIFY_RULES"] = json.dumps(
                [r.model_dump(mode="json") for r in self.config.notifications]
            )
        with open(private_file(log_dir / "master.log"), "ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=job.cwd or None,
                env=env,
                start_new_session=True,  # it outlives a restart of the server
            )
        self.masters_started += 1
        self._children[job.id] = proc
        task = asyncio.create_task(self._reap_child(job.id, proc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap_child(self, job_id: str, proc: asyncio.subprocess.Process) -> None:
        status = await proc.wait()
        self._children.pop(job_id, None)
        try:
            await asyncio.to_thread(self._master_exited, job_id, status)
        except TrainguardError as exc:  # the store refused: say so, the loop goes on
            self.say(f"job {job_id}: its master exited (status {status}): {exc}")
        self.wake()  # its share of the quota is free now

    def _master_exited(self, job_id: str, status: int) -> None:
        """A master that exits before it is up leaves its job to no one: end it here."""
        job = self.store.job(job_id)
        if master_up(job) or JobState(job.state).is_terminal:
            return
        state, code = JobState.FAILED, ErrorCode.INTERNAL
        msg = f"the job's master exited (status {status}) before it was up; see {job.log_dir}"
        if job.cancel_requested_at_s is not None:
            state, code, msg = JobState.CANCELLED, ErrorCode.CANCELLED, HELD_CANCEL
        now = self.clock()
        if self.store.set_state_if(
            job.id,
            job.state,
            state.value,
            now,
            msg,
            ended_at_s=now,
            error_code=code,
            error_message=msg,
        ):
            self.say(f"job {job_id} {state.value}: {msg}")
