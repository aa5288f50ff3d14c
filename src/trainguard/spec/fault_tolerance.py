"""The spec's `fault_tolerance` section: what is retried, how often, and the hang
detectors, each with the meaning and default of its AIMaster counterpart (trainguard's
defaults differ where a comment says why)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from trainguard.spec.base import SpecModel
from trainguard.spec.fields import spelled
from trainguard.spec.limits import MAX_SECONDS, MIN_WATCH_S, Limit, pattern_problems
from trainguard.spec.node_probation import NodeProbation


def case_insensitive(enum: type[StrEnum]) -> Any:
    """A validator that takes an enum's value in any case (`Sync`, `sync`, `SYNC`)."""

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            for member in enum:
                if member.value.lower() == value.strip().lower():
                    return member
        return value

    return BeforeValidator(convert)


class ExecutionMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class FaultTolerantPolicy(StrEnum):
    ON_FAILURE = "OnFailure"
    EXIT_CODE_AND_ERROR_MSG = "ExitCodeAndErrorMsg"
    NEVER = "Never"


class FaultTolerance(SpecModel):
    # sync: a failure restarts every replica, and the hang detectors watch; async: a failed
    # worker (or torchft group) restarts alone, the others go on.
    execution_mode: Annotated[ExecutionMode, case_insensitive(ExecutionMode)] = ExecutionMode.SYNC
    # Which failures are retried: ExitCodeAndErrorMsg, those the exit status and log read as
    # retryable; OnFailure, any whose command started; Never, none.
    fault_tolerant_policy: Annotated[FaultTolerantPolicy, case_insensitive(FaultTolerantPolicy)] = (
        FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    )
    # AIMaster defaults this to False; trainguard restarts by default (the issue asks it).
    enable_job_restart: bool = True
    # Restarts of the whole job (a new attempt of every replica); once spent, a failure that
    # needs one fails the job.
    max_num_of_job_restart: Limit = 3
    # Restarts of one replica alone (async mode, or an optional role) per attempt; then the
    # whole job restarts (or fails, or gives it up, as the framework says).
    max_replica_restarts: Limit = 5
    # Failures of one replica with the same error (fingerprint), in all attempts; one more
    # than this fails the job (or gives an optional replica up).
    max_num_of_same_error: Limit = 10
    # Once more than this fraction of the replicas has failed (in all attempts), a retryable
    # failure fails the job instead; null (or -1): no such limit.
    max_tolerated_failure_rate: float | None = Field(default=None, gt=0, le=1)
    # Retries of transient exits (a bare SIGSEGV or SIGABRT, a crash at exit, a port race),
    # in all attempts; once spent, the next one fails the job.
    max_transient_restarts: Limit = 3
    # Retries of capacity failures (no free GPU, no machines in the cloud), in all attempts;
    # once spent, the job fails, or waits with `queue.wait_for_capacity`.
    max_capacity_restarts: Limit = 3
    # Retries of trainguard's own faults (a replica it could not start, a dead preload
    # process), in all attempts; once spent, the next one fails the job.
    max_internal_restarts: Limit = 2
    max_node_lost_restarts: Limit = 3  # a node under the job died or was cut off (Ray, Slurm)
    # A retryable failure whose evidence is uncertain (a bare signal, a guess) is
    # retried this many times in all.
    max_uncertain_restarts: Limit = 1
    # A failure the evidence reads as permanent, but uncertainly (no known sign, a bare
    # exit status, the learned model's guess), gets one retry too, charged to the same
    # budget: the history rule ends it at its second occurrence at the same point. On by
    # default (issue 38): a job ends at once only on proof; an unsettled failure costs one
    # attempt, while a retryable failure wrongly ended costs a person's night.
    retry_uncertain: bool = True
    # The same error at the same progress point (step, or start-up) in two attempts ends
    # the job whatever its class: it is deterministic, not transient.
    enable_repeat_detection: bool = True
    # A failure read as an outage of a remote service, storage, the network or the
    # rendezvous is retried after 1, 2, 4 ... s (doubling per retry in a row), at most
    # `transient_backoff_max_s`, within the restart budgets (0: retried at once).
    transient_backoff_s: float = Field(default=1.0, ge=0, le=3600)
    # The longest wait before an outage's retry: the doubling from `transient_backoff_s`
    # stops here.
    transient_backoff_max_s: float = Field(default=60.0, gt=0, le=3600)
    # When the master stops a replica (a restart, a cancel, the job's end), the time from
    # SIGTERM to SIGKILL, so it can exit cleanly (0: killed at once).
    stop_grace_period_s: float = Field(default=10.0, ge=0, le=3600)
    # The job's own retryable errors: regexes (or plain keywords) searched in the log
    # tail of a failed replica, before the built-in catalogue.
    retryable_errors: list[str] = Field(default_factory=list)
    # AIMaster defaults both detectors to off; at these intervals they cost nothing, so
    # trainguard turns them on (the whole job's watch in sync jobs, as AIMaster; each replica
    # group's in an async torchft job).
    enable_job_hang_detection: bool = True
    # No output or SDK heartbeat from any replica for this long is a hang: stacks are taken,
    # then it is a failure (training code may change it: `hang_detect`).
    job_hang_interval_s: float = Field(
        default=1800,
        ge=MIN_WATCH_S,
        le=MAX_SECONDS,
        validation_alias=spelled("fault_tolerance.job_hang_interval_s"),
    )
    # Until every replica has shown a sign of life (a line of output, an SDK call), this
    # allowance applies instead of the hang interval (never shorter than it): imports
    # and data loading are not a hang.
    startup_timeout_s: float = Field(default=600, ge=MIN_WATCH_S, le=MAX_SECONDS)
    # Sync jobs: when one replica exits 0 and the job waits for the rest, they must end
    # within `job_exit_hang_interval_s`, or it is an exit hang (a failure).
    enable_job_exit_hang_detection: bool = True
    # How long the other replicas may run on after one has exited 0 before it is an exit
    # hang.
    job_exit_hang_interval_s: float = Field(
        default=600,
        ge=MIN_WATCH_S,
        le=MAX_SECONDS,
        validation_alias=spelled("fault_tolerance.job_exit_hang_interval_s"),
    )
    # When a node with machine-blamed failures of several jobs is avoided (R-EVID-4).
    node_probation: NodeProbation = Field(default_factory=NodeProbation)

    @model_validator(mode="after")
    def _bounded_patterns(self) -> FaultTolerance:
        problems = pattern_problems(self.retryable_errors, "retryable_errors")
        if problems:
            raise ValueError(problems[0])  # each names its item: the first says enough
        if self.transient_backoff_max_s < self.transient_backoff_s:
            raise ValueError(
                f"transient_backoff_max_s: must be at least transient_backoff_s "
                f"({self.transient_backoff_s:g}), got {self.transient_backoff_max_s:g}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _rate_off(cls, data: Any) -> Any:
        # AIMaster spells "off" as -1.
        if isinstance(data, dict) and data.get("max_tolerated_failure_rate") in (-1, "-1"):
            data = {**data, "max_tolerated_failure_rate": None}
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_c4d(cls, data: Any) -> Any:
        """AIMaster's `enable_c4d_hang_detection` turns on C4D, Alibaba Cloud's detector of
        slow or hung collective communication, which runs inside that cloud (ACCL on its
        Lingjun nodes). trainguard has no C4D: false (AIMaster's default) asks for nothing
        and is accepted; true is refused rather than accepted and silently not done."""
        if not isinstance(data, dict) or _C4D not in data:
            return data
        if data[_C4D] is False or str(data[_C4D]).strip().lower() in ("false", "0", "no", "off"):
            return {k: v for k, v in data.items() if k != _C4D}
        raise ValueError(
            f"{_C4D}: C4D is Alibaba Cloud's in-cloud detector of hung or slow collective "
            "communication, and trainguard has none; remove it (enable_job_hang_detection "
            "and job_hang_interval_s watch for hangs here)"
        )


_C4D = "enable_c4d_hang_detection"
