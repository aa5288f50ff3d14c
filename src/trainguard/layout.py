"""Which replicas a job has, their ranks, and the environment each gets (R-JOB-1, R-JOB-6)."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.spec import JobSpec


@dataclass(frozen=True)
class ReplicaPlan:
    name: str  # `<role>-<index>`, stable across restarts
    role: str
    index: int  # within its pool
    rank: int  # global; the chief (if any) is rank 0
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def plan_replicas(spec: JobSpec) -> list[ReplicaPlan]:
    pools = sorted(spec.worker_pools, key=lambda p: p.role != "chief")  # stable: chief first
    plans: list[ReplicaPlan] = []
    for pool in pools:
        for i in range(pool.replicas):
            plans.append(
                ReplicaPlan(
                    name=f"{pool.role}-{i}",
                    role=pool.role,
                    index=i,
                    rank=len(plans),
                    argv=tuple(pool.command),
                    env=tuple(sorted(pool.env.items())),
                )
            )
    return plans


def primary_replica(plans: list[ReplicaPlan]) -> str:
    """The chief if there is one, else rank 0 (R-JOB-4)."""
    for p in plans:
        if p.role == "chief":
            return p.name
    return plans[0].name


def replica_env(
    plan: ReplicaPlan,
    *,
    job_id: str,
    world_size: int,
    master_addr: str,
    master_port: int,
    restart_count: int,
    max_restarts: int | str,
    role_world_size: int,
    sdk_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The variables torchrun sets (so code written for torchrun runs unchanged), plus ours.

    One node for now: LOCAL_RANK == RANK and GROUP_RANK is 0.
    """
    env = {
        "RANK": str(plan.rank),
        "LOCAL_RANK": str(plan.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": plan.role,
        "ROLE_RANK": str(plan.index),
        "ROLE_WORLD_SIZE": str(role_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": job_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TRAINGUARD_JOB_ID": job_id,
        "TRAINGUARD_REPLICA": plan.name,
        "TRAINGUARD_RESTART_COUNT": str(restart_count),
        # Line-buffered output so logs (and hang detection) see lines as they are printed.
        "PYTHONUNBUFFERED": "1",
    }
    env.update(sdk_env or {})
    env.update(dict(plan.env))  # the user's own env wins
    return env
