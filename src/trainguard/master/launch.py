"""What the master hands the backend to start one replica: its command, its environment
(the framework's, the SDK channel's, its GPUs), its working folder and its log file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.backends.interface import SERVICE_ENV, Launch
from trainguard.frameworks import EnvContext, Preset, Roster
from trainguard.frameworks.node_env import DEVICES, OWN_DEVICES
from trainguard.frameworks.replica_plan import ReplicaPlan, replica_env
from trainguard.spec.models import JobSpec
from trainguard.spec.sizes import parse_memory
from trainguard.storage.env import ENV_FAULTHANDLER_FILE


@dataclass
class LaunchBuilder:
    """One per job: the job-wide part (the roster) is built once, at the first launch."""

    job_id: str
    preset: Preset
    plans: tuple[ReplicaPlan, ...]
    log_dir: Path
    cwd: str
    max_restarts: int | str
    spec: JobSpec | None = None
    roster: Roster | None = field(default=None, init=False)
    _environ_of: tuple[int, dict[str, str]] | None = field(default=None, init=False)

    def use_tasks(self, tasks: Mapping[str, str]) -> None:
        """The replicas' own addresses for this attempt (the backend's; the same as the
        last attempt's wherever a replica runs where it did)."""
        if self.roster is None or dict(self.roster.task_addresses) != dict(tasks):
            self.roster = Roster(self.plans, dict(tasks), self.spec)

    @property
    def tasks(self) -> Mapping[str, str]:
        return self.roster.task_addresses if self.roster is not None else {}

    def log_path(self, attempt: int, replica: str, restart: int) -> Path:
        """One file per replica per attempt; a replica restarted alone gets `.rN`."""
        suffix = f".r{restart}" if restart else ""
        return self.log_dir.joinpath(f"attempt-{attempt}", f"{replica}{suffix}.log")  # one join

    def build(
        self,
        plan: ReplicaPlan,
        attempt: int,
        restart: int,
        rendezvous: tuple[str, int],
        channel: Mapping[str, str],
        devices: str | None,
    ) -> Launch:
        """`channel`: the SDK's variables for this job (master URL, token, checkpoints)."""
        addr, port = rendezvous
        if self.roster is None:
            self.roster = Roster(self.plans, {}, self.spec)
        log_path = self.log_path(attempt, plan.name, restart)
        ctx = EnvContext(
            plan=plan,
            roster=self.roster,
            job_id=self.job_id,
            master_addr=addr,
            master_port=port,
            restart_count=attempt + restart,
            max_restarts=self.max_restarts,
        )
        sdk_env = {
            **channel,
            ENV_FAULTHANDLER_FILE: str(log_path.with_suffix(".stacks.txt")),
        }
        env = {**self._environ(attempt), **replica_env(self.preset, ctx, sdk_env)}
        if devices is not None and DEVICES not in dict(plan.env):  # the pool's own wins
            env[DEVICES] = env[OWN_DEVICES] = devices  # a backend may lay DEVICES out
        if plan.role in self.preset.services:
            env[SERVICE_ENV] = plan.role
        return Launch(
            attempt=attempt,
            replica=plan.name,
            rank=plan.rank,
            restart=restart,
            argv=self.preset.argv(ctx),
            env=env,
            cwd=self.cwd,
            log_path=log_path,
            memory_bytes=self._memory_bytes(plan.role),
        )

    def _environ(self, attempt: int) -> dict[str, str]:
        """The master's environment, read once an attempt (not once a replica: os.environ
        decodes every variable each time it is read whole)."""
        if self._environ_of is None or self._environ_of[0] != attempt:
            self._environ_of = (attempt, dict(os.environ))
        return self._environ_of[1]

    def _memory_bytes(self, role: str) -> int | None:
        """The `resources.memory` of the pool of `role`, in bytes (None: none set)."""
        pools = self.spec.worker_pools if self.spec is not None else []
        memory = next((p.resources.memory for p in pools if p.role == role), None)
        return parse_memory(memory) if memory else None
