"""The port path for Ray Train users: the same calls, under trainguard.

    from ray import train                  ->  from trainguard import train
    from ray.train import Checkpoint       ->  from trainguard.train import Checkpoint

`train.report(metrics, checkpoint=Checkpoint.from_directory(d))`, `train.get_checkpoint()`,
`checkpoint.as_directory()` and `train.get_context().get_world_rank()` mean what they mean in
Ray Train; the launcher becomes `trainguard run --nproc-per-node N -- python train.py`
instead of `TorchTrainer(...).fit()`. Standard library only, like the SDK underneath.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from trainguard import sdk
from trainguard.storage.env import ENV_JOB_ID


class Checkpoint:
    """A folder of checkpoint files (Ray Train's `Checkpoint`, local folders only)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """The checkpoint in the folder `path`, as it is: nothing is copied until `report`."""
        return cls(path)

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint's files as a local folder (read it, do not change it)."""
        yield self.path

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """A copy of the checkpoint's files in `path` (or a new temporary folder)."""
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint-")
        shutil.copytree(self.path, target, dirs_exist_ok=True)
        return target

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"


def report(metrics: dict[str, object], checkpoint: Checkpoint | None = None) -> None:
    """Report `metrics` (with `step` if they have one) and, optionally, a checkpoint: its
    folder is copied into the job's storage before the master is told (`sdk.report`).
    Outside trainguard nothing is stored or sent, and a warning says so once."""
    sdk.report(metrics, checkpoint.path if checkpoint is not None else None)


def get_checkpoint() -> Checkpoint | None:
    """The newest complete checkpoint of this job to resume from (an in-memory snapshot
    where it is of a step no older than the newest stored one), or None when there is none."""
    path = sdk.get_checkpoint()
    return Checkpoint(path) if path else None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value and value.lstrip("-").isdigit() else default


class TrainContext:
    """Ray Train's `TrainContext`, read from the environment trainguard gives a replica."""

    def get_world_rank(self) -> int:
        """This replica's rank (`RANK`, else 0)."""
        return _env_int("RANK", 0)

    def get_world_size(self) -> int:
        """How many ranks train together (`WORLD_SIZE`, else 1)."""
        return _env_int("WORLD_SIZE", 1)

    def get_local_rank(self) -> int:
        """This replica's rank among the ranks of its node (`LOCAL_RANK`, else 0)."""
        return _env_int("LOCAL_RANK", 0)

    def get_local_world_size(self) -> int:
        """How many ranks run on this replica's node (`LOCAL_WORLD_SIZE`, else 1)."""
        return _env_int("LOCAL_WORLD_SIZE", 1)

    def get_node_rank(self) -> int:
        """The rank of this replica's node among the job's nodes (`GROUP_RANK`, else 0)."""
        return _env_int("GROUP_RANK", 0)

    def get_experiment_name(self) -> str:
        """The trainguard job's id (`TRAINGUARD_JOB_ID`; "" outside trainguard)."""
        return os.environ.get(ENV_JOB_ID, "")


def get_context() -> TrainContext:
    """This replica's `TrainContext`: its ranks and sizes, read from its environment."""
    return TrainContext()
