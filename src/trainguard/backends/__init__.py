"""Backends: the one seam between the master and processes or machines."""

from trainguard.backends.interface import (
    Backend,
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)

__all__ = [
    "Backend",
    "BackendEvent",
    "Launch",
    "ReplicaExited",
    "ReplicaFirstOutput",
    "ReplicaOutput",
    "ReplicaStarted",
]
