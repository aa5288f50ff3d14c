"""`batch`: independent shards (batch inference, data processing), async by nature.

Each shard gets SHARD_INDEX and SHARD_COUNT and is retried alone within
`max_replica_restarts`; a shard that spends it fails the job, or with
`allow_partial: true` is given up and reported while the other shards finish.
The job-wide class budgets do not bind shards (one flaky shard must not spend the
others' retries), so they default to unlimited here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.frameworks.base import EnvContext, Preset
from trainguard.policy.decisions import RolePolicy

if TYPE_CHECKING:
    from trainguard.spec.models import JobSpec


class Batch(Preset):
    name = "batch"

    def role_policy(self, spec: JobSpec) -> RolePolicy:
        # Every role is a shard.
        return RolePolicy(alone=None, on_spent="give_up" if spec.allow_partial else "fail_job")

    def env(self, ctx: EnvContext) -> dict[str, str]:
        return {
            **super().env(ctx),
            "SHARD_INDEX": str(ctx.plan.rank),
            "SHARD_COUNT": str(len(ctx.plans)),
        }
