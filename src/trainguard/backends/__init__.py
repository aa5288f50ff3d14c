"""Backends: the one seam between the master and processes or machines."""

from trainguard.backends.base import (
    Backend,
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaStarted,
)

__all__ = [
    "Backend",
    "BackendEvent",
    "Launch",
    "ReplicaExited",
    "ReplicaFirstOutput",
    "ReplicaStarted",
]
