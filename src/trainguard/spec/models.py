"""The job spec: validated value objects (R-JOB-1, R-POL-1..4).

Every field has the meaning and default of its AIMaster / Vertex counterpart. A bad
value raises `SpecError` with one line per problem naming the field and the value.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainguard.errors import SpecError
from trainguard.spec.base import SpecModel
from trainguard.spec.engines import RayOptions, SlurmOptions, TorchftOptions
from trainguard.spec.fault_tolerance import ExecutionMode as ExecutionMode
from trainguard.spec.fault_tolerance import FaultTolerance as FaultTolerance
from trainguard.spec.fault_tolerance import FaultTolerantPolicy as FaultTolerantPolicy
from trainguard.spec.fault_tolerance import case_insensitive
from trainguard.spec.fields import unspelled
from trainguard.spec.frameworks import RULES
from trainguard.spec.injection import parse_injection
from trainguard.spec.limits import MAX_REPLICAS, UNLIMITED
from trainguard.spec.notify_rules import NotifyRule
from trainguard.spec.problems import validation_problems
from trainguard.spec.progress import ProgressOptions
from trainguard.spec.safe_yaml import YamlProblem, parse_bounded, read_bounded
from trainguard.spec.sections import CheckpointPolicy as CheckpointPolicy
from trainguard.spec.sections import QueuePolicy as QueuePolicy
from trainguard.spec.text import non_utf8_problems, shown


class SuccessPolicy(StrEnum):
    CHIEF = "chief"
    ALL = "all"


_MEMORY = re.compile(r"^\d+(\.\d+)?\s*([KMGT]i?B?|[kmgt]b?|)$")


class Resources(SpecModel):
    # CPUs of one replica (default 1): what its Ray bundle reserves and a server's quota
    # counts; not a limit on the local backend.
    cpus: float | None = Field(default=None, gt=0, le=4096)
    # GPUs of one replica: ids from `gpu_inventory` in its `CUDA_VISIBLE_DEVICES` (on Ray,
    # reserved in its bundle); a GPU found faulty is isolated.
    gpus: int = Field(default=0, ge=0, le=1024)
    # Memory of one replica (e.g. `16Gi`): a cgroup limit on the local backend where it can
    # set one; reserved on Ray; counted by a server's quota.
    memory: str | None = None
    custom: dict[str, float] = Field(default_factory=dict)  # Ray custom resources

    @model_validator(mode="after")
    def _check_memory(self) -> Resources:
        if self.memory is not None and not _MEMORY.match(self.memory):
            raise ValueError(
                f"memory: must be a size such as 4Gi or 512M, got {shown(self.memory)}"
            )
        return self


_ROLE = r"^[a-z][a-z0-9_-]{0,31}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class WorkerPool(SpecModel):
    # The pool's part in the job (worker, chief, ps...: the framework gives roles their
    # meaning); its replicas are named `<role>-0`, `<role>-1`, ...
    role: str = Field(default="worker", pattern=_ROLE)
    # How many processes run the command; each is a rank of the job (a chief or launcher
    # pool's first).
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    # What each replica runs, as an argument list (`command[0]` is the program), not a
    # shell line.
    command: list[str] = Field(min_length=1)
    # Variables added to each replica's environment; they win over the ones trainguard and
    # the framework set.
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)

    @model_validator(mode="after")
    def _check_command(self) -> WorkerPool:
        if not self.command[0].strip():
            raise ValueError("command[0]: must name a program, got ''")
        for i, arg in enumerate(self.command):
            if "\x00" in arg:
                raise ValueError(f"command[{i}]: holds a NUL byte, which no program can receive")
        for key, value in self.env.items():
            if not key or "=" in key or "\x00" in key:
                raise ValueError(
                    f"env: {shown(key)} is not a variable name (empty, or with '=' or a NUL byte)"
                )
            if "\x00" in value:
                raise ValueError(f"env.{key}: holds a NUL byte, which no process can receive")
        return self


def preload_names(value: object) -> list[str]:
    """`torch, numpy` (or a list, or one value) as names, blanks dropped."""
    items = value.split(",") if isinstance(value, str) else value
    items = items if isinstance(items, list) else [items]
    return [n for n in (str(m).strip() for m in items) if n]


class JobSpec(SpecModel):
    name: str = Field(pattern=_NAME)
    framework: str = "pytorch"  # a preset of trainguard.frameworks
    worker_pools: list[WorkerPool] = Field(min_length=1)
    success_policy: Annotated[SuccessPolicy, case_insensitive(SuccessPolicy)] = SuccessPolicy.CHIEF
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    # The GPU ids this job may use on this machine (default: what nvidia-smi lists).
    gpu_inventory: list[Annotated[int, Field(ge=0, le=4095)]] | None = None
    # Faults to inject into this job (see inject.py), e.g. "signal:worker-1:SIGKILL@20s".
    fault_injection: list[str] = Field(default_factory=list)
    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    # Warm start (on by default): modules a zygote imports once, Python replicas fork from
    # it. `auto`: what the program needs (torch, numpy, ...); `none` (or []): off.
    preload: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")]] = Field(
        default_factory=lambda: ["auto"]
    )
    # Where the replicas run: processes on this machine, or actors on a Ray cluster.
    backend: Literal["local", "ray", "slurm"] = "local"
    ray: RayOptions = Field(default_factory=RayOptions)
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    notifications: list[NotifyRule] = Field(default_factory=list)
    # batch: a shard that cannot be retried is given up and listed; the others finish.
    allow_partial: bool = False
    torchft: TorchftOptions = Field(default_factory=TorchftOptions)
    # Progress read from the replicas' output where the code does not report it (auto/off).
    progress: ProgressOptions = Field(default_factory=ProgressOptions)

    @field_validator("preload", mode="before")
    @classmethod
    def _preload_words(cls, value: Any) -> Any:
        """`preload: none` turns warm start off; `preload: torch,numpy` is a list."""
        if isinstance(value, str):
            value = preload_names(value)
        if isinstance(value, list) and [str(m).lower() for m in value] == ["none"]:
            return []
        if isinstance(value, list) and any(str(m).lower() == "none" for m in value):
            raise ValueError("'none' turns warm start off: it cannot be listed with modules")
        return value

    @field_validator("gpu_inventory")
    @classmethod
    def _gpus_once(cls, value: list[int] | None) -> list[int] | None:
        twice = sorted({g for g in value or [] if (value or []).count(g) > 1})
        if twice:
            raise ValueError(f"GPU {twice[0]} is listed twice: each GPU is handed out once")
        return value

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data: Any) -> Any:
        """The preset's defaults (batch is async, ...) where the spec does not say."""
        if not isinstance(data, dict):
            return data
        preset = RULES.get(data.get("framework", "pytorch"))
        if preset is None:
            return data  # the field validator names it
        ft = data.get("fault_tolerance") or {}
        pools = data.get("worker_pools")
        defaults = preset.ft_defaults_for(pools if isinstance(pools, list) else [])
        if defaults and isinstance(ft, dict):
            data = {**data, "fault_tolerance": {**unspelled(defaults, ft), **ft}}
        if preset.success_policy and data.get("success_policy") is None:
            data = {**data, "success_policy": preset.success_policy}
        if isinstance(pools, list):
            services = preset.service_pools(pools, data)
            if services:
                data = {**data, "worker_pools": [*pools, *services]}
        return data

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, value: str) -> str:
        if value not in RULES:
            names = [repr(n) for n in RULES]
            raise ValueError(
                f"must be one of {', '.join(names[:-1])} or {names[-1]}, got {shown(value)}"
            )
        return value

    @model_validator(mode="after")
    def _fits_framework(self) -> JobSpec:
        problems = RULES[self.framework].problems(self)
        total = sum(pool.replicas for pool in self.worker_pools)
        if total > MAX_REPLICAS:
            problems.append(f"worker_pools: {total} replicas in all, at most {MAX_REPLICAS}")
        if self.allow_partial and not RULES[self.framework].partial_results:
            problems.append(f"allow_partial: a {self.framework} job cannot succeed in part")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _fits_slurm(self) -> JobSpec:
        """The replicas fill `nodes` x `tasks_per_node` exactly, where nodes are given."""
        opts = self.slurm
        if self.backend != "slurm" or opts.nodes is None:
            return self
        want = opts.nodes * opts.tasks_per_node
        if self.world_size != want:
            raise ValueError(
                f"slurm: {opts.nodes} node(s) x {opts.tasks_per_node} task(s) per node is "
                f"{want} replicas, but the job has {self.world_size}"
            )
        return self

    @model_validator(mode="after")
    def _nodes_need_slurm(self) -> JobSpec:
        """Only a Slurm allocation spreads replicas over `nodes`: elsewhere they would be
        ignored, so they are refused (Ray places its bundles by `ray.placement_strategy`:
        a node count has no meaning there, even 1, which `pack` does not promise)."""
        nodes = self.slurm.nodes
        if self.backend == "local" and nodes is not None and nodes > 1:
            raise ValueError(
                f"slurm.nodes: {nodes} nodes need the slurm backend (inside an allocation); "
                "the local backend runs every replica on this machine"
            )
        if self.backend == "ray" and nodes is not None:
            raise ValueError(
                f"slurm.nodes: {nodes} node(s) need the slurm backend; the ray backend "
                "places replicas by ray.placement_strategy (spread or pack), not a node count"
            )
        return self

    @field_validator("fault_injection")
    @classmethod
    def _injections(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_injection(text)  # a ValueError names the problem
        return value

    @model_validator(mode="after")
    def _injections_name_replicas(self) -> JobSpec:
        names = [f"{p.role}-{i}" for p in self.worker_pools for i in range(p.replicas)]
        ft = self.fault_tolerance
        last = (
            None
            if self.queue.wait_for_capacity or ft.max_num_of_job_restart == UNLIMITED
            else ft.max_num_of_job_restart
            if ft.enable_job_restart
            else 0
        )
        for text in self.fault_injection:
            injection = parse_injection(text)
            if last is not None and injection.attempt > last:
                raise ValueError(
                    f"fault_injection: {shown(text)} is for attempt {injection.attempt}, but this "
                    f"job's restart budget allows attempts 0 to {last} only: it could never fire"
                )
            replica = injection.replica
            if replica is not None and replica not in names:
                listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
                raise ValueError(
                    f"fault_injection: {shown(text)} names {replica}, which this job does not have "
                    f"(it has {listed})"
                )
        return self

    @model_validator(mode="after")
    def _unique_roles(self) -> JobSpec:
        roles = [p.role for p in self.worker_pools]
        dup = sorted({r for r in roles if roles.count(r) > 1})
        if dup:
            raise ValueError(f"worker_pools: role names must be unique, got {shown(dup[0])} twice")
        if (
            roles.count("chief")
            and next(p for p in self.worker_pools if p.role == "chief").replicas != 1
        ):
            raise ValueError("worker_pools: the chief pool must have exactly 1 replica")
        return self

    @property
    def world_size(self) -> int:
        return sum(p.replicas for p in self.worker_pools)


def validate_spec(data: Any) -> JobSpec:
    """Build a JobSpec from plain data, or raise SpecError naming every problem."""
    if not isinstance(data, dict):
        raise SpecError([f"job spec: must be a mapping, got {type(data).__name__}"])
    undecodable = non_utf8_problems(data)
    if undecodable:
        raise SpecError(undecodable)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc)) from None


def load_spec_file(path: Path) -> dict[str, Any]:
    """Read a YAML (or JSON) job spec into plain data; errors name the file.

    Bounded (safe_yaml): at most 1 MiB, no alias bombs, no deep nesting, no key twice.
    """
    try:
        data = parse_bounded(read_bounded(path))
    except OSError as exc:
        raise SpecError([f"{path}: cannot read the job spec ({exc.strerror})"]) from None
    except YamlProblem as exc:
        raise SpecError([f"{path}: {exc}"]) from None
    if not isinstance(data, dict):
        raise SpecError([f"{path}: a job spec must be a mapping, got {type(data).__name__}"])
    return data
