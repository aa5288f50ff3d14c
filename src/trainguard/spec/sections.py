"""The job spec's smaller sections: where checkpoints go and how a job waits in a queue."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainguard.spec.base import SpecModel
from trainguard.spec.limits import MAX_LIMIT, MAX_SECONDS


class CheckpointPolicy(SpecModel):
    """Where `sdk.report(..., checkpoint=dir)` commits, and what retention keeps."""

    storage: str | None = None  # a folder or an fsspec URL; default: <job folder>/checkpoints
    # A new job that starts from a given checkpoint folder: it is committed as the first
    # checkpoint of this job, so get_checkpoint() offers it (`--from-checkpoint PATH`).
    initial: str | None = None
    # Retention after each new checkpoint: the newest this many are kept (with `keep_best`'s),
    # the others deleted.
    keep_last: int = Field(default=3, ge=1, le=MAX_LIMIT)
    # Also keep this many checkpoints with the best `score_attribute` (0: none; it needs
    # `score_attribute`).
    keep_best: int = Field(default=0, ge=0, le=MAX_LIMIT)
    # The metric, reported with a checkpoint, that `keep_best` ranks by; a checkpoint without
    # a number for it is never among the best.
    score_attribute: str | None = None
    # Which `score_attribute` is best: `max`, the highest (an accuracy); `min`, the lowest.
    score_order: Literal["max", "min"] = "max"
    # sdk.snapshot(state, step) keeps state in memory; every N-th step that all ranks hold
    # is also copied here, in the background, as a checkpoint (0: never).
    snapshot_persist_every: int = Field(default=20, ge=0, le=MAX_LIMIT)


class QueuePolicy(SpecModel):
    """How a job waits for the server's quota (R-REC-3)."""

    priority: int = Field(default=0, ge=-1000, le=1000)  # higher runs first; FIFO within
    max_wait_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS
    )  # then EXPIRED; None: wait forever
    # A request larger than the whole quota, or a capacity failure at start, waits for
    # capacity instead of failing the job (Vertex's flex-start idea).
    wait_for_capacity: bool = False
    # While waiting for capacity, the master tries a new attempt this often.
    capacity_retry_s: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _short_name(cls, data: Any) -> Any:
        # `max_wait` (the spelling) is `max_wait_s`: seconds either way.
        if isinstance(data, dict) and "max_wait" in data and "max_wait_s" not in data:
            data = {k if k != "max_wait" else "max_wait_s": v for k, v in data.items()}
        return data
