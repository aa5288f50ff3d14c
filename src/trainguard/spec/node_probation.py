"""When a node goes on probation (R-EVID-4): the job spec's `fault_tolerance.node_probation`.

The ledger is shared by every job of a store, and each master judges a new fault with its
own job's settings: a node goes on probation when the failing job's rule says so. The
defaults (3 machine-blamed failures within 24 h, from at least 2 jobs) leave one job's bad
luck, or one job's bug misread as the machine's, on no node.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from trainguard.spec.base import SpecModel

MAX_NODE_FAULTS = 1000
"""More failures than this before a node is doubted is a typo, not a setting."""
MAX_WINDOW_S = 30 * 86400
"""A window longer than 30 days holds faults long since repaired."""


class NodeProbation(SpecModel):
    """K machine-blamed failures within a window, from at least `jobs` jobs."""

    # Machine-blamed failures (a lost node, a hardware fault, an OOM from outside the job)
    # that put a node on probation: every job avoids it until it is forgiven.
    faults: int = Field(default=3, ge=1, le=MAX_NODE_FAULTS)
    # How far back (seconds) those failures count; it decides when probation begins, not
    # how long it lasts (until forgiven).
    window_s: float = Field(default=86400.0, ge=1, le=MAX_WINDOW_S)
    # The fewest different jobs those failures must come from, so one job's own bug misread
    # as the machine's puts no node on probation.
    jobs: int = Field(default=2, ge=1, le=MAX_NODE_FAULTS)
    # Slurm: `scontrol update NodeName=N State=DRAIN Reason="trainguard: ..."` when a node
    # goes on probation (needs the right to); off, the node is only avoided by trainguard.
    drain: bool = False

    @model_validator(mode="after")
    def _jobs_within_faults(self) -> NodeProbation:
        """Each fault belongs to one job: more jobs than faults could never be met."""
        if self.jobs > self.faults:
            raise ValueError(
                f"jobs ({self.jobs}) cannot exceed faults ({self.faults}): each fault is one job's"
            )
        return self
