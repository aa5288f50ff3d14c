"""Fault-tolerance policy (R-POL-1..3, R-POL-5): pure decisions, as values (`actions`).

`decide_failure(ft, budgets, failure, world_size)` and `decide_clean_exit(...)` touch
no process, file or clock. The master applies what they return and then records the
failure with `budgets.after(failure, decision)`; tests drive them by tables.

The rules, in order, for a failure:
1. not retryable (by the policy or the evidence) -> FailJob;
2. more than `max_tolerated_failure_rate` of the replicas have failed -> FailJob;
   the history rule: the same fingerprint at the same progress point (the same step,
   or start-up both times) as in an earlier attempt -> FailJob, whatever the class;
   except a sure outage (`backoff.is_sure_outage`: a remote service, storage, network or
   rendezvous error read with confidence) recurring in start-up while its backoff lasts
   (this retry in a row within `backoff.ladder(ft)`, the retries the wait takes to reach
   `transient_backoff_max_s`): a service that is down fails every start the same way, so
   there the recurrence proves nothing until the backoff is spent. The same step during
   training ends the job as for any class;
3. the same error (fingerprint) on this replica more than `max_num_of_same_error`
   times -> FailJob;
4. a per-class budget (transient exits 3, capacity 3, internal 2) spent -> FailJob
   (capacity with queue.wait_for_capacity -> WaitForCapacity); a retryable failure
   whose evidence is uncertain also charges `max_uncertain_restarts` (1), and with
   `retry_uncertain` so does an uncertain one that reads as permanent (else rule 1);
5. async mode and a replica of a group (torchft): restart its group alone while
   `max_group_restarts` last and another group is up to heal from, else the whole job;
   a role that restarts alone (the framework's `RolePolicy`; `worker`
   by default): restart it alone while its `max_replica_restarts` last, then the whole
   job (or, as the framework says, fail the job or give the replica up);
6. the whole job: while `enable_job_restart` and `max_num_of_job_restart` allow.
An outage's restart (any of 5, 6) waits its backoff first (`delay_s`, in its reason).
Every FailJob names its proof (`stop_proof`): the rule that read it as permanent, the
recurrence, or the limit spent; the job's error message ends with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainguard.classify.classes import Classification, FailureClass
from trainguard.policy.actions import (
    Decision,
    FailJob,
    GiveUpReplica,
    Ignore,
    RestartGroup,
    RestartJob,
    RestartReplica,
    Succeed,
    WaitForCapacity,
)
from trainguard.policy.backoff import backoff_for, rides_out, waiting
from trainguard.policy.budgets import Budgets, Charge, Failure, Limit, Occurrence
from trainguard.policy.stop_proof import rule_proof, with_proof
from trainguard.spec.limits import UNLIMITED, limit_allows
from trainguard.spec.models import (
    ExecutionMode,
    FaultTolerance,
    FaultTolerantPolicy,
    SuccessPolicy,
)
from trainguard.spec.text import counted
from trainguard.states import ErrorCode

# ---------------------------------------------------------------- rules

# Failure classes with a budget of their own (Vertex: transient and capacity 3, internal 2).
_CLASS_BUDGET: dict[FailureClass, str] = {
    FailureClass.TRANSIENT_EXIT: "max_transient_restarts",
    FailureClass.CAPACITY: "max_capacity_restarts",
    FailureClass.INTERNAL: "max_internal_restarts",
    FailureClass.NODE_LOST: "max_node_lost_restarts",
}


@dataclass(frozen=True)
class RolePolicy:
    """How a framework treats its roles' failures (R-POL-1); the preset supplies it.

    `alone`: roles restarted alone in async mode (None: every role); any other role
    restarts the whole job. `optional`: roles whose failure never ends or restarts the
    job (TensorFlow's evaluator): restarted alone within their budget, then given up.
    `on_spent`: what happens when a replica restarted alone has spent its own restarts.
    """

    alone: frozenset[str] | None = frozenset({"worker"})
    optional: frozenset[str] = frozenset()
    on_spent: Literal["restart_job", "fail_job", "give_up"] = "restart_job"
    # Failure domains (torchft's replica groups): a failed member restarts its whole
    # group, within `max_group_restarts` per group and attempt, `group_rejoin_s` after
    # the failure; when no other group is up there is no peer to heal from: the job restarts.
    groups: tuple[tuple[str, ...], ...] = ()
    max_group_restarts: Limit = 10
    group_rejoin_s: float = 0.0

    def group_of(self, replica: str) -> int | None:
        for i, members in enumerate(self.groups):
            if replica in members:
                return i
        return None

    def restarts_alone(self, role: str, mode: ExecutionMode) -> bool:
        if role in self.optional:
            return True
        return mode is ExecutionMode.ASYNC and (self.alone is None or role in self.alone)


def error_code(c: Classification) -> str:
    if c.failure_class is FailureClass.INTERNAL:
        return ErrorCode.INTERNAL
    if c.failure_class is FailureClass.NODE_LOST:
        return ErrorCode.NODE_LOST
    if c.failure_class in (FailureClass.HANG, FailureClass.EXIT_HANG):
        return ErrorCode(c.failure_class.value.upper())
    if c.exit_code is None:
        return ErrorCode.SPAWN_ERROR
    return str(c.exit_code)


def _fail(failure: Failure, why: str, proof: str) -> FailJob:
    c = failure.classification
    return FailJob(error_code(c), with_proof(c.message, proof), why, proof)


def _is_retryable(ft: FaultTolerance, c: Classification) -> tuple[bool, str, str]:
    """Whether to retry, why, and (for a stop) its proof."""
    if ft.fault_tolerant_policy is FaultTolerantPolicy.NEVER:
        return False, "fault_tolerant_policy is Never", "fault_tolerant_policy is Never"
    if c.failure_class is FailureClass.USER_ERROR and c.exit_code is None:
        why = "the command cannot be started; a retry cannot help"
        return False, why, f"the command cannot be started ({c.reason})"
    if ft.fault_tolerant_policy is FaultTolerantPolicy.ON_FAILURE:
        return True, "fault_tolerant_policy is OnFailure", ""
    if c.retryable:
        return True, f"{c.failure_class} is retryable (rule {c.rule})", ""
    if ft.retry_uncertain and c.uncertain:
        return (
            True,
            (
                f"{c.failure_class} reads as not retryable (rule {c.rule}), but the evidence is "
                f"uncertain (confidence {c.confidence:.2f}) and retry_uncertain gives it a retry"
            ),
            "",
        )
    proof = rule_proof(c) + ("; retry_uncertain is off" if c.uncertain else "")
    return False, f"{c.failure_class} is not retryable (rule {c.rule})", proof


STARTUP_WINDOW_S = 300.0
"""A replica that fails this soon after it started, with no step printed or reported,
failed in start-up: the same error there in two attempts is not a passing fault."""

# Faults from outside: without a step to compare, two of them say nothing about the job.
_EXTERNAL: frozenset[FailureClass] = frozenset(
    {FailureClass.PREEMPTION, FailureClass.NODE_LOST, FailureClass.CAPACITY}
)


def _in_startup(o: Occurrence) -> bool:
    return o.uptime_s is not None and o.uptime_s < STARTUP_WINDOW_S


def repeated_at_same_point(b: Budgets, failure: Failure) -> str | None:
    """The history rule: the same fingerprint at the same progress point as before.

    Deterministic whatever its class: the same step in two attempts (or two runs of a
    replica restarted alone), or, with no step known either time, both times in start-up
    (within STARTUP_WINDOW_S of starting; not for faults from outside). Returns why.
    """
    c = failure.classification
    prev = b.seen.get(c.fingerprint or "")
    now = failure.occurrence()
    if prev is None or (prev.attempt, prev.restart) == (now.attempt, now.restart):
        return None
    if prev.progress is not None and now.progress is not None:
        if prev.progress != now.progress:
            return None
        where = f"at step {now.progress}"
    elif prev.progress is None and now.progress is None:
        if c.failure_class in _EXTERNAL or not (_in_startup(prev) and _in_startup(now)):
            return None
        where = "in start-up, before any training step"
    else:
        return None
    if prev.restart == 0 and now.restart == 0:
        runs = f"attempts {prev.attempt} and {now.attempt}"
    else:
        runs = f"{prev.where()} and {now.where()}"
    return f"the same error {where} in {runs}: not transient"


def _job_restart(
    ft: FaultTolerance, b: Budgets, failure: Failure, why: str, extra: tuple[Charge, ...]
) -> Decision:
    if not ft.enable_job_restart:
        return _fail(
            failure, f"{why}; but enable_job_restart is False", "enable_job_restart is False"
        )
    limit = ft.max_num_of_job_restart
    if not limit_allows(limit, b.job_restarts):
        spent = f"({b.job_restarts}/{limit})"
        return _fail(
            failure,
            f"{why}; but the job restart budget is spent {spent}",
            f"max_num_of_job_restart is spent {spent}",
        )
    charge = Charge("job_restarts", b.job_restarts + 1, limit)
    return RestartJob(why, (*extra, charge))


def decide_failure(
    ft: FaultTolerance,
    b: Budgets,
    failure: Failure,
    world_size: int = 1,
    wait_for_capacity: bool = False,
    roles: RolePolicy = RolePolicy(),
    groups_up: int = 0,
) -> Decision:
    """What to do about one replica's failure (the root cause, not its cascade).

    `groups_up`: the other replica groups (`roles.groups`) still up when it failed.

    With `wait_for_capacity`, a capacity failure whose budget is spent waits for capacity
    (Vertex's flex-start) instead of failing the job. A replica of an optional role, or
    a shard of a job that allows a partial result, is given up instead of ending the job.
    """
    c = failure.classification
    retry, why, proof = _is_retryable(ft, c)
    if not retry:
        return _end_replica(roles, ft, failure, why, proof)
    backoff = backoff_for(ft, b, failure)
    repeat = repeated_at_same_point(b, failure) if ft.enable_repeat_detection else None
    if repeat is not None and rides_out(backoff, failure):
        why = f"{why}; the same outage again in start-up, ridden out until its backoff is spent"
    elif repeat is not None:
        proof = repeat.removesuffix(": not transient")
        return _end_replica(roles, ft, failure, f"{why}; but {repeat}", proof)
    d = _retry(ft, b, failure, why, world_size, wait_for_capacity, roles, groups_up)
    return d if backoff is None else waiting(d, backoff)


def _retry(
    ft: FaultTolerance,
    b: Budgets,
    failure: Failure,
    why: str,
    world_size: int,
    wait_for_capacity: bool,
    roles: RolePolicy,
    groups_up: int,
) -> Decision:
    """A retryable failure: how, within which budgets (rules 2 to 6)."""
    c = failure.classification

    if wait_for_capacity and c.failure_class is FailureClass.CAPACITY:
        limit_c = ft.max_capacity_restarts
        used_c = b.class_restarts.get("max_capacity_restarts", 0)
        if not limit_allows(limit_c, used_c):
            # Waiting charges nothing, so neither the same-error nor the rate rule applies.
            return WaitForCapacity(
                f"{why}; max_capacity_restarts is spent ({used_c}/{limit_c}), "
                "so the job waits for capacity"
            )

    rate = ft.max_tolerated_failure_rate
    failed = len(b.failed_replicas) + (failure.replica not in b.failed_replicas)
    if rate is not None and failed / max(1, world_size) > rate:
        too_many = f"{failed} of {world_size} replicas have failed"
        return _fail(
            failure,
            f"{why}; but {too_many}, more than max_tolerated_failure_rate {rate:g}",
            f"{too_many} (max_tolerated_failure_rate {rate:g})",
        )

    same = b.same_error.get(failure.same_error_key, 0) + 1
    if ft.max_num_of_same_error != UNLIMITED and same > ft.max_num_of_same_error:
        proof = (
            f"{failure.replica} hit the same error {same} times "
            f"(max_num_of_same_error {ft.max_num_of_same_error})"
        )
        return _end_replica(roles, ft, failure, f"{why}; but {proof}", proof)
    extra: tuple[Charge, ...] = (
        Charge(f"same_error:{failure.same_error_key}", same, ft.max_num_of_same_error),
    )

    budget_field = _CLASS_BUDGET.get(c.failure_class) if c.failure_class else None
    if budget_field is not None:
        limit: Limit = getattr(ft, budget_field)
        used = b.class_restarts.get(budget_field, 0)
        if not limit_allows(limit, used):
            spent = f"{budget_field} is spent ({used}/{limit})"
            return _end_replica(roles, ft, failure, f"{why}; but {spent}", spent)
        extra = (*extra, Charge(budget_field, used + 1, limit))

    # Past _is_retryable, an uncertain failure is retried under this budget, whichever
    # way the evidence leaned (a permanent-looking one only with retry_uncertain).
    if c.uncertain and ft.fault_tolerant_policy is not FaultTolerantPolicy.ON_FAILURE:
        used = b.class_restarts.get("max_uncertain_restarts", 0)
        if not limit_allows(ft.max_uncertain_restarts, used):
            spent = f"max_uncertain_restarts is spent ({used}/{ft.max_uncertain_restarts})"
            why = (
                f"{why}; but the evidence is uncertain (confidence {c.confidence:.2f}) and {spent}"
            )
            return _end_replica(roles, ft, failure, why, f"{spent}, {rule_proof(c)}")
        extra = (*extra, Charge("max_uncertain_restarts", used + 1, ft.max_uncertain_restarts))

    group = roles.group_of(failure.replica)
    if group is not None and ft.execution_mode is ExecutionMode.ASYNC:
        return _group_restart(ft, b, roles, failure, group, groups_up, why, extra)
    if roles.restarts_alone(failure.role, ft.execution_mode):
        key = f"replica_restarts:{failure.replica}"
        used = b.replica_restarts.get(failure.replica, 0)
        if limit_allows(ft.max_replica_restarts, used):
            charge = Charge(key, used + 1, ft.max_replica_restarts)
            return RestartReplica(failure.replica, why, (*extra, charge))
        spent = f"{failure.replica} spent its {ft.max_replica_restarts} restarts"
        why = f"{why}; {spent}"
        if failure.role in roles.optional or roles.on_spent != "restart_job":
            return _end_replica(roles, ft, failure, why, spent)
        why = f"{why}, so the job restarts"
    return _job_restart(ft, b, failure, why, extra)


def _group_restart(
    ft: FaultTolerance,
    b: Budgets,
    roles: RolePolicy,
    failure: Failure,
    group: int,
    groups_up: int,
    why: str,
    extra: tuple[Charge, ...],
) -> Decision:
    if not groups_up:
        why = f"{why}; no other group is up to heal from, so the job restarts from its checkpoint"
        return _job_restart(ft, b, failure, why, extra)
    key, limit = group_key(group), roles.max_group_restarts
    used = b.replica_restarts.get(key, 0)
    if not limit_allows(limit, used):
        why = f"{why}; group {group} spent its {limit} restarts, so the job restarts"
        return _job_restart(ft, b, failure, why, extra)
    members = roles.groups[group]
    others = sum(len(g) for i, g in enumerate(roles.groups) if i != group)
    why = (
        f"{why}; group {group} restarts alone ({_processes(len(members))}), "
        f"{_processes(others)} of the other groups keep training"
    )
    charge = Charge(f"group_restarts:{key}", used + 1, limit)
    return RestartGroup(group, members, roles.group_rejoin_s, why, (*extra, charge))


def group_key(group: int) -> str:
    """A group's name in the budgets (its restarts are counted like a replica's)."""
    return f"group-{group}"


def _end_replica(
    roles: RolePolicy, ft: FaultTolerance, failure: Failure, why: str, proof: str
) -> Decision:
    """A replica that may not be retried: given up where its role allows, else the job
    fails, naming `proof`."""
    if failure.role in roles.optional:
        return GiveUpReplica(failure.replica, f"{why}; {failure.role} is optional")
    if roles.on_spent == "give_up" and roles.restarts_alone(failure.role, ft.execution_mode):
        return GiveUpReplica(failure.replica, f"{why}; a partial result is allowed")
    return _fail(failure, why, proof)


def decide_clean_exit(
    policy: SuccessPolicy, replica: str, primary: str, all_succeeded: bool
) -> Decision:
    """A replica exited 0: is the job done (R-JOB-4)?"""
    if policy is SuccessPolicy.CHIEF:
        if replica == primary:
            return Succeed(f"the primary replica {replica} exited 0")
        return Ignore(f"{replica} exited 0; waiting for the primary replica {primary}")
    if all_succeeded:
        return Succeed("every replica exited 0")
    return Ignore(f"{replica} exited 0; waiting for the other replicas")


def root_cause(failures: list[Failure]) -> tuple[Failure, list[Failure]]:
    """The earliest failure that is not a typical cascade (else the earliest), and the rest.

    When one replica dies, its peers often fail next with connection resets or
    collective errors; those are its cascade, and the decision is taken on the root.
    """
    ordered = sorted(failures, key=lambda f: f.time_s)
    roots = [f for f in ordered if not f.classification.cascade] or ordered
    root = roots[0]
    return root, [f for f in ordered if f is not root]


def _processes(n: int) -> str:
    return counted(n, "process", "processes")
