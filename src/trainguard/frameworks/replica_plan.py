"""Which replicas a job has, their ranks, and the environment each gets (R-JOB-1, R-JOB-6)."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.frameworks import EnvContext, Preset
from trainguard.spec.models import JobSpec
from trainguard.storage.env import ENV_JOB_ID, ENV_REPLICA, ENV_RESTART_COUNT

# The replica whose success is the job's comes first (rank 0).
_PRIMARY_ROLES = ("chief", "launcher")


@dataclass(frozen=True)
class ReplicaPlan:
    name: str  # `<role>-<index>`, stable across restarts
    role: str
    index: int  # within its pool
    rank: int  # global; the chief (if any) is rank 0
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def plan_replicas(spec: JobSpec) -> list[ReplicaPlan]:
    pools = sorted(spec.worker_pools, key=lambda p: p.role not in _PRIMARY_ROLES)  # stable
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
    """The chief (or an MPI launcher) if there is one, else rank 0 (R-JOB-4)."""
    for p in plans:
        if p.role in _PRIMARY_ROLES:
            return p.name
    return plans[0].name


def replica_env(
    preset: Preset, ctx: EnvContext, sdk_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The framework's variables, plus ours; the SDK's beat them, the user's beat all."""
    env = preset.env(ctx)
    env.update(
        {
            ENV_JOB_ID: ctx.job_id,
            ENV_REPLICA: ctx.plan.name,
            ENV_RESTART_COUNT: str(ctx.restart_count),
            # Line-buffered output so logs (and hang detection) see lines as they are printed.
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(sdk_env or {})
    env.update(dict(ctx.plan.env))
    return env
