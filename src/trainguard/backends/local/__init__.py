"""The local backend: replicas as child processes of this machine, a guardian that kills them
with the master, the warm-start zygote and the OOM probe.
"""

__all__ = ["backend", "oom", "zygote"]
