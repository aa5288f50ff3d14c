"""What a framework preset decides, behind one interface (R-JOB-7).

A preset says which roles a job may have, the environment each replica gets, and how
its roles' failures are treated. Everything else (launching, watching, budgets) is the
master's and is the same for every framework. Adding a framework is one module here
and one line in the table of `trainguard.frameworks`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar, cast

from trainguard.policy.decisions import RolePolicy

if TYPE_CHECKING:
    from trainguard.frameworks.replica_plan import ReplicaPlan
    from trainguard.spec.models import JobSpec

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
    spec: JobSpec | None = None  # the job's spec: a preset's own options (torchft:)
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
    """What a framework does at run time; each preset overrides what it must. What it
    asks of a spec (roles, defaults, problems) is its `trainguard.spec.frameworks` rules."""

    name = "generic"
    # Whether every replica needs a stable address of its own (TensorFlow's cluster spec).
    task_addresses = False
    # A launcher the replicas run behind (mpi: mpirun starts the ranks); the runner puts
    # the backend behind it.
    launcher: str | None = None
    # Roles that are the framework's own processes (torchft's Lighthouse): started before
    # the others and waited for (`ready_endpoint`), never what the job's success waits
    # for, stopped when it ends.
    services: frozenset[str] = frozenset()

    def role_policy(self, spec: JobSpec) -> RolePolicy:
        return RolePolicy()

    def env(self, ctx: EnvContext) -> dict[str, str]:
        """The framework's variables; rank and world size are every preset's."""
        return {"RANK": str(ctx.plan.rank), "WORLD_SIZE": str(len(ctx.plans))}

    def argv(self, ctx: EnvContext) -> tuple[str, ...]:
        """The replica's command: its pool's, plus what the framework adds (a service's
        address, say)."""
        return ctx.plan.argv

    def ready_endpoint(self, roster: Roster, replica: str) -> tuple[str, int] | None:
        """Where a service listens once it is ready: the other replicas start then."""
        return None
