"""Built-in fault injection: `--inject SPEC`, parsed strictly and fired for real."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TG, child
from fakes import FakeClock

from trainguard.master.inject import FaultInjector
from trainguard.records.store import Store
from trainguard.spec.injection import Injection, parse_injection


@pytest.mark.parametrize(
    ("text", "description"),
    [
        ("signal:worker-1:SIGKILL@20s", "send SIGKILL to worker-1 20 s into attempt 0"),
        ("signal:worker-0:segv@step=50", "send SIGSEGV to worker-0 at step 50 of attempt 0"),
        ("stop:worker-2@1.5s,attempt=1", "SIGSTOP worker-2 1.5 s into attempt 1"),
        ("master@30s", "SIGKILL the master 30 s into attempt 0"),
        ("exit:worker-1:3@step=7", "make worker-1 exit with status 3 at step 7 of attempt 0"),
    ],
)
def test_parse(text: str, description: str) -> None:
    assert parse_injection(text).describe() == description


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kill:worker-1@1s", "must look like"),
        ("signal:worker-1@1s", "signal needs a signal"),
        ("stop@1s", "stop needs a replica"),
        ("master:worker-0@1s", "master takes no replica"),
        ("signal:worker-1:NOPE@1s", "unknown signal"),
        ("signal:worker-1:KILL", "must look like"),
        ("exit:worker-1@1s", "exit needs a replica and a status"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_injection(text)


def _injector(
    *texts: str, between: set[str] | None = None
) -> tuple[FaultInjector, list[str], FakeClock]:
    """An injector on the fake clock; what it fires, by its text. The replicas in `between`
    are between two runs: a fault for them does not land."""
    clock = FakeClock()
    fired: list[str] = []
    down = between if between is not None else set()

    def fire(inj: Injection) -> bool:
        if inj.replica in down:
            return False
        fired.append(inj.text)
        return True

    return FaultInjector([parse_injection(t) for t in texts], fire, clock), fired, clock


def test_a_timed_injection_fires_once_at_its_time_into_its_attempt() -> None:
    inj, fired, clock = _injector("signal:worker-1:SIGKILL@20s", "stop:worker-0@1.5s,attempt=1")
    clock.advance(60)
    assert fired == []  # nothing counts before an attempt is running
    inj.arm(0)
    clock.advance(19.9)
    assert fired == []
    clock.advance(0.1)
    assert fired == ["signal:worker-1:SIGKILL@20s"]
    inj.arm(1)  # the next attempt: its own injection, counted from its start
    clock.advance(1.4)
    assert fired == ["signal:worker-1:SIGKILL@20s"]
    clock.advance(0.1)
    assert fired == ["signal:worker-1:SIGKILL@20s", "stop:worker-0@1.5s,attempt=1"]
    inj.arm(0)  # attempt 0 again (a resumed numbering never does this): fired already
    clock.advance(100)
    assert len(fired) == 2 and clock.pending() == []


def test_a_disarmed_injection_waits_for_its_attempt_to_run_again() -> None:
    inj, fired, clock = _injector("master@30s")
    inj.arm(0)
    clock.advance(29)
    inj.disarm()  # the attempt is being restarted: its clock stops
    clock.advance(10)
    assert fired == [] and clock.pending() == []
    inj.arm(0)
    clock.advance(29.9)
    assert fired == []  # counted from the running attempt's start, not the first's
    clock.advance(0.1)
    assert fired == ["master@30s"]


def test_a_step_injection_fires_at_its_step_in_its_attempt_only() -> None:
    inj, fired, _ = _injector("exit:worker-1:3@step=7", "signal:worker-0:segv@step=5,attempt=1")
    inj.on_step("worker-1", 9)
    assert fired == []  # no attempt running yet
    inj.arm(0)
    inj.on_step("worker-0", 8)
    inj.on_step("worker-1", 6)
    assert fired == []  # another replica's step, then worker-1 short of 7
    inj.on_step("worker-1", 7)
    inj.on_step(None, 50)  # the job's step (from the output): attempt 1's is not due yet
    assert fired == ["exit:worker-1:3@step=7"]
    inj.arm(1)
    inj.on_step(None, 5)
    assert fired == ["exit:worker-1:3@step=7", "signal:worker-0:segv@step=5,attempt=1"]


def test_a_fault_due_while_its_replica_restarts_lands_when_it_runs_again() -> None:
    down = {"worker-1"}
    inj, fired, clock = _injector(
        "signal:worker-1:SIGKILL@5s", "exit:worker-1:3@step=9", between=down
    )
    inj.arm(0)
    clock.advance(5)
    inj.on_step(None, 9)
    inj.on_started("worker-0")
    assert fired == []  # worker-1 is being restarted: both wait, for worker-1 only
    down.clear()
    inj.on_started("worker-1")
    assert fired == ["signal:worker-1:SIGKILL@5s", "exit:worker-1:3@step=9"]
    inj.on_started("worker-1")
    assert len(fired) == 2  # each lands once


def test_a_waiting_fault_of_an_attempt_that_ended_never_lands() -> None:
    down = {"worker-1"}
    inj, fired, clock = _injector("signal:worker-1:SIGKILL@5s", between=down)
    inj.arm(0)
    clock.advance(5)
    inj.arm(1)  # the whole job restarted: attempt 0's faults are moot
    down.clear()
    inj.on_started("worker-1")
    assert fired == []


@pytest.mark.slow
def test_a_bad_inject_flag_is_one_line_and_exit_2(tg: TG) -> None:
    res = tg("run", "--inject", "kill:x@1s", "--", "true")
    assert res.returncode == 2
    assert res.stderr.startswith("trainguard: fault_injection: must look like")
    assert "(from --inject)" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_an_injection_into_a_replica_the_job_lacks_is_refused(tg: TG) -> None:
    res = tg("run", "--inject", "signal:worker-1:KILL@1s", "--", "true")
    assert res.returncode == 2
    assert "names worker-1, which this job does not have (it has worker-0)" in res.stderr


def _run(tg: TG, *args: str, actions: tuple[str, ...]) -> int:
    res = tg("run", "--quiet", "--nproc", "2", *args, "--", *child(*actions))
    return res.returncode


@pytest.mark.slow
def test_an_injected_kill_is_recovered_and_recorded_as_an_injection(tg: TG) -> None:
    rc = _run(tg, "--inject", "signal:worker-1:SIGKILL@1s", actions=("*@0:forever",))
    assert rc == 0
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    (rec,) = tg.json("records", job["id"])
    assert (rec["replica"], rec["error_source"], rec["error_code"]) == (
        "worker-1",
        "injection",
        "137",
    )
    (ev,) = Store(tg.home).events_of(job["id"])
    assert (ev.kind, ev.text) == ("injection", "send SIGKILL to worker-1 1 s into attempt 0")


@pytest.mark.slow
def test_an_injected_segfault_at_a_reported_step(tg: TG) -> None:
    rc = _run(tg, "--inject", "signal:worker-0:SEGV@step=3", actions=("*@0:beats:50",))
    assert rc == 0
    (rec,) = tg.json("records", tg.only_job()["id"])
    assert (rec["replica"], rec["failure_class"]) == ("worker-0", "transient_exit")


@pytest.mark.slow
def test_an_injected_sigstop_is_a_hang_and_the_stopped_rank_is_named(tg: TG) -> None:
    rc = _run(
        tg,
        "--inject",
        "stop:worker-1@0.5s",
        "--job-hang-interval",
        "2",
        actions=("*:print:up {rank}", "*@0:forever"),
    )
    assert rc == 0
    job = tg.only_job()
    (f,) = tg.json("explain", job["id"])["failures"]
    assert (f["failure_class"], f["replica"]) == ("hang", "worker-1")


@pytest.mark.slow
def test_an_injected_master_kill_then_resume(tg: TG) -> None:
    rc = _run(tg, "--inject", "master@1s", actions=("*@0:forever",))
    assert rc == -9
    assert tg.only_job()["state"] == "INTERRUPTED"
    res = tg("resume", "child", "--quiet")
    assert res.returncode == 0, res.stderr
    assert tg.only_job()["state"] == "SUCCEEDED"


@pytest.mark.slow
def test_an_injected_exit_code_at_a_step_is_classified_like_any_exit(
    tg: TG, tmp_path: Path
) -> None:
    script = str(ROOT / "tests" / "bins" / "sdk_train.py")
    res = tg(
        "run",
        "--quiet",
        "--nproc",
        "2",
        "--inject",
        "exit:worker-1:3@step=4",
        "--fault-tolerant-policy",
        "OnFailure",  # exit 3 with no evidence is not retryable by default
        "--",
        sys.executable,
        script,
        "10",
        str(tmp_path / "r.json"),
    )
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    (rec,) = tg.json("records", job["id"])
    assert (rec["replica"], rec["error_code"], rec["error_source"]) == (
        "worker-1",
        "3",
        "injection",
    )
    assert json.loads((tmp_path / "r.json").read_text())["total"] == sum(range(1, 11))
