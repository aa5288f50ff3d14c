"""The master's side of in-memory snapshots (issue 16): it owns the job's shared-memory
folder, and copies every N-th step that every rank holds into durable checkpoint storage,
in a thread, so that a killed master still leaves a recent checkpoint on disk."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.master.keeper import CheckpointKeeper
from trainguard.storage import snapshots
from trainguard.storage.checkpoints import commit

SNAPSHOT_METRIC = "snapshot"
"""The metric a durable copy of snapshots carries (True), to tell it from a reported one."""


class SnapshotKeeper:
    def __init__(
        self,
        job_id: str,
        job_dir: Path,
        keeper: CheckpointKeeper,
        every: int,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = snapshots.make_root(job_id, job_dir)
        self.keeper = keeper
        self.every = every
        self.say = say
        self.clock = clock
        self._holders: dict[int, set[str]] = {}  # step -> replicas that hold it
        self._task: asyncio.Task[None] | None = None
        self.persisted: list[tuple[int, str]] = []  # (step, checkpoint) copied to storage

    def on_snapshot(self, replica: str, step: int, world: int) -> None:
        """A replica stored `step` (the SDK says so for due steps only): once all `world`
        ranks have, copy it unless a copy is under way (a slow copy skips steps rather than
        queue them)."""
        holders = self._holders.setdefault(step, set())
        holders.add(replica)
        for old in [s for s in self._holders if s < step - snapshots.KEEP]:
            del self._holders[old]
        busy = self._task is not None and not self._task.done()
        if len(holders) >= world and snapshots.due(step, self.every) and not busy:
            self._task = asyncio.get_running_loop().create_task(self._persist(step, world))

    async def _persist(self, step: int, world: int) -> None:
        stage = self.root / f".persist-{step}"
        try:
            name = await asyncio.to_thread(self._copy, step, world, stage)
        except OSError as exc:  # a full disk, a gone storage: the job goes on in memory
            self.say(f"snapshot of step {step} not copied to checkpoint storage: {exc}")
            return
        if name is not None:
            self.persisted.append((step, name))
            self.keeper.on_progress("master", step, {SNAPSHOT_METRIC: True}, name)

    def _copy(self, step: int, world: int, stage: Path) -> str | None:
        try:
            if snapshots.persist(self.root, step, world, stage) is None:
                return None  # the ranks moved on and dropped it meanwhile
            metrics = {SNAPSHOT_METRIC: True}
            return commit(stage, self.keeper.storage, step=step, metrics=metrics)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    async def close(self) -> None:
        """Let a copy under way finish, then free the memory the snapshots hold."""
        if self._task is not None:
            await asyncio.wait([self._task])
        shutil.rmtree(self.root, ignore_errors=True)
