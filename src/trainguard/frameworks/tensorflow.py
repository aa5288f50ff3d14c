"""`tensorflow`: TF_CONFIG for chief, worker, ps and evaluator tasks; CLUSTER_SPEC as Vertex.

Every task has one address for the job's whole life, so a worker restarted alone finds
the same cluster and the others find it again (ParameterServerStrategy's coordinator
waits for a lost worker to come back). The evaluator is not part of the cluster, as in
TensorFlow's own convention, and its failure never ends training. With a ps pool the job
is async by default: a worker restarts alone; a chief or ps failure restarts the whole
job (or fails it when job restarts are off). Without a ps pool (MultiWorkerMirrored-
Strategy) it is sync: a worker restarted alone cannot rejoin its peers' collective.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from trainguard.frameworks.base import EnvContext, Preset
from trainguard.policy.decisions import RolePolicy
from trainguard.spec.frameworks import CLUSTER_ROLES

if TYPE_CHECKING:
    from trainguard.spec.models import JobSpec

# Vertex AI's pools: the primary replica, workers, parameter servers, evaluators.
VERTEX_POOLS = {
    "chief": "workerpool0",
    "worker": "workerpool1",
    "ps": "workerpool2",
    "evaluator": "workerpool3",
}


class TensorFlow(Preset):
    name = "tensorflow"
    task_addresses = True

    def role_policy(self, spec: JobSpec) -> RolePolicy:
        return RolePolicy(alone=frozenset({"worker"}), optional=frozenset({"evaluator"}))

    def env(self, ctx: EnvContext) -> dict[str, str]:
        plan = ctx.plan
        by_role = ctx.roster.memo("tf_by_role", lambda: _by_role(ctx))
        cluster = ctx.roster.memo(
            "tf_cluster",
            lambda: json.dumps({r: by_role[r] for r in CLUSTER_ROLES if r in by_role}),
        )
        vertex = ctx.roster.memo(
            "tf_vertex", lambda: json.dumps({VERTEX_POOLS[r]: a for r, a in by_role.items()})
        )
        task = json.dumps({"type": plan.role, "index": plan.index})
        vertex_task = json.dumps({"type": VERTEX_POOLS[plan.role], "index": plan.index})
        # The job-wide parts are serialised once; each replica adds only its own task.
        return {
            **super().env(ctx),
            "TF_CONFIG": f'{{"cluster": {cluster}, "task": {task}}}',
            "CLUSTER_SPEC": (
                f'{{"cluster": {vertex}, "environment": "cloud", "task": {vertex_task}}}'
            ),
        }


def _by_role(ctx: EnvContext) -> dict[str, list[str]]:
    by_role: dict[str, list[str]] = {}
    for p in ctx.plans:  # in rank order, hence index order within each role
        by_role.setdefault(p.role, []).append(ctx.task_addresses[p.name])
    return by_role
