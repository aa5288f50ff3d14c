"""The Ray backend: replicas in actors placed on a Ray cluster, one host actor per replica
and one zygote actor per node (the warm start)."""

__all__ = [
    "backend",
    "calls",
    "exit_probe",
    "host",
    "node_check",
    "node_zygote",
    "placement",
    "warm",
]
