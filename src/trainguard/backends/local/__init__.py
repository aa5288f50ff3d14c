"""The local backend: replicas as child processes of this machine (each run with every
process it starts, tracked by cgroup or as a subreaper), a guardian that kills them with the
master, the warm start (whether a replica forks, the zygote it forks from, and what its
children do to become the replica, the keeper of the rendezvous store it forks), each run's
memory limit (its pool's resources.memory), and the OOM probe.
"""

__all__ = [
    "backend",
    "cgroups",
    "import_order",
    "memory_limit",
    "oom",
    "preload_plan",
    "python_cmd",
    "rendezvous_keeper",
    "replica_init",
    "run",
    "tracking",
    "warm_start",
    "zygote",
]
