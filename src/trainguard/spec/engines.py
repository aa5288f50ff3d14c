"""Options of the engines that place and group a job's replicas: a Ray cluster, a Slurm
allocation, torchft's replica groups (the `ray:`, `slurm:` and `torchft:` sections)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trainguard.spec.base import SpecModel
from trainguard.spec.limits import MAX_LIMIT, MAX_REPLICAS, MAX_SECONDS, Limit
from trainguard.spec.text import shown

_HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)"
_RAY_ADDRESS = re.compile(
    rf"^(auto|local|{_HOST}:(?P<port>\d{{1,5}})|ray://{_HOST}(:(?P<client>\d{{1,5}}))?)$"
)


class RayOptions(SpecModel):
    """Where and how a job's replicas are placed on a Ray cluster."""

    address: str = "auto"  # `auto`, host:port of the GCS, or ray://host:10001
    placement_strategy: Literal["spread", "pack"] = "spread"
    # How long Ray may take to place an attempt's replicas; past it the job fails for lack
    # of capacity (or waits, with `queue.wait_for_capacity`).
    placement_timeout_s: float = Field(default=60.0, gt=0, le=MAX_SECONDS)
    driver_ip: str | None = None  # the master's own address in the cluster (tests: 127.0.0.1)
    # A node that answers none of the master's calls for this long is lost: a host cut off
    # the network stays "alive" in Ray's eyes for ~30 s (its default health check).
    node_timeout_s: float = Field(default=10.0, gt=0, le=MAX_SECONDS)
    # One agent per node forks its ranks (issue 40): an actor per node, not per rank; a
    # node whose agent goes silent for 3 s is lost, whatever its ranks were doing. False:
    # an actor per rank runs it (`ReplicaHost`).
    agents: bool = True
    # How long a node's agent may take to join (its actor's start, the agent's imports).
    agent_join_s: float = Field(default=60.0, gt=0, le=MAX_SECONDS)

    @field_validator("address")
    @classmethod
    def _an_address(cls, value: str) -> str:
        """What `ray.init` takes; anything else failed inside the master, attempt after
        attempt, as an internal error."""
        m = _RAY_ADDRESS.match(value)
        port = m and (m["port"] or m["client"])
        if m is None or (port and not 0 < int(port) < 65536):
            raise ValueError(
                f"must be auto, local, HOST:PORT or ray://HOST:PORT, got {shown(value)}"
            )
        return value

    @field_validator("driver_ip")
    @classmethod
    def _one_address(cls, value: str | None) -> str | None:
        """The SDK channel listens there: an address replicas dial, never all interfaces."""
        if value is not None and value.strip("[]") in ("0.0.0.0", "::", ""):
            raise ValueError(
                f"{shown(value)} is every interface: name the master's own address in the cluster"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _lower(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("placement_strategy"), str):
            data = {**data, "placement_strategy": data["placement_strategy"].lower()}
        return data


class SlurmOptions(SpecModel):
    """A job inside a Slurm allocation (`sbatch`/`salloc`): its replicas on the allocation's
    nodes, `tasks_per_node` per node in rank order, forked by each node's agent (one job
    step per node) or, without agents, each its own step (`srun`)."""

    # Nodes the job uses (default: as many as its replicas need at tasks_per_node); the
    # allocation's other nodes are spares for a node that is lost.
    nodes: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    # Replicas on each node, in rank order (`--nproc-per-node` with `--nodes`); with `nodes`
    # given, `nodes` x `tasks_per_node` must equal the replicas.
    tasks_per_node: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    # `scontrol update nodename=N state=drain reason=...` for a lost node (needs the right).
    drain_lost_nodes: bool = False
    srun_args: list[str] = Field(default_factory=list)  # more flags for every step
    # How long a node's slurmd may take to answer a connect before it counts as lost.
    probe_timeout_s: float = Field(default=1.0, gt=0, le=60)
    # One agent per node forks its ranks (issue 40): a step per node, not per rank; a
    # node whose agent goes silent for 3 s is lost, whatever its ranks were doing.
    # False: each rank its own step, its srun supervised from the batch host.
    agents: bool = True
    # How long a node's agent may take to join (srun's start, the agent's imports).
    agent_join_s: float = Field(default=60.0, gt=0, le=MAX_SECONDS)


class TorchftOptions(SpecModel):
    """A torchft job (framework torchft): its replica groups and its Lighthouse's timing.

    The worker pool's replicas are `groups x nproc_per_group`; group g is the ranks
    g*N .. g*N+N-1. torchft's Lighthouse defaults (a 60 s join timeout, a 5 s heartbeat)
    suit a cluster of many groups; a quorum here waits 1 s for stragglers and a group is
    dead after 2 s of silence, so a restarted group rejoins in seconds.
    """

    nproc_per_group: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    # Groups a quorum needs; with 1, a lone healthy group trains on while the others heal.
    min_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    # A group silent this long leaves the Lighthouse's quorum (its `--heartbeat_timeout_ms`);
    # a restarted group also waits this long before it rejoins.
    heartbeat_timeout_ms: int = Field(default=2000, ge=100, le=3_600_000)
    # Once `min_replicas` groups are in, how long a quorum waits for other live groups to
    # join (the Lighthouse's `--join_timeout_ms`).
    join_timeout_ms: int = Field(default=1000, ge=0, le=3_600_000)
    # How often a trainer retries a quorum the Lighthouse did not answer (it restarts).
    quorum_retries: int = Field(default=20, ge=0, le=MAX_LIMIT)
    # Restarts of each group alone within an attempt; then the whole job restarts.
    max_group_restarts: Limit = 10
