"""Hangs with real processes: staged detection, exit hangs, GPU isolation, SDK messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TG, child

from trainguard.records.store import Store

pytestmark = pytest.mark.slow  # real jobs


def run(tg: TG, *args: str, n: int = 2, actions: tuple[str, ...] = ()) -> tuple[int, str]:
    res = tg("run", "--quiet", "--nproc-per-node", str(n), *args, "--", *child(*actions))
    return res.returncode, res.stderr


def test_a_stall_inside_hang_detect_2_is_a_hang(tg: TG) -> None:
    # the job's own interval is 1800 s; the code says 2 s for this phase
    rc, err = run(tg, actions=("*@0:scoped-sleep:2:60", "*:sleep:0.2"))
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    (f,) = tg.json("explain", job["id"])["failures"]
    assert (f["failure_class"], f["rule"], f["retryable"]) == ("hang", "hang-detector", True)
    (snap,) = tg.json("stacks", job["id"])
    assert snap["attempt"] == 0 and snap["kind"] == "hang"
    assert {s["replica"] for s in snap["snapshots"]} == {"worker-0", "worker-1"}
    assert all(s["ok"] for s in snap["snapshots"]), snap["snapshots"]
    (rec,) = tg.json("records", job["id"])
    assert rec["error_source"] == "hang_detector" and rec["snapshot_id"] == 1
    # detected within the interval plus a couple of seconds of the stall's start
    stall_started = Store(tg.home).attempts_of(job["id"])[0].started_at_s
    assert f["at_s"] - stall_started < 2 + 3


def test_a_quiet_phase_inside_hang_detect_off_is_not_a_hang(tg: TG) -> None:
    rc, err = run(tg, "--job-hang-interval", "1", actions=("*:scoped-sleep:-1:3",))
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 1)


def test_silence_longer_than_the_job_interval_is_a_hang(tg: TG) -> None:
    rc, _ = run(
        tg,
        "--job-hang-interval",
        "1",
        "--max-restarts",
        "0",
        actions=("*:print:up {rank}", "*:sleep:30"),
    )
    assert rc == 1
    job = tg.only_job()
    assert job["state"] == "FAILED" and job["error_message"].startswith("The job hung")


def test_a_silent_start_longer_than_the_interval_is_not_a_hang(tg: TG) -> None:
    """No replica has shown a sign of life yet (imports, data loading): start-up rules."""
    rc, err = run(tg, "--job-hang-interval", "1", actions=("*:sleep:3", "*:print:up {rank}"))
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 1)
    assert tg.json("stacks", job["id"]) == []


def test_a_start_up_longer_than_its_allowance_is_a_start_up_hang(tg: TG) -> None:
    rc, _ = run(
        tg,
        "--job-hang-interval",
        "1",
        "--startup-timeout",
        "3",
        "--max-restarts",
        "0",
        actions=("*:sleep:60",),
    )
    assert rc == 1
    job = tg.only_job()
    assert job["state"] == "FAILED"
    assert "no replica showed a sign of life" in job["error_message"]
    assert "within 3 s of starting" in job["error_message"]
    (f,) = [f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"]]
    assert f["rule"] == "startup-hang-detector"
    (snap,) = tg.json("stacks", job["id"])
    assert snap["kind"] == "startup_hang"
    # detected at the allowance, not at the 1 s interval
    started = Store(tg.home).attempts_of(job["id"])[0].started_at_s
    assert f["at_s"] - started >= 3


def test_a_replica_still_importing_after_its_first_line_is_not_hung(tg: TG, tmp_path: Path) -> None:
    """Stacks inside the import machinery mean start-up: no culprit, no failure."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(4)\n")
    script = tmp_path / "main.py"
    script.write_text("print('up', flush=True)\nimport slowmod\nprint('imported', flush=True)\n")
    res = tg(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--job-hang-interval",
        "1",
        "--",
        sys.executable,
        str(script),
    )
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 1, 0)
    events = Store(tg.home).events_of(job["id"])
    cleared = [e for e in events if e.kind == "hang_cleared"]
    assert cleared and "still importing" in str(cleared[0].text), events


def test_an_exit_hang_is_detected_and_retried(tg: TG) -> None:
    rc, err = run(
        tg,
        "--success-policy",
        "all",
        "--job-exit-hang-interval",
        "2",
        actions=("*:print:up {rank}", "1@0:forever"),
    )
    assert rc == 0, err
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    (rec,) = tg.json("records", job["id"])
    assert (rec["failure_class"], rec["error_source"]) == ("exit_hang", "exit_hang_detector")
    assert (
        "worker-0 finished but the other replicas did not exit within 2 s" in (rec["error_message"])
    )


def _gpu_spec(tmp_path: Path, inventory: list[int]) -> Path:
    spec = tmp_path / "job.yaml"
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
    actions = [
        "*:env:CUDA_VISIBLE_DEVICES",
        "*:env:LOCAL_RANK",
        "*:env:TRAINGUARD_OWN_DEVICES",
        f"1@0:print:{xid}",
        "1@0:exit:1",
        "*:sleep:0.2",
    ]
    argv = ", ".join(f"'{a}'" for a in [*child(*actions)])
    spec.write_text(
        f"name: gpus\ngpu_inventory: {inventory}\nsuccess_policy: all\n"
        f"worker_pools:\n  - role: worker\n    replicas: 2\n    resources: {{gpus: 1}}\n"
        f"    command: [{argv}]\n"
    )
    return spec


def _own_gpu(log: str) -> str:
    """The GPU at LOCAL_RANK of CUDA_VISIBLE_DEVICES, as a replica printed them."""
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    return env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])]


def test_a_hardware_fault_isolates_the_gpu(tg: TG, tmp_path: Path) -> None:
    res = tg("run", "--quiet", "-f", str(_gpu_spec(tmp_path, [0, 1, 2])))
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert job["attempts"] == 2
    logs = {
        (a, r): Path(job["log_dir"], f"attempt-{a}", f"worker-{r}.log").read_text()
        for a in (0, 1)
        for r in (0, 1)
    }
    # Each rank sees the attempt's GPUs as torchrun shows a node's, so `cuda:LOCAL_RANK`
    # is its own (what torch.cuda.set_device(LOCAL_RANK) picks), GPU 1 gone after it.
    own = {key: _own_gpu(log) for key, log in logs.items()}
    assert own == {(0, 0): "0", (0, 1): "1", (1, 0): "0", (1, 1): "2"}  # GPU 1 was taken out
    assert "CUDA_VISIBLE_DEVICES=0,2" in logs[(1, 0)]
    assert "TRAINGUARD_OWN_DEVICES=None" in logs[(1, 1)]  # the master's note stays its own
    (rec,) = tg.json("records", job["id"])
    assert rec["isolated"] == "GPU 1 isolated: hardware fault on worker-1 (gpu-xid)"


def test_no_healthy_gpu_left_fails_with_a_clear_message(tg: TG, tmp_path: Path) -> None:
    res = tg("run", "--quiet", "-f", str(_gpu_spec(tmp_path, [0, 1])))
    assert res.returncode == 1
    job = tg.only_job()
    assert job["error_code"] == "CAPACITY"
    assert job["error_message"] == (
        "Not enough GPUs for the next attempt: the replicas need 2 GPU(s) but 1 of 2 are "
        "usable; isolated: [1]. Isolated: GPU 1: hardware fault on worker-1 (gpu-xid)."
    )


def test_custom_messages_are_recorded(tg: TG) -> None:
    rc, err = run(tg, "--success-policy", "all", actions=("1:message:loss is NaN at step 7",))
    assert rc == 0, err
    job = tg.only_job()
    (ev,) = Store(tg.home).events_of(job["id"])
    assert (ev.replica, ev.kind, ev.text) == (
        "worker-1",
        "custom_message",
        "loss is NaN at step 7",
    )
