"""What the master does with reported progress and checkpoints (R-CKPT-1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainguard.errors import CallRefused
from trainguard.records.recorder import Recorder
from trainguard.spec.models import CheckpointPolicy
from trainguard.storage.checkpoints import (
    Storage,
    apply_retention,
    commit,
    commit_ms,
    entries,
    is_url,
    manifest_of,
    write_marker,
)


class CheckpointKeeper:
    def __init__(
        self,
        policy: CheckpointPolicy,
        job_dir: Path,
        rec: Recorder,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        where = policy.storage
        self.storage: Storage = (
            where
            if where and is_url(where)
            else Path(where).resolve()
            if where
            else job_dir / "checkpoints"
        )
        self.rec = rec
        self.clock = clock
        self.attempt = -1
        self._best_step = -1  # the highest step reported in this attempt
        self._metrics: dict[str, object] = {}  # the latest value of each metric reported

    def new_attempt(self, attempt: int) -> None:
        self.attempt, self._best_step = attempt, -1

    def mark(self, token: str) -> bool:
        """Write the storage marker each host of the job checks before it starts a replica
        (`checkpoints.marker_problem`); False (and an event) when the master cannot."""
        try:
            write_marker(self.storage, token)
        except Exception as exc:  # a full disk, no permission, an object store refusing
            why = f"{type(exc).__name__}: {exc}"
            self.rec.event(self.clock(), None, "checkpoint", f"cannot mark {self.storage}: {why}")
            return False
        return True

    def seed(self) -> None:
        """`--from-checkpoint`: the given folder becomes a new job's first checkpoint."""
        if self.policy.initial and not entries(self.storage):
            made = commit(Path(self.policy.initial), self.storage)
            self.rec.event(self.clock(), None, "checkpoint", f"{made} from {self.policy.initial}")

    def on_progress(
        self, replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        """sdk.report: the job's progress; a new checkpoint triggers retention."""
        manifest = manifest_of(self.storage, checkpoint) if checkpoint is not None else None
        if checkpoint is not None and manifest is None:
            raise CallRefused(
                f"checkpoint: {checkpoint} is not a committed checkpoint of this job's storage"
            )
        now = self.clock()
        # the latest of each: a snapshot's copy ({snapshot: true}) keeps the loss in view
        self._metrics.update(metrics)
        self.rec.progress(now, step, dict(self._metrics))
        cost = commit_ms(manifest) if manifest is not None else None
        if step is not None and (step > self._best_step or checkpoint):
            self._best_step = max(self._best_step, step)
            self.rec.step(self.attempt, step, now, checkpoint, cost)
        if checkpoint is None:
            return
        gone = apply_retention(
            self.storage,
            keep_last=self.policy.keep_last,
            keep_best=self.policy.keep_best,
            score_attribute=self.policy.score_attribute,
            score_order=self.policy.score_order,
        )
        deleted = f"; retention deleted {', '.join(gone)}" if gone else ""
        self.rec.event(now, replica, "checkpoint", f"{checkpoint} at step {step}{deleted}")
