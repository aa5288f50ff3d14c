"""Framework presets (R-JOB-7): one module each, named in this table."""

from __future__ import annotations

from trainguard.frameworks.base import EnvContext, Preset, Roster
from trainguard.frameworks.batch import Batch
from trainguard.frameworks.generic import Generic
from trainguard.frameworks.mpi import Mpi
from trainguard.frameworks.pytorch import PyTorch
from trainguard.frameworks.tensorflow import TensorFlow
from trainguard.frameworks.torchft import Torchft

PRESETS: dict[str, Preset] = {
    p.name: p for p in (PyTorch(), TensorFlow(), Mpi(), Batch(), Torchft(), Generic())
}


def preset(name: str) -> Preset:
    return PRESETS[name]


__all__ = ["PRESETS", "EnvContext", "Preset", "Roster", "preset"]
