"""`torchft`: replica groups that heal from each other, a Lighthouse, a store per group.

torchft (pytorch's per-step fault tolerance) forms a quorum of replica groups at every
step through its Lighthouse; a group that dies is dropped from the quorum, the others
train on, and the group restarted later heals its weights from a live peer. What it
leaves to a supervisor is this preset's: one Lighthouse per job (the `lighthouse` role,
`torchft_lighthouse` with the spec's timing), a TCPStore for each group's Manager (the
`store` replica of the group hosts it, at the stable address of its first rank, so a
restarted group finds its store again; the store is restarted with its group, so it is
a fresh one), and each rank's environment: the Lighthouse,
its group's id and store, and its rank within the group. The master restarts a failed
group whole and alone (`RolePolicy.groups`), never a single rank of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.frameworks.base import EnvContext, Preset, Roster
from trainguard.policy.decisions import RolePolicy
from trainguard.spec.engines import TorchftOptions
from trainguard.spec.frameworks import TORCHFT_SERVICES

if TYPE_CHECKING:
    from trainguard.spec.models import JobSpec


class Torchft(Preset):
    name = "torchft"
    task_addresses = True
    services = frozenset(TORCHFT_SERVICES)

    def role_policy(self, spec: JobSpec) -> RolePolicy:
        opts = spec.torchft
        # A group is its ranks and its store: the store is restarted with the ranks, so
        # a restarted group meets at a fresh one (no key of its last run left there).
        groups = tuple((*ranks, f"store-{g}") for g, ranks in enumerate(groups_of(spec)))
        return RolePolicy(
            alone=frozenset({"lighthouse"}),
            groups=groups,
            max_group_restarts=opts.max_group_restarts,
            group_rejoin_s=opts.heartbeat_timeout_ms / 1000,
        )

    def env(self, ctx: EnvContext) -> dict[str, str]:
        plan, opts = ctx.plan, _options(ctx.roster)
        if plan.role != "worker":
            return {}
        per = opts.nproc_per_group
        group, rank = divmod(plan.index, per)
        store = ctx.task_addresses[f"worker-{group * per}"]
        host, _, port = store.rpartition(":")
        return {
            "TORCHFT_LIGHTHOUSE": f"http://{ctx.task_addresses['lighthouse-0']}",
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(ctx.pool_size("worker") // per),
            "TORCHFT_QUORUM_RETRIES": str(opts.quorum_retries),
            "MASTER_ADDR": host,
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(per),
            "LOCAL_WORLD_SIZE": str(per),
            # the group's own process group (several ranks) meets at the same store, as
            # a client: trainguard hosts it
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def argv(self, ctx: EnvContext) -> tuple[str, ...]:
        plan, opts = ctx.plan, _options(ctx.roster)
        if plan.role == "lighthouse":
            return (
                *plan.argv,
                "--bind",
                ctx.task_addresses[plan.name],
                "--min_replicas",
                str(opts.min_replicas),
                "--heartbeat_timeout_ms",
                str(opts.heartbeat_timeout_ms),
                "--join_timeout_ms",
                str(opts.join_timeout_ms),
            )
        if plan.role == "store":
            return (*plan.argv, _stores(ctx.roster)[plan.index])
        return plan.argv

    def ready_endpoint(self, roster: Roster, replica: str) -> tuple[str, int] | None:
        role, _, index = replica.rpartition("-")
        if role == "lighthouse":
            address = roster.task_addresses[replica]
        elif role == "store":
            address = _stores(roster)[int(index)]
        else:
            return None
        host, _, port = address.rpartition(":")
        return host.strip("[]"), int(port)


def groups_of(spec: JobSpec) -> tuple[tuple[str, ...], ...]:
    """The replica names of each group, in group order."""
    per = spec.torchft.nproc_per_group
    workers = next(p.replicas for p in spec.worker_pools if p.role == "worker")
    return tuple(tuple(f"worker-{g * per + i}" for i in range(per)) for g in range(workers // per))


def _options(roster: Roster) -> TorchftOptions:
    return roster.spec.torchft if roster.spec is not None else TorchftOptions()


def _stores(roster: Roster) -> list[str]:
    """Each group's store address: its first rank's stable address (once per job)."""
    per = _options(roster).nproc_per_group
    return roster.memo(
        "torchft_stores",
        lambda: [
            roster.task_addresses[p.name]
            for p in roster.plans
            if p.role == "worker" and not p.index % per
        ],
    )
