"""`pytorch` (the default): the environment torchrun gives its workers.

Code written for torchrun (and libraries that detect a torchrun launch through the
TORCHELASTIC_* variables) runs unchanged. Built as if every rank ran on one node
(LOCAL_RANK == RANK, GROUP_RANK 0); a backend that spreads the ranks over nodes lays the
node variables out again from its placement (`frameworks.node_env`).
"""

from __future__ import annotations

import os

from trainguard.frameworks.base import EnvContext, Preset


class PyTorch(Preset):
    name = "pytorch"

    def env(self, ctx: EnvContext) -> dict[str, str]:
        plan, world = ctx.plan, str(len(ctx.plans))
        env = {
            "RANK": str(plan.rank),
            "LOCAL_RANK": str(plan.rank),
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": world,
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": plan.role,
            "ROLE_RANK": str(plan.index),
            "ROLE_WORLD_SIZE": str(ctx.pool_size(plan.role)),
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "TORCHELASTIC_RUN_ID": ctx.job_id,
            "TORCHELASTIC_RESTART_COUNT": str(ctx.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
            # rank 0 hosts the rendezvous store, unless the backend holds it (and says so)
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            # as torchrun: a failed NCCL collective ends the rank (an exit the master sees)
            # instead of leaving it hung, unless the user's environment says otherwise
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
            ),
        }
        if len(ctx.plans) > 1:
            # as torchrun with more than one process: one OpenMP thread each (not one per
            # core in every rank), unless the user's environment says how many
            env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
        return env
