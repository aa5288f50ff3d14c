"""End to end with real processes: tiny child programs under the real CLI and backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TG, alive, child, read_pid, wait_for

from trainguard.records.store import Store


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
        "Termination reason: KeyError: 'boom'."
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
        f"Termination reason: {reason}."
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
        ((), 1, "FAILED"),  # ExitCodeAndErrorMsg: exit 3 is no retryable evidence
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


def test_a_replica_that_ignores_sigterm_is_killed_after_the_grace_period(tg: TG) -> None:
    rc, _ = run(
        tg,
        "--stop-grace-period",
        "1",
        actions=("1:trap-term", "1:print:trapped", "0:sleep:0.5", "1:forever"),
    )
    assert rc == 0
    job = tg.only_job()
    r1 = next(r for r in job["replicas"] if r["name"] == "worker-1")
    assert (r1["state"], r1["signal"], r1["exit_code"]) == ("STOPPED", "SIGKILL", 137)
    assert r1["ended_at_s"] - job["replicas"][0]["ended_at_s"] >= 0.9  # the grace was given
    log = Path(r1["log_path"]).read_text()
    assert "ignoring SIGTERM" in log


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


def _start_forever(tg: TG, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        *extra,
        "--",
        *child(
            f"*:pidfile:{pids}",
            "*:print:ready {rank} {attempt}",
            f"*:spawn-child:{pids}",
            "*:forever",
        ),
    )
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}.child")), what=f"rank {r} to start")  # type: ignore[misc]
    return proc, pids


def _pids(pids: Path) -> list[int]:
    out = []
    for r in (0, 1):
        for suffix in ("", ".child"):
            pid = read_pid(Path(f"{pids}.{r}{suffix}"))
            assert pid is not None
            out.append(pid)
    return out


def test_external_kill_restarts_the_job_with_a_fresh_port(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path, "--max-restarts", "1")
    first = _pids(pids)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    port0 = tg.json("status", job_id)["replicas"]
    killed_at = time.time()
    os.kill(first[2], signal.SIGKILL)  # rank 1, from outside trainguard
    wait_for(lambda: tg.json("status", job_id)["attempts"] == 2, what="attempt 2")
    wait_for(lambda: read_pid(Path(f"{pids}.1")) != first[2], what="new rank 1")
    wait_for(lambda: not any(alive(p) for p in first), timeout=15, what="old processes gone")
    records = tg.json("records", job_id)
    assert len(records) == 1 and records[0]["failure_class"] == "preemption"
    assert records[0]["error_source"] == "exit_code"
    # the exit was seen within well under a second of the kill (event driven, no polling)
    store = Store(tg.home)
    runs = store.runs_of(job_id, attempt=0)
    killed = next(r for r in runs if r.replica == "worker-1")
    assert killed.ended_at_s is not None
    seen_ms = (killed.ended_at_s - killed_at) * 1000
    print(f"kill -> exit seen: {seen_ms:.1f} ms")
    assert seen_ms < 1000
    assert next(r for r in runs if r.replica == "worker-0").stop_requested
    ports = {a.master_port for a in store.attempts_of(job_id)}
    assert len(ports) == 2  # a fresh MASTER_PORT for the new attempt
    assert port0
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130


def test_ctrl_c_cancels_cleanly(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    wait_for(lambda: tg.json("status", job_id)["state"] == "RUNNING", what="RUNNING")
    # from another terminal while it runs: status and logs say something useful
    status = tg.json("status", job_id)
    assert [r["state"] for r in status["replicas"]] == ["RUNNING", "RUNNING"]
    assert "ready 1 0" in wait_for(
        lambda: tg("logs", job_id, "--replica", "worker-1").stdout, what="log output"
    )
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    job = tg.json("status", job_id)
    assert job["state"] == "CANCELLED" and job["restarts"] == 0
    states = [t.to_state for t in Store(tg.home).transitions_of(job_id)]
    assert states[-2:] == ["CANCELLING", "CANCELLED"]
    assert not any(alive(p) for p in _pids(pids))


def test_cancel_command_from_another_terminal(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    res = tg("cancel", job_id)
    assert res.returncode == 0 and "CANCELLED" in res.stdout
    assert proc.wait(timeout=30) == 130
    assert not any(alive(p) for p in _pids(pids))


def test_master_sigkill_leaves_no_orphan_and_marks_the_job_interrupted(
    tg: TG, tmp_path: Path
) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    everyone = _pids(pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(p) for p in everyone), timeout=10, what="replicas to die")
    job = tg.only_job()
    assert job["state"] == "INTERRUPTED"
    assert "interrupted" in job["error_message"]
    assert all(r["ended_at_s"] is not None for r in job["replicas"])


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
    error); the model of real logs reads it as permanent, and `explain` says why."""
    rc, _ = run(tg, actions=(f"1:print:{NCCL_TIMEOUT}", "1:exit:1", "*:sleep:0.2"))
    assert rc == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 1)
    (root,) = [f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"]]
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
    from trainguard.records.store import Store

    runs = Store(tg.home).runs_of(job["id"], attempt=0)
    per_replica = {name: sum(r.replica == name for r in runs) for name in ("worker-0", "worker-2")}
    assert per_replica == {"worker-0": 1, "worker-2": 6}
    assert "The replica worker-2 exited with a non-zero status of 1" in job["error_message"]
    groups = tg.json("records", job["id"], "--aggregate")
    assert groups[0]["count"] == 12 and groups[0]["replicas"] == ["worker-2"]


def test_a_second_ctrl_c_stops_without_waiting_for_the_grace(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc",
        "2",
        "--stop-grace-period",
        "60",
        "--",
        *child("*:trap-term", f"*:pidfile:{pids}", "*:forever"),
    )
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}")), what=f"rank {r}")  # type: ignore[misc]
    job_id = tg.json("jobs")[0]["id"]
    wait_for(lambda: tg.json("status", job_id)["state"] == "RUNNING", what="RUNNING")
    os.kill(proc.pid, signal.SIGINT)
    wait_for(lambda: tg.json("status", job_id)["state"] == "CANCELLING", what="CANCELLING")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 30  # not the 60 s grace
    assert tg.json("status", job_id)["state"] == "CANCELLED"
