"""The Ray backend: replicas in actors placed on a Ray cluster, one host actor per node."""

__all__ = ["backend", "host"]
