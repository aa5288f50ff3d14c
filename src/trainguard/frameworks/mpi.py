"""`mpi`: one launcher replica runs `mpirun`; the `worker` replicas are its ranks.

The launcher pool's command is the launcher itself (`[mpirun]`, plus any flags of the
user's); trainguard adds the hostfile, the rank count, the loopback-only transport
and the variables to forward, then the workers' command, which every rank runs. The
ranks are started by mpirun, not by trainguard, yet they are supervised as replicas:
`trainguard.backends.mpi` finds their pids, splits mpirun's tagged output into one log
per rank, and reports each rank's exit with the signal or code mpirun names. A rank's
death aborts the whole MPI job, so the job restarts as a whole (sync only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trainguard.frameworks.base import EnvContext, Preset

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trainguard.backends.base import Backend
    from trainguard.spec import JobSpec


class Mpi(Preset):
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

    def wrap_backend(self, backend: Backend) -> Backend:
        from trainguard.backends.mpi import MpiBackend

        return MpiBackend(backend)

    def env(self, ctx: EnvContext) -> dict[str, str]:
        """Nothing: ranks inherit mpirun's environment and learn their rank from MPI
        (OMPI_COMM_WORLD_RANK); a RANK of the launcher's own would mislead them."""
        return {}
