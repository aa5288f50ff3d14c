"""The MPI backend: one mpirun per attempt, its launcher helpers."""

__all__ = ["backend", "launch"]
