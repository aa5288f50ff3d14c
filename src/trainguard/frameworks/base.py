"""What a framework preset decides, behind one interface (R-JOB-7).

A preset says which roles a job may have, the environment each replica gets, and how
its roles' failures are treated. Everything else (launching, watching, budgets) is the
master's and is the same for every framework. Adding a framework is one module here
and one line in the table of `trainguard.frameworks`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from trainguard.policy import RolePolicy

if TYPE_CHECKING:
    from trainguard.backends.base import Backend
    from trainguard.layout import ReplicaPlan
    from trainguard.spec import JobSpec

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Roster:
    """Every replica of the job, in rank order, and what presets derive from all of them.

    Built once per job and shared by every replica's `EnvContext`, so what depends on
    the whole job (pool sizes, a cluster spec) is computed once: building N replicas'
    environments stays linear in N.
    """

    plans: tuple[ReplicaPlan, ...]
    # replica -> its own address, the same for the job's whole life (presets that ask)
    task_addresses: Mapping[str, str] = field(default_factory=dict)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def sizes(self) -> Mapping[str, int]:
        return Counter(p.role for p in self.plans)

    def memo(self, key: str, build: Callable[[], T]) -> T:
        """`build()` once per roster: a preset's job-wide value (e.g. its cluster spec)."""
        if key not in self._memo:
            self._memo[key] = build()
        return cast(T, self._memo[key])


@dataclass(frozen=True)
class EnvContext:
    """What a preset may use to build one replica's environment."""

    plan: ReplicaPlan
    roster: Roster
    job_id: str
    master_addr: str
    master_port: int  # fresh for every attempt
    restart_count: int
    max_restarts: int | str

    @property
    def plans(self) -> tuple[ReplicaPlan, ...]:
        return self.roster.plans

    @property
    def task_addresses(self) -> Mapping[str, str]:
        return self.roster.task_addresses

    def pool_size(self, role: str) -> int:
        return self.roster.sizes.get(role, 0)


class Preset:
    """The default framework behaviour; each preset overrides what it must."""

    name = "generic"
    # The roles a pool may have; None: any role.
    roles: frozenset[str] | None = None
    # Spec defaults the preset implies, applied where the job spec does not set them:
    # keys of `fault_tolerance`, and `success_policy`.
    ft_defaults: ClassVar[Mapping[str, Any]] = {}
    success_policy: str | None = None
    # Whether every replica needs a stable address of its own (TensorFlow's cluster spec).
    task_addresses = False
    backends: frozenset[str] = frozenset({"local", "ray"})
    # Whether `allow_partial` makes sense: replicas whose results stand alone (shards).
    partial_results = False

    def ft_defaults_for(self, pools: Sequence[Any]) -> Mapping[str, Any]:
        """The fault_tolerance defaults for a job of these pools (raw spec data)."""
        return self.ft_defaults

    def role_policy(self, spec: JobSpec) -> RolePolicy:
        return RolePolicy()

    def problems(self, spec: JobSpec) -> list[str]:
        """What is wrong with this job for this framework, one line each."""
        out: list[str] = []
        if spec.backend not in self.backends:
            out.append(f"backend: framework {self.name} runs on the local backend only for now")
        if self.roles is not None:
            out += [
                f"worker_pools: framework {self.name} has no role {p.role!r} "
                f"(its roles: {', '.join(sorted(self.roles))})"
                for p in spec.worker_pools
                if p.role not in self.roles
            ]
        return out

    def pools_for(self, command: list[str], replicas: int) -> list[dict[str, Any]]:
        """The worker pools of `trainguard run --nproc-per-node N -- COMMAND`."""
        return [{"role": "worker", "replicas": replicas, "command": command}]

    def wrap_backend(self, backend: Backend) -> Backend:
        """The backend this framework's replicas run on (mpi puts its ranks behind it)."""
        return backend

    def env(self, ctx: EnvContext) -> dict[str, str]:
        """The framework's variables; rank and world size are every preset's."""
        return {"RANK": str(ctx.plan.rank), "WORLD_SIZE": str(len(ctx.plans))}
