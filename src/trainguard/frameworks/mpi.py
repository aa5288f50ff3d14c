"""`mpi`: one launcher replica runs `mpirun`; the `worker` replicas are its ranks.

The launcher pool's command is the launcher itself (`[mpirun]`, plus any flags of the
user's); trainguard adds the hostfile, the rank count, the loopback-only transport
and the variables to forward, then the workers' command, which every rank runs. The
ranks are started by mpirun, not by trainguard, yet they are supervised as replicas:
`trainguard.backends.mpi.backend` finds their pids, splits mpirun's tagged output into one log
per rank, and reports each rank's exit with the signal or code mpirun names. A rank's
death aborts the whole MPI job, so the job restarts as a whole (sync only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.frameworks.base import EnvContext, Preset

if TYPE_CHECKING:
    pass


class Mpi(Preset):
    name = "mpi"
    launcher = "mpi"

    def env(self, ctx: EnvContext) -> dict[str, str]:
        """Nothing: ranks inherit mpirun's environment and learn their rank from MPI
        (OMPI_COMM_WORLD_RANK); a RANK of the launcher's own would mislead them."""
        return {}
