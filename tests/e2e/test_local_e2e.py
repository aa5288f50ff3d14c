"""End to end with real processes: tiny child programs under the real CLI and backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TG, child

from trainguard.records.store import Store

pytestmark = pytest.mark.slow  # every test here runs real jobs


def run(tg: TG, *args: str, n: int = 2, actions: tuple[str, ...] = ()) -> tuple[int, str]:
    res = tg("run", "--quiet", "--nproc-per-node", str(n), *args, "--", *child(*actions))
    # a replica's traceback may be quoted in the log tail, indented; trainguard's own never
    assert not any(line.startswith("Traceback") for line in res.stderr.splitlines())
    return res.returncode, res.stderr


def test_success_exits_0_and_records_one_attempt(tg: TG) -> None:
    rc, err = run(tg, actions=("*:print:hello {rank}",))
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 1, 0)
    assert job["error_message"] is None


def test_user_error_fails_on_the_first_attempt_with_the_log_tail(tg: TG) -> None:
    rc, err = run(tg, actions=("1:raise:KeyError", "*:sleep:5"))
    assert rc == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 1)
    assert job["error_message"] == (
        "The replica worker-1 exited with a non-zero status of 1. "
        "Termination reason: KeyError: 'boom'. "
        "(proof: rule python-bug, a Python exception in the job's own code)"
    )
    assert "last lines of worker-1's log" in err and "KeyError: 'boom'" in err
    # rank 0 was stopped by the master, which charges nothing and is not a failure
    r0 = next(r for r in job["replicas"] if r["name"] == "worker-0")
    assert r0["state"] == "STOPPED"


@pytest.mark.parametrize(
    ("action", "code", "reason"),
    [
        ("1:signal:SEGV", 139, "SIGSEGV"),
        ("1:exit:139", 139, "SIGSEGV"),
        ("1:signal:ABRT", 134, "SIGABRT"),
        ("1:exit:134", 134, "SIGABRT"),
    ],
)
def test_transient_signals_retry_3_times_then_fail(
    tg: TG, action: str, code: int, reason: str
) -> None:
    """Each attempt crashes at a later step: transient, so the class budget decides."""
    rc, _ = run(tg, actions=("*:print:step {attempt}0 loss 0.5", action, "*:sleep:5"))
    assert rc == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("FAILED", 4, 3)
    assert job["error_message"] == (
        f"The replica worker-1 exited with a non-zero status of {code}. "
        f"Termination reason: {reason}. (proof: max_transient_restarts is spent (3/3))"
    )
    records = tg.json("records", job["id"])
    assert [r["failure_class"] for r in records] == ["transient_exit"] * 3
    assert "job_restarts 3/3" in records[-1]["decision"]


@pytest.mark.parametrize(
    ("actions", "where"),
    [
        (("*:print:step 5 loss 0.5", "1:signal:SEGV"), "at step 5"),
        (("1:signal:SEGV",), "in start-up, before any training step"),
    ],
)
def test_the_same_crash_at_the_same_point_stops_after_the_second_attempt(
    tg: TG, actions: tuple[str, ...], where: str
) -> None:
    """The history rule: the same fingerprint at the same progress point is deterministic."""
    rc, _ = run(tg, actions=(*actions, "*:sleep:5"))
    assert rc == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("FAILED", 2, 1)
    explained = tg.json("explain", job["id"])["failures"]
    last = [f for f in explained if f["root_cause"]][-1]
    assert f"the same error {where} in attempts 0 and 1: not transient" in last["decision"]


def test_transient_failure_once_then_success(tg: TG) -> None:
    rc, err = run(tg, actions=("1@0:signal:SEGV", "*:sleep:0.2"))
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1)


@pytest.mark.parametrize(
    ("flags", "attempts", "state"),
    [
        (("--fault-tolerant-policy", "OnFailure"), 2, "SUCCEEDED"),  # exit 3 retried
        (("--fault-tolerant-policy", "Never"), 1, "FAILED"),
        # ExitCodeAndErrorMsg: exit 3 is no proof, so it gets one retry (issue 38) ...
        ((), 2, "SUCCEEDED"),
        # ... and with the old behaviour it ends the job: no retryable evidence
        (("--retry-uncertain", "false"), 1, "FAILED"),
    ],
)
def test_fault_tolerant_policy(tg: TG, flags: tuple[str, ...], attempts: int, state: str) -> None:
    run(tg, *flags, actions=("1@0:exit:3", "*:sleep:0.2"))
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == (state, attempts)


def test_restarts_off_and_budget_flags(tg: TG) -> None:
    run(tg, "--ft-args", "--enable-job-restart=False", actions=("1:signal:SEGV", "*:sleep:5"))
    assert tg.only_job()["attempts"] == 1


def test_max_restarts_sets_the_job_budget(tg: TG) -> None:
    run(tg, "--max-restarts", "1", actions=("1:signal:KILL", "*:sleep:5"))
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)
    assert "SIGKILL" in job["error_message"]


def test_missing_command_is_a_user_error_on_the_first_attempt(tg: TG) -> None:
    res = tg("run", "--quiet", "--", "no-such-program-xyz", "--flag")
    assert res.returncode == 1
    assert "command not found: 'no-such-program-xyz'" in res.stderr
    assert "Traceback" not in res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["error_code"]) == ("FAILED", 1, "SPAWN_ERROR")


def test_success_policy_all_waits_for_every_replica(tg: TG, tmp_path: Path) -> None:
    marker = tmp_path / "done"
    rc, _ = run(
        tg,
        "--success-policy",
        "all",
        actions=("1:sleep:1", f"1:pidfile:{marker}"),
    )
    assert rc == 0
    assert Path(f"{marker}.1").exists()  # rank 1 was not stopped when rank 0 finished
    assert tg.only_job()["state"] == "SUCCEEDED"


def test_chief_policy_stops_the_others_when_rank0_succeeds(tg: TG) -> None:
    rc, _ = run(tg, actions=("1:forever",))
    assert rc == 0
    job = tg.only_job()
    assert {r["name"]: r["state"] for r in job["replicas"]} == {
        "worker-0": "SUCCEEDED",
        "worker-1": "STOPPED",
    }


def test_environment_of_each_replica(tg: TG, tmp_path: Path) -> None:
    out = tmp_path / "env"
    script = (
        "import os,json,sys; keys=['RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE',"
        "'MASTER_ADDR','MASTER_PORT','TORCHELASTIC_RESTART_COUNT','TRAINGUARD_JOB_ID',"
        "'TRAINGUARD_REPLICA','TRAINGUARD_RESTART_COUNT'];"
        f"open('{out}.'+os.environ['RANK'],'w')"
        ".write(json.dumps({k: os.environ.get(k) for k in keys}))"
    )
    res = tg(
        "run", "--quiet", "--success-policy", "all", "--nproc", "3", "--", "python3", "-c", script
    )
    assert res.returncode == 0, res.stderr
    envs = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(3)]
    job_id = tg.only_job()["id"]
    for r, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TRAINGUARD_REPLICA"] == f"worker-{r}"
        assert env["TRAINGUARD_JOB_ID"] == job_id
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["TRAINGUARD_RESTART_COUNT"] == "0"
    assert len({e["MASTER_PORT"] for e in envs}) == 1


# ---------------------------------------------------------------- log-aware classification

NCCL_TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600046 milliseconds "
    "before timing out."
)


def test_an_nccl_style_timeout_with_exit_1_is_retried(tg: TG) -> None:
    """After training ran (a step line): a collective timeout, retried with confidence."""
    rc, err = run(
        tg,
        actions=(
            "*:print:step 40 loss 0.3",
            f"1@0:print:{NCCL_TIMEOUT}",
            "1@0:exit:1",
            "*:sleep:0.2",
        ),
    )
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    (f,) = tg.json("explain", job["id"])["failures"]
    assert (f["failure_class"], f["rule"], f["retryable"]) == (
        "retryable_message",
        "collective-timeout",
        True,
    )
    assert "Watchdog caught collective operation timeout" in f["matched_line"]
    assert f["confidence"] == 0.9 and f["phase"] == "training"


def test_an_nccl_timeout_before_any_step_is_judged_by_the_learned_model(tg: TG) -> None:
    """No sign of training before it: the rules are unsure (as often a bug or a set-up
    error); the model of real logs reads it as permanent, and `explain` says why. Uncertain,
    it gets one retry by default (issue 38); the history rule ends the second."""
    rc, _ = run(tg, actions=(f"1:print:{NCCL_TIMEOUT}", "1:exit:1", "*:sleep:0.2"))
    assert rc == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)
    root, again = [f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"]]
    assert "in start-up, before any training step" in again["decision"]
    assert root["rule"] == "learned-model(collective-timeout-untrained)"
    assert root["confidence"] < 0.6
    learned = [n for n in root["notes"].splitlines() if n.startswith("learned model")]
    assert learned and "nearest known cases https://github.com/" in learned[0]
    text = tg("explain", job["id"]).stdout
    assert "context      learned model: a retry helps with p=0." in text


@pytest.mark.parametrize("how", ["spec", "sdk"])
def test_the_jobs_own_keywords_make_an_error_retryable(tg: TG, how: str) -> None:
    flags = ("--retryable-error", "flaky thing \\d+") if how == "spec" else ()
    before = ("1@0:keyword:flaky thing \\d+",) if how == "sdk" else ()
    rc, err = run(
        tg, *flags, actions=(*before, "1@0:print:my flaky thing 42", "1@0:exit:1", "*:sleep:0.2")
    )
    assert rc == 0, err
    (f,) = tg.json("explain", tg.only_job()["id"])["failures"]
    rule = "spec-keyword-0" if how == "spec" else "runtime-keyword-0"
    assert (f["rule"], f["retryable"]) == (rule, True)


def test_async_worker_restarts_alone_5_times_then_the_job_is_retried(
    tg: TG, tmp_path: Path
) -> None:
    pids = tmp_path / "pid"
    res = tg(
        "run",
        "--quiet",
        "--nproc-per-node",
        "4",
        "--execution-mode",
        "async",
        "--max-restarts",
        "1",
        "--max-num-of-same-error",
        "100",
        "--enable-repeat-detection",
        "false",
        "--max-uncertain-restarts",
        "unlimited",
        "--",
        *child(
            f"*:pidfile:{pids}.a{{attempt}}",
            "2:print:NCCL WARN socketProgress: Connection closed by remote peer",
            "2:print:ncclSystemError: System call (e.g. socket, malloc) failed",
            "2:exit:1",
            "*:sleep:30",
        ),
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)
    decisions = [r["decision"].split(":")[0] for r in tg.json("records", job["id"])]
    replica_restart = "RestartReplica(worker-2)"
    assert decisions == [replica_restart] * 5 + ["RestartJob"] + [replica_restart] * 5
    # the other workers kept running through worker-2's restarts: one run each per attempt

    runs = Store(tg.home).runs_of(job["id"], attempt=0)
    per_replica = {name: sum(r.replica == name for r in runs) for name in ("worker-0", "worker-2")}
    assert per_replica == {"worker-0": 1, "worker-2": 6}
    assert "The replica worker-2 exited with a non-zero status of 1" in job["error_message"]
    groups = tg.json("records", job["id"], "--aggregate")
    assert groups[0]["count"] == 12 and groups[0]["replicas"] == ["worker-2"]


UNEXPLAINED = ("*:print:loading shards", "*:print:step 3 loss 0.5", "0:exit:3")


def test_an_unexplained_exit_ends_the_job_at_once_with_retry_uncertain_off(tg: TG) -> None:
    rc, err = run(tg, "--retry-uncertain", "false", n=1, actions=UNEXPLAINED)
    assert rc == 1, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 1)


@pytest.mark.parametrize("flag", [(), ("--retry-uncertain", "true")])
def test_an_unexplained_exit_is_retried_once_then_history_ends_it(
    tg: TG, flag: tuple[str, ...]
) -> None:
    """exit 3 after a step, with nothing the rules know: permanent, but only a guess; the
    default (issue 38) gives it one retry."""
    rc, err = run(tg, *flag, n=1, actions=UNEXPLAINED)
    assert rc == 1, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)
    first, second = (f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"])
    assert "retry_uncertain gives it a retry" in first["decision"]
    assert "the same error at step 3 in attempts 0 and 1: not transient" in second["decision"]


def test_retry_uncertain_lets_a_job_that_fails_once_unexplained_finish(tg: TG) -> None:
    actions = ("*:print:step 3 loss 0.5", "0@0:exit:3", "*:print:done")
    rc, err = run(tg, "--retry-uncertain", "true", n=1, actions=actions)
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
