"""The local backend: replicas as child processes of this machine, a guardian that kills them
with the master, the warm start (whether a replica forks, the zygote it forks from, and
what its children do to become the replica), and the OOM probe.
"""

__all__ = ["backend", "oom", "preload_plan", "python_cmd", "replica_init", "warm_start", "zygote"]
