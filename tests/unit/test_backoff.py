"""Transient outages ridden out with backoff (issue 38): pure decisions, by tables.

A failure read as a remote service, storage, network or rendezvous outage is retried
after 1, 2, 4 ... s (capped), within the restart budgets; the history rule leaves a sure
outage that recurs in start-up alone until the backoff is spent. Every stop names its
proof (`FailJob.proof`, at the end of the job's error message and in `describe`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from policy_cases import OUTAGE_LINES, TRACEBACK, _failure, _ft, _outage

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_by_rules, classify_exit
from trainguard.errors import SpecError
from trainguard.policy.actions import (
    Decision,
    FailJob,
    RestartGroup,
    RestartJob,
    RestartReplica,
    describe,
)
from trainguard.policy.backoff import is_sure_outage, ladder, outage_kind
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import RolePolicy, decide_failure
from trainguard.spec.models import FaultTolerance, validate_spec


def _run(ft: FaultTolerance, failures: list[Failure], **kw: Any) -> list[Decision]:
    """Each failure decided on the budgets the ones before it left, as the master does."""
    b, out = Budgets(), []
    for f in failures:
        d = decide_failure(ft, b, f, **kw)
        out.append(d)
        b = b.after(f, d)
    return out


def _delays(ds: list[Decision]) -> list[float | str]:
    return [d.delay_s if isinstance(d, RestartJob) else type(d).__name__ for d in ds]


# ---------------------------------------------------------------- which failures are outages


@pytest.mark.parametrize(
    ("line", "progressed", "kind", "sure"),
    [
        (OUTAGE_LINES["remote service"], None, "remote service", True),
        (
            "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable",
            None,
            "remote service",
            True,
        ),
        (
            "botocore.exceptions.ClientError: An error occurred (SlowDown)",
            True,
            "remote service",
            True,
        ),
        (OUTAGE_LINES["storage"], None, "storage", True),
        ("OSError: [Errno 5] Input/output error", True, "storage", True),
        (OUTAGE_LINES["network"], True, "network", True),
        # before any step the catalogue reads a network error as maybe a set-up error
        (OUTAGE_LINES["network"], None, "network", False),
        (OUTAGE_LINES["rendezvous"], True, "rendezvous", True),
        (OUTAGE_LINES["rendezvous"], None, "rendezvous", False),
        # not outages: a peer's death, a slow rank, a device, a bug, a refusal
        ("RuntimeError: Connection reset by peer", True, None, False),
        ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)", True, None, False),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", True, None, False),
        ("KeyError: 'x'", True, None, False),
        ("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url", None, None, False),
    ],
)
def test_which_failures_are_outages(
    line: str, progressed: bool | None, kind: str | None, sure: bool
) -> None:
    c = classify_exit(ExitEvidence("w", 1, log_tail=(line,), progressed=progressed))
    assert (outage_kind(c), is_sure_outage(c)) == (kind, sure), c.rule


# ---------------------------------------------------------------- the ladder


@pytest.mark.parametrize(
    ("spec", "steps"),
    [
        ({}, 7),
        ({"transient_backoff_s": 2, "transient_backoff_max_s": 8}, 3),
        ({"transient_backoff_s": 5, "transient_backoff_max_s": 5}, 1),
        ({"transient_backoff_s": 0}, 0),
    ],
)
def test_the_ladder_is_the_retries_it_takes_to_reach_the_cap(
    spec: dict[str, Any], steps: int
) -> None:
    assert ladder(_ft(**spec)) == steps


def test_a_service_down_at_every_start_waits_1_2_4_then_the_budget_ends_it() -> None:
    ds = _run(_ft(), [_outage(a) for a in range(4)])
    assert _delays(ds) == [1.0, 2.0, 4.0, "FailJob"]
    assert "a remote service outage: retried in 4 s (backoff 3 of 7)" in ds[2].reason
    assert "the same outage again in start-up, ridden out" in ds[1].reason
    stop = ds[3]
    assert isinstance(stop, FailJob) and stop.proof == "max_num_of_job_restart is spent (3/3)"
    assert stop.message.endswith(
        "Service Unavailable. (proof: max_num_of_job_restart is spent (3/3))"
    )


def test_the_history_rule_takes_a_start_up_outage_once_the_backoff_is_spent() -> None:
    ft = _ft(max_num_of_job_restart="unlimited", max_num_of_same_error="unlimited")
    ds = _run(ft, [_outage(a) for a in range(8)])
    assert _delays(ds) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, "FailJob"]
    stop = ds[7]
    assert isinstance(stop, FailJob)
    assert "in start-up, before any training step in attempts 6 and 7" in stop.reason
    assert stop.proof == "the same error in start-up, before any training step in attempts 6 and 7"


def test_without_backoff_the_history_rule_ends_it_at_the_second_start() -> None:
    """What a 503 at start-up did before issue 38: two attempts, and the job failed."""
    ds = _run(_ft(transient_backoff_s=0), [_outage(0), _outage(1)])
    assert isinstance(ds[0], RestartJob) and ds[0].delay_s == 0
    assert isinstance(ds[1], FailJob) and "in start-up" in ds[1].proof


def test_the_same_step_during_training_still_ends_the_job() -> None:
    ds = _run(_ft(), [_outage(0, 5, progressed=True), _outage(1, 5, progressed=True)])
    assert isinstance(ds[0], RestartJob) and ds[0].delay_s == 1.0
    stop = ds[1]
    assert isinstance(stop, FailJob)
    assert stop.proof == "the same error at step 5 in attempts 0 and 1"


def test_an_unsure_outage_waits_but_is_not_spared_by_the_history_rule() -> None:
    tail = (OUTAGE_LINES["rendezvous"],)
    ds = _run(_ft(), [_outage(0, tail=tail), _outage(1, tail=tail)])
    assert isinstance(ds[0], RestartJob) and ds[0].delay_s == 1.0
    assert "max_uncertain_restarts 1/1 (0 left)" in describe(ds[0])
    assert isinstance(ds[1], FailJob) and "not transient" in ds[1].reason


def test_another_failure_between_outages_starts_the_ladder_again() -> None:
    kill = replace(_failure("preemption"), attempt=2, time_s=300.0)
    ds = _run(_ft(max_num_of_job_restart=5), [_outage(0), _outage(1), kill, _outage(3)])
    assert _delays(ds) == [1.0, 2.0, 0.0, 1.0]


def test_an_outage_after_training_on_starts_the_ladder_again() -> None:
    ds = _run(
        _ft(),
        [_outage(0, 10, progressed=True), _outage(1, None), _outage(2, 90, progressed=True)],
    )
    assert _delays(ds) == [1.0, 2.0, 1.0]


def test_the_cap_holds_and_past_it_a_start_up_recurrence_is_the_history_rules() -> None:
    ft = _ft(transient_backoff_s=3, transient_backoff_max_s=10, max_num_of_job_restart=9)
    late = [_outage(a, uptime_s=3600.0) for a in range(5)]  # past start-up: no history rule
    ds = _run(ft, late)
    assert _delays(ds) == [3.0, 6.0, 10.0, 10.0, 10.0]
    assert "(backoff 3 of 3)" in ds[2].reason
    assert "retried in 10 s (backoff 4, at its cap)" in ds[3].reason
    early = _run(ft, [_outage(a) for a in range(4)])
    assert _delays(early) == [3.0, 6.0, 10.0, "FailJob"]


def test_a_replica_restarted_alone_waits_too() -> None:
    ds = _run(_ft(execution_mode="async"), [_outage(0), _outage(0, restart=1)])
    assert [type(d) for d in ds] == [RestartReplica, RestartReplica]
    assert [d.delay_s for d in ds if isinstance(d, RestartReplica)] == [1.0, 2.0]


def test_a_group_rejoins_after_its_backoff_or_its_rejoin_wait_whichever_is_longer() -> None:
    roles = RolePolicy(groups=(("worker-0",), ("worker-1",)), group_rejoin_s=1.5)
    ft = _ft(execution_mode="async")
    ds = _run(
        ft, [_outage(0), _outage(0, restart=1), _outage(0, restart=2)], roles=roles, groups_up=1
    )
    assert [d.after_s for d in ds if isinstance(d, RestartGroup)] == [1.5, 2.0, 4.0]
    assert [d.backoff_step for d in ds if isinstance(d, RestartGroup)] == [1, 2, 3]


def test_a_bug_is_never_delayed() -> None:
    (d,) = _run(_ft(fault_tolerant_policy="OnFailure"), [_failure("user")])
    assert isinstance(d, RestartJob) and (d.delay_s, d.backoff_step) == (0.0, 0)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"transient_backoff_s": -1}, "transient_backoff_s"),
        ({"transient_backoff_max_s": 0}, "transient_backoff_max_s"),
        (
            {"transient_backoff_s": 10, "transient_backoff_max_s": 5},
            "transient_backoff_max_s: must be at least transient_backoff_s (10), got 5",
        ),
        ({"transient_backoff_s": "soon"}, "transient_backoff_s"),
    ],
)
def test_bad_backoff_values_are_refused_with_one_line(values: dict[str, Any], problem: str) -> None:
    data = {"name": "t", "worker_pools": [{"command": ["x"]}], "fault_tolerance": values}
    with pytest.raises(SpecError) as err:
        validate_spec(data)
    assert problem in str(err.value) and "\n" not in str(err.value).strip()


# ---------------------------------------------------------------- every stop names its proof

DISK_FULL = ("OSError: [Errno 28] No space left on device: '/ckpt/step-9.pt'",)
FORBIDDEN = ("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: https://hub/x",)
IMPORT = ("ModuleNotFoundError: No module named 'apex'",)
OWN = ("Traceback (most recent call last):", '  File "t.py", line 1', "MyError: no")


def _stop(tail: tuple[str, ...] = (), rc: int = 1, **extra: Any) -> Failure:
    """A failure as the rules read it (the learned model's second opinion aside)."""
    ev = ExitEvidence("worker-1", rc, log_tail=tail, **extra)
    return replace(_failure("user"), classification=classify_by_rules(ev))


@pytest.mark.parametrize(
    ("failure", "ft", "budgets", "proof"),
    [
        (
            _stop(TRACEBACK),
            {},
            Budgets(),
            "rule python-bug, a Python exception in the job's own code",
        ),
        (
            _stop(OWN),
            {},
            Budgets(),
            "rule python-traceback, an uncaught exception in the job's code",
        ),
        (
            _stop(IMPORT),
            {},
            Budgets(),
            "rule python-import, a module is missing or broken in the environment",
        ),
        (
            _stop(DISK_FULL),
            {},
            Budgets(),
            "rule disk-full, the disk or quota is full; a restart fills it again",
        ),
        (
            _stop(FORBIDDEN),
            {},
            Budgets(),
            "rule remote-permanent, the remote service refused the request "
            "(no access, no such repo or key, offline)",
        ),
        (
            _stop(rc=-9, oom_kills=1),
            {},
            Budgets(),
            "rule host-oom-cgroup, the kernel's OOM killer in the replica's cgroup: "
            "it needs more memory",
        ),
        (
            _failure("spawn"),
            {},
            Budgets(),
            "the command cannot be started (command not found: 'nope')",
        ),
        (
            _failure("user_plain"),
            {"retry_uncertain": False},
            Budgets(),
            "rule nonzero-exit (uncertain: confidence 0.50); retry_uncertain is off",
        ),
        (
            _failure("user_plain"),
            {"retry_uncertain": True},
            Budgets(class_restarts={"max_uncertain_restarts": 1}),
            "max_uncertain_restarts is spent (1/1), rule nonzero-exit (uncertain: confidence 0.50)",
        ),
        (
            _failure("preemption"),
            {"fault_tolerant_policy": "Never"},
            Budgets(),
            "fault_tolerant_policy is Never",
        ),
        (
            _failure("preemption"),
            {},
            Budgets(job_restarts=3),
            "max_num_of_job_restart is spent (3/3)",
        ),
        (
            _failure("preemption"),
            {"enable_job_restart": False},
            Budgets(),
            "enable_job_restart is False",
        ),
        (
            _failure("transient"),
            {},
            Budgets(class_restarts={"max_transient_restarts": 3}),
            "max_transient_restarts is spent (3/3)",
        ),
        (
            _failure("preemption"),
            {"max_num_of_same_error": 1},
            Budgets().after(_failure("preemption"), RestartJob("r", ())),
            "worker-1 hit the same error 2 times (max_num_of_same_error 1)",
        ),
        (
            _failure("preemption"),
            {"max_tolerated_failure_rate": 0.1},
            Budgets(),
            "1 of 4 replicas have failed (max_tolerated_failure_rate 0.1)",
        ),
    ],
)
def test_every_stop_names_its_proof(
    failure: Failure, ft: dict[str, Any], budgets: Budgets, proof: str
) -> None:
    d = decide_failure(_ft(**ft), budgets, failure, world_size=4)
    assert isinstance(d, FailJob), d
    assert d.proof == proof
    assert d.message == f"{failure.classification.message} (proof: {proof})"
    assert describe(d).endswith(f" [proof: {proof}]")


@pytest.mark.parametrize("retry_uncertain", [False, True])
@pytest.mark.parametrize(
    "kind",
    [
        "user",
        "user_plain",
        "spawn",
        "transient",
        "abort",
        "bare_crash",
        "preemption",
        "sigterm",
        "oom",
        "sigbus",
    ],
)
@pytest.mark.parametrize("used", [0, 3])
def test_no_stop_without_a_proof(kind: str, retry_uncertain: bool, used: int) -> None:
    b = Budgets(
        job_restarts=used,
        class_restarts={"max_transient_restarts": used, "max_uncertain_restarts": used // 3},
    )
    d = decide_failure(_ft(retry_uncertain=retry_uncertain), b, _failure(kind))
    if isinstance(d, FailJob):
        assert d.proof and d.message.endswith(f"(proof: {d.proof})")
