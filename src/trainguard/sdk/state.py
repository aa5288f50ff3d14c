"""Checkpoints and in-memory snapshots, from the training code's side: `report` commits a
checkpoint folder, `snapshot` keeps each step's state in the job's shared memory, and
`get_checkpoint` / `load_snapshot` give back the newest complete one after a restart."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.sdk import channel
from trainguard.storage.env import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_SNAPSHOT_DIR,
    ENV_SNAPSHOT_PERSIST_EVERY,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trainguard.storage.snapshots import Writer


def report(metrics: dict[str, object], checkpoint: str | None = None) -> None:
    """Report progress (`metrics`, with `step` if it has one) and, optionally, a checkpoint
    folder: it is committed into the job's storage atomically before the master is told,
    so `get_checkpoint()` after any crash returns the latest complete one."""
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics: expected a dict, got {metrics!r}")
    step = metrics.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
    name: str | None = None
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    if checkpoint is not None and storage:
        from trainguard.storage import checkpoints

        name = checkpoints.commit(Path(checkpoint), storage, step=step, metrics=dict(metrics))
    channel.post("/v1/report", {"step": step, "metrics": dict(metrics), "checkpoint": name})


def get_checkpoint() -> str | None:
    """The folder of the newest complete checkpoint of this job, or None: the newest step
    that every rank holds in memory (`snapshot`), unless a durable checkpoint (a reported
    one, or a copy of snapshots) is of a later step."""
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    durable: Path | None = None
    if storage:
        from trainguard.storage import checkpoints

        durable = checkpoints.latest(storage)
    memory = _memory_snapshot()
    if memory is not None and (durable is None or memory[0] >= _durable_step(durable)):
        return str(memory[1])
    return str(durable) if durable else None


def _durable_step(folder: Path) -> int:
    from trainguard.storage import checkpoints

    step = (checkpoints.read_manifest(folder) or {}).get("step")
    return step if isinstance(step, int) else -1


def _memory_snapshot() -> tuple[int, Path] | None:
    root = os.environ.get(ENV_SNAPSHOT_DIR)
    if not root:
        return None
    from trainguard.storage import snapshots

    step = snapshots.newest_complete(Path(root), _world())
    return None if step is None else (step, snapshots.step_dir(Path(root), step))


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def _rank() -> int:
    return _int_env("RANK", 0)


def _world() -> int:
    return max(1, _int_env("WORLD_SIZE", 1))


def snapshot(state: object, step: int) -> None:
    """Keep `state` (anything pickle can write: model and optimizer state_dicts, the data
    loader's position, RNG states) for `step`, in the job's shared memory.

    Call it on every rank after each step: a copy into memory, no disk. After a restart,
    `load_snapshot()` gives back the newest step that every rank stored (a rank killed
    mid-step costs that step only). The master copies every N-th step to the checkpoint
    storage in the background (`checkpoint.snapshot_persist_every`), which is what is left
    if the master itself is killed. Outside trainguard it does nothing."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: expected an integer >= 0, got {step!r}")
    root = os.environ.get(ENV_SNAPSHOT_DIR)
    if not root:
        channel.warn_outside()
        return
    from trainguard.storage import snapshot_state, snapshots

    form, skeleton, parts = snapshot_state.parts(state)
    due = snapshots.due(step, _int_env(ENV_SNAPSHOT_PERSIST_EVERY, 0))
    writer = _snapshot_writer(Path(root))
    writer.write(_world(), _int_env(ENV_ATTEMPT, 0), step, parts, form, skeleton, not due)
    if due:
        # Only the steps the master copies: a message each step would cost a step's few %.
        writer.wait()  # the master reads the files it is told of
        channel.post("/v1/snapshot", {"step": step, "world": _world()})


_writer: Writer | None = None  # this process's, made at its first snapshot


def _snapshot_writer(root: Path) -> Writer:
    global _writer
    from trainguard.storage import snapshots

    with channel.lock():
        if _writer is None or (_writer.root, _writer.rank) != (root, _rank()):
            if _writer is not None:
                _writer.close()
            _writer = snapshots.Writer(root, _rank())
        return _writer


def load_snapshot(folder: str | None = None) -> tuple[int, object] | None:
    """(step, state) of this rank from `folder` (default: `get_checkpoint()`), verified;
    None where there is none (a first run, or a checkpoint that holds no snapshots).

    The state is unpickled: load only what this job stored (as with `torch.load`)."""
    where = folder if folder is not None else get_checkpoint()
    if where is None:
        return None
    from trainguard.storage import snapshot_state, snapshots

    found = snapshots.load(Path(where), _rank())
    if found is None:
        return None
    header, payload = found
    return header.step, snapshot_state.state_of(header.format, header.skeleton, payload)


def mark_checkpoint_bad(path: str) -> None:
    """This checkpoint could not be loaded: `get_checkpoint()` will offer the one before."""
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    if storage:
        from trainguard.storage import checkpoints

        checkpoints.mark_bad(storage, Path(path).name)


def after_fork_in_child() -> None:
    global _writer
    _writer = None  # the parent's files: its to write


def reset_for_tests() -> None:
    global _writer
    if _writer is not None:
        _writer.close()
    _writer = None
