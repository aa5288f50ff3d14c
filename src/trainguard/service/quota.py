"""The server's queue rules (R-REC-3): pure functions of (queue, what is in use, quota, now).

A job asks for the sum of its replicas' resources (a replica that names no cpus counts
as one, and none less than 0.1). The queue is strict FIFO within priority, so a big job
is never starved by small ones behind it; only a job that could never fit the whole
quota steps aside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.spec.models import JobSpec
from trainguard.spec.sizes import parse_memory


def _size(n: float) -> str:
    for unit, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


@dataclass(frozen=True)
class Request:
    """Resources: what a job asks for, what is in use, or what is free."""

    cpus: float = 0.0
    gpus: int = 0
    memory_b: int = 0
    replicas: int = 0  # processes: each replica is one on the machines of the server

    def __add__(self, other: Request) -> Request:
        return Request(
            self.cpus + other.cpus,
            self.gpus + other.gpus,
            self.memory_b + other.memory_b,
            self.replicas + other.replicas,
        )

    def __sub__(self, other: Request) -> Request:
        return Request(
            self.cpus - other.cpus,
            self.gpus - other.gpus,
            self.memory_b - other.memory_b,
            self.replicas - other.replicas,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "cpus": self.cpus,
            "gpus": self.gpus,
            "memory_b": self.memory_b,
            "replicas": self.replicas,
        }


DEFAULT_MAX_REPLICAS = 4096
"""Running replicas of all of a server's jobs together, unless its quota says otherwise."""

MIN_CPUS_PER_REPLICA = 0.1
"""Each replica is a process: it counts at least this much, so a job of 4096 replicas at
0.0001 cpus each cannot pass a quota of one cpu."""


def request_of(spec: JobSpec) -> Request:
    total = Request()
    for pool in spec.worker_pools:
        res = pool.resources
        mem = parse_memory(res.memory) if res.memory else 0
        cpus = 1.0 if res.cpus is None else max(res.cpus, MIN_CPUS_PER_REPLICA)
        one = Request(cpus, res.gpus, mem, 1)
        for _ in range(pool.replicas):
            total = total + one
    return total


@dataclass(frozen=True)
class Quota:
    """What the server may hand out; None means that resource is not limited."""

    cpus: float | None = None
    gpus: int | None = None
    memory_b: int | None = None
    gpu_ids: tuple[int, ...] | None = None  # when set, jobs get these ids, not just a count
    replicas: int | None = DEFAULT_MAX_REPLICAS  # running replicas of all jobs together

    def shortage(self, want: Request, used: Request) -> str | None:
        """`4 gpus, 2 free` for each resource `want` lacks; None if it fits."""
        short = []
        for name, limit, asked, taken in (
            ("cpus", self.cpus, want.cpus, used.cpus),
            ("gpus", self.gpus, want.gpus, used.gpus),
            ("memory", self.memory_b, want.memory_b, used.memory_b),
            ("replicas", self.replicas, want.replicas, used.replicas),
        ):
            if limit is None or asked <= limit - taken + 1e-9:
                continue
            free = max(limit - taken, 0)
            if name == "memory":
                short.append(f"{_size(asked)} memory, {_size(free)} free")
            else:
                short.append(f"{asked:g} {name}, {free:g} free")
        return "; ".join(short) or None

    def as_dict(self) -> dict[str, object]:
        return {
            "cpus": self.cpus,
            "gpus": self.gpus,
            "memory_b": self.memory_b,
            "gpu_ids": list(self.gpu_ids) if self.gpu_ids is not None else None,
            "replicas": self.replicas,
        }


NOTHING = Request()

BEHIND = "queued behind earlier jobs (FIFO within priority)"


@dataclass(frozen=True)
class QueuedJob:
    id: str
    request: Request
    priority: int
    queued_at_s: float
    max_wait_s: float | None = None
    wait_for_capacity: bool = False


# Decisions, as values: the scheduler carries them out.
@dataclass(frozen=True)
class Admit:
    job_id: str
    gpu_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Wait:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Expire:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Reject:
    job_id: str
    reason: str


QueueDecision = Admit | Wait | Expire | Reject


def too_big(quota: Quota, want: Request) -> str | None:
    """Why `want` could never fit this quota, even with nothing else running."""
    short = quota.shortage(want, NOTHING)
    return None if short is None else short.replace(" free", " in the whole quota")


@dataclass
class _Free:
    used: Request
    gpu_ids: list[int] | None = field(default=None)


def plan(
    queue: Sequence[QueuedJob],
    used: Request,
    quota: Quota,
    now_s: float,
    busy_gpu_ids: Sequence[int] = (),
) -> list[QueueDecision]:
    """One decision per queued job: admit in order while jobs fit, then everyone waits."""
    free = _Free(
        used,
        None if quota.gpu_ids is None else [g for g in quota.gpu_ids if g not in busy_gpu_ids],
    )
    blocked_by: QueuedJob | None = None
    out: list[QueueDecision] = []
    for job in sorted(queue, key=lambda j: (-j.priority, j.queued_at_s, j.id)):
        waited = now_s - job.queued_at_s
        never = too_big(quota, job.request)
        if never is not None and not job.wait_for_capacity:
            out.append(
                Reject(
                    job.id,
                    f"asks for more than the server's quota ({never}); set "
                    "queue.wait_for_capacity to wait for capacity instead",
                )
            )
            continue
        short = (
            f"waiting for capacity: {never}"
            if never is not None
            else quota.shortage(job.request, free.used)
        )
        if job.max_wait_s is not None and waited >= job.max_wait_s and short is not None:
            out.append(
                Expire(job.id, f"waited {waited:.0f} s, max_wait_s is {job.max_wait_s:g}: {short}")
            )
            continue
        if never is not None:
            out.append(Wait(job.id, short or never))  # never blocks the jobs behind it
            continue
        if blocked_by is not None:
            # The same words while the head changes: a deep queue is not rewritten each pass.
            out.append(Wait(job.id, BEHIND))
            continue
        if short is not None:
            out.append(Wait(job.id, f"waiting for {short}"))
            blocked_by = job
            continue
        ids: tuple[int, ...] | None = None
        if free.gpu_ids is not None and job.request.gpus:
            ids = tuple(free.gpu_ids[: job.request.gpus])
            free.gpu_ids = free.gpu_ids[job.request.gpus :]
        free.used = free.used + job.request
        out.append(Admit(job.id, ids))
    return out
