"""What each framework asks of a job spec: its roles, its defaults, its problems.

The spec layer needs these to validate a job, so they are configuration here; what a
framework does at run time (each replica's environment, which roles restart alone) is
`trainguard.frameworks`, a layer above, keyed by the same names.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from trainguard.spec.models import JobSpec

CLUSTER_ROLES = ("chief", "worker", "ps")  # TensorFlow's; the evaluator watches from outside


class FrameworkRules:
    """The default rules; each framework overrides what it must."""

    name = "generic"
    # The roles a pool may have; None: any role.
    roles: frozenset[str] | None = None
    # Spec defaults the framework implies, applied where the job spec does not set them:
    # keys of `fault_tolerance`, and `success_policy`.
    ft_defaults: ClassVar[Mapping[str, Any]] = {}
    success_policy: str | None = None
    backends: frozenset[str] = frozenset({"local", "ray", "slurm"})
    # Whether `allow_partial` makes sense: replicas whose results stand alone (shards).
    partial_results = False

    def ft_defaults_for(self, pools: Sequence[Any]) -> Mapping[str, Any]:
        """The fault_tolerance defaults for a job of these pools (raw spec data)."""
        return self.ft_defaults

    def service_pools(self, pools: Sequence[Any], data: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Pools the framework runs beside the job's own (raw spec data, and the raw spec
        they are of): added to the
        spec where it has no pool of that role, so they are named, logged and injected
        into like any replica."""
        return []

    def problems(self, spec: JobSpec) -> list[str]:
        """What is wrong with this job for this framework, one line each."""
        out: list[str] = []
        if spec.backend not in self.backends:
            where = " and ".join(sorted(self.backends))
            out.append(
                f"backend: framework {self.name} runs on the {where} backend only for now, "
                f"not {spec.backend}"
            )
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


class PyTorchRules(FrameworkRules):
    name = "pytorch"


class TensorFlowRules(FrameworkRules):
    name = "tensorflow"
    roles = frozenset({*CLUSTER_ROLES, "evaluator"})
    backends = frozenset({"local"})

    def ft_defaults_for(self, pools: Sequence[Any]) -> Mapping[str, Any]:
        """Async with parameter servers (a worker restarted alone rejoins); sync without
        (MultiWorkerMirroredStrategy: a worker restarted alone cannot join the others)."""
        ps = any(isinstance(p, dict) and p.get("role") == "ps" for p in pools)
        return {"execution_mode": "async" if ps else "sync"}

    def problems(self, spec: JobSpec) -> list[str]:
        out = super().problems(spec)
        if {p.role for p in spec.worker_pools} <= {"ps", "evaluator"}:
            out.append("worker_pools: a tensorflow job needs a chief or a worker pool")
        return out


class MpiRules(FrameworkRules):
    name = "mpi"
    roles = frozenset({"launcher", "worker"})
    ft_defaults: ClassVar[Mapping[str, Any]] = {"execution_mode": "sync"}
    backends = frozenset({"local"})

    def problems(self, spec: JobSpec) -> list[str]:
        out = super().problems(spec)
        pools = {p.role: p.replicas for p in spec.worker_pools}
        if pools.get("launcher") != 1:
            out.append("worker_pools: an mpi job needs a launcher pool of 1 replica")
        if "worker" not in pools:
            out.append("worker_pools: an mpi job needs a worker pool (its ranks)")
        if spec.fault_tolerance.execution_mode.value != "sync":
            out.append(
                "fault_tolerance.execution_mode: an mpi job is sync (a rank's death aborts "
                "every rank)"
            )
        return out

    def pools_for(self, command: list[str], replicas: int) -> list[dict[str, Any]]:
        """`--framework mpi --nproc-per-node 4 -- python x.py`: mpirun runs 4 ranks of it."""
        return [{"role": "launcher", "command": ["mpirun"]}, *super().pools_for(command, replicas)]


class BatchRules(FrameworkRules):
    name = "batch"
    # The job-wide class budgets do not bind shards (one flaky shard must not spend the
    # others' retries), so they default to unlimited.
    ft_defaults: ClassVar[Mapping[str, Any]] = {
        "execution_mode": "async",
        "max_transient_restarts": "unlimited",
        "max_internal_restarts": "unlimited",
        "max_node_lost_restarts": "unlimited",
    }
    success_policy = "all"
    partial_results = True


TORCHFT_SERVICES = ("lighthouse", "store")
"""The torchft job's own processes: the Lighthouse, and each group's store."""


_SMALL = {"cpus": 0.1}
"""What a service asks of a Ray node: it serves, it does not compute."""


def _lighthouse() -> str:
    """torchft's Lighthouse: the one installed beside this Python (a venv used without
    activating it), else whichever the PATH finds."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    return str(beside) if beside.is_file() else "torchft_lighthouse"


def _groups(pools: Sequence[Any], options: Any) -> int:
    """The replica groups of a torchft job's raw pools and options (1 where those are not
    valid yet: the spec's checks name the problem)."""
    per = options.get("nproc_per_group", 1) if isinstance(options, dict) else 1
    per = per if isinstance(per, int) and per >= 1 else 1
    for p in pools:
        if isinstance(p, dict) and p.get("role", "worker") == "worker":
            replicas = p.get("replicas", 1)
            if isinstance(replicas, int) and replicas >= per:
                return replicas // per
    return 1


class TorchftRules(FrameworkRules):
    name = "torchft"
    roles = frozenset({"worker", *TORCHFT_SERVICES})
    # Groups restart alone: that is the point of torchft.
    ft_defaults: ClassVar[Mapping[str, Any]] = {"execution_mode": "async"}
    success_policy = "all"
    backends = frozenset({"local", "ray"})

    def service_pools(self, pools: Sequence[Any], data: Mapping[str, Any]) -> list[dict[str, Any]]:
        have = {p.get("role") for p in pools if isinstance(p, dict)}
        out: list[dict[str, Any]] = []
        if "lighthouse" not in have:
            out.append({"role": "lighthouse", "command": [_lighthouse()], "resources": _SMALL})
        if "store" not in have:  # one per group: restarted with it, so always fresh
            store = [sys.executable, "-m", "trainguard.frameworks.torchft_tcpstore"]
            groups = _groups(pools, data.get("torchft"))
            out.append({"role": "store", "replicas": groups, "command": store, "resources": _SMALL})
        return out

    def problems(self, spec: JobSpec) -> list[str]:
        out = super().problems(spec)
        pools = {p.role: p.replicas for p in spec.worker_pools}
        per = spec.torchft.nproc_per_group
        workers = pools.get("worker", 0)
        if not workers:
            out.append("worker_pools: a torchft job needs a worker pool (its replica groups)")
        elif workers % per:
            out.append(
                f"worker_pools: the worker pool's {workers} replicas are not whole groups "
                f"of torchft.nproc_per_group {per}"
            )
        elif spec.torchft.min_replicas > workers // per:
            out.append(
                f"torchft.min_replicas: {spec.torchft.min_replicas} groups for a quorum, "
                f"but the job has {workers // per}"
            )
        if pools.get("lighthouse", 1) != 1:
            out.append(
                f"worker_pools: a torchft job has one lighthouse (got {pools['lighthouse']})"
            )
        if workers and not workers % per and pools.get("store", workers // per) != workers // per:
            out.append(
                f"worker_pools: a torchft job has one store per group ({workers // per}), "
                f"got {pools['store']}"
            )
        if spec.fault_tolerance.execution_mode.value != "async":
            out.append(
                "fault_tolerance.execution_mode: a torchft job is async (a group restarts "
                "alone while the others train)"
            )
        return out


RULES: dict[str, FrameworkRules] = {
    r.name: r
    for r in (
        PyTorchRules(),
        TensorFlowRules(),
        MpiRules(),
        BatchRules(),
        TorchftRules(),
        FrameworkRules(),
    )
}
