"""What runs on a Ray node for a job with node agents (`ray.agents`, issue 40): one actor per
node, of no CPU, pinned there (hard node affinity), that starts the node's agent process
(`backends.agent.node`) and answers for the node: where it is, a port free there.

The agent dials the master and forks the node's ranks from its own zygote; Ray only holds
the node (this actor) and the resources (the attempt's placement group, whose bundles no
actor uses). When this actor dies (ray.kill, its node or its driver gone), PR_SET_PDEATHSIG
takes the agent, and the agent's guardian takes its replicas. Like `ReplicaHost`, a plain
class that imports nothing from Ray at module level."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping

from trainguard.backends.agent.protocol import TOKEN_ENV
from trainguard.backends.net import free_port
from trainguard.backends.ray.host import child_setup


def gpu_ids_here() -> str:
    """In a task placed in a replica's bundle: the GPU ids Ray reserved for that bundle."""
    import ray

    return ",".join(str(g) for g in ray.get_gpu_ids())


class AgentHost:
    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def where(self) -> dict[str, str]:
        """This node: its Ray id, IP address and host name."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "host": socket.gethostname(),
            "gpus": "",
        }

    def free_port(self) -> int:
        return free_port("")

    def start(self, master: str, job: str, node: str, token: str, env: Mapping[str, str]) -> int:
        """The node's agent, dialing the master at `master` (HOST:PORT); its pid. Its output
        goes to this actor's (Ray's worker log on the node)."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        argv = [sys.executable, "-m", "trainguard.backends.agent.node", master, job, node]
        self._proc = subprocess.Popen(
            argv,
            env={**os.environ, **env, TOKEN_ENV: token},
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ray's signals to its worker are not the agent's
            preexec_fn=child_setup(None),
        )
        return self._proc.pid

    def ended(self) -> int | None:
        """The agent's exit status (None while it runs, or before it started)."""
        return None if self._proc is None else self._proc.poll()
