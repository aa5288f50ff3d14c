"""trainguard inside a real Slurm allocation (issue 19): a 3-node cluster on hosts that share
nothing (tests/clusters/slurmcluster.py), the master on the batch host, each replica a job step.

A 2-node DDP job loses a node (its machine dies: slurmd, slurmstepd and the rank with it)
and goes on on the spare from its checkpoint, with the weights of a run without the fault;
a bug is not retried; scancel ends every step; a hang's stacks are taken on the node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurmcluster
from conftest import ROOT, TG, wait_for
from slurmcluster import SlurmCluster

torch = pytest.importorskip("torch")  # the torch extra

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster

EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))
ARGS = ("--steps", "90", "--ckpt-every", "10", "--step-time", "0.05")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    slurm_cluster.heal()  # a node an earlier test killed comes back
    return slurm_cluster


@pytest.fixture
def shared(slurm: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder of this test on the storage every host sees (the store, checkpoints)."""
    folder = slurm.hosts.shared / request.node.name
    folder.mkdir(parents=True)
    yield folder


def _job(slurm: SlurmCluster, shared: Path, *run: str, nodes: int = 3) -> subprocess.Popen[str]:
    """`salloc -N<nodes> --no-kill trainguard run ...` on the batch host."""
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    argv = ["salloc", f"-N{nodes}", "--no-kill", TRAINGUARD, "run", "--plain", *run]
    return slurm.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=shared
    )


def _reader(shared: Path) -> TG:
    return TG(shared / "home")


def _wait_step(tg: TG, job: str, step: int, proc: subprocess.Popen[str], timeout: float) -> None:
    def reached() -> bool:
        assert proc.poll() is None, proc.communicate()
        status = tg.status_or_none(job)
        progress = (status or {}).get("progress") or {}
        return (progress.get("step") or 0) >= step

    wait_for(reached, timeout, f"job {job} at step {step}")


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of the same job run on this machine without any fault."""
    home = tmp_path_factory.mktemp("baseline")
    out = home / "final.pt"
    res = TG(home / "home")(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--",
        sys.executable,
        EXAMPLE,
        *ARGS,
        "--ckpt-dir",
        str(home / "ckpt"),
        "--out",
        str(out),
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    return out


def _same_weights(a: Path, b: Path) -> bool:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_2_node_ddp_job_survives_the_loss_of_a_node(
    slurm: SlurmCluster, shared: Path, baseline: Path
) -> None:
    tg = _reader(shared)
    proc = _job(
        slurm,
        shared,
        "--job-name",
        "ddp",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--",
        sys.executable,
        EXAMPLE,
        *ARGS,
        "--step-time",  # slower than the baseline's (same weights): under load the job must
        "0.2",  # not finish between the status that saw step 30 and the kill
        "--ckpt-dir",
        str(shared / "ckpt"),
        "--out",
        str(shared / "final.pt"),
    )
    _wait_step(tg, "ddp", 30, proc, 120)
    before = tg.json("status", "ddp")
    assert [r["node"] for r in before["replicas"]] == ["tg-host-0", "tg-host-1"]
    killed_s = time.time()
    slurm.kill(1)  # the machine of rank 1 dies
    code, _out, err = _finish(proc)
    assert code == 0, err[-3000:]
    (rec,) = tg.json("records", "ddp")
    assert rec["replica"] == "worker-1" and rec["failure_class"] == "node_lost", rec
    assert "tg-host-1" in rec["error_message"] and "tg-host-1" in (rec["isolated"] or "")
    after = tg.json("status", "ddp")
    assert after["state"] == "SUCCEEDED" and after["attempts"] == 2
    assert [r["node"] for r in after["replicas"]] == ["tg-host-0", "tg-host-2"]
    assert _same_weights(shared / "final.pt", baseline)
    rows = _progress_rows(shared)
    again = min(at for attempt, _step, at in rows if attempt == 1)
    print(  # the numbers for the README and the closing note
        f"\nslurm node loss: detected {rec['at_s'] - killed_s:.1f} s after the kill, "
        f"first step again {again - killed_s:.1f} s after it"
    )


def _progress_rows(shared: Path) -> list[tuple[int, int, float]]:
    import sqlite3

    db = sqlite3.connect(shared / "home" / "trainguard.db")
    try:
        return [
            (int(a), int(s), float(t))
            for a, s, t in db.execute("select attempt, step, at_s from progress order by at_s")
        ]
    finally:
        db.close()


def test_a_bug_is_not_retried_on_slurm(slurm: SlurmCluster, shared: Path) -> None:
    proc = _job(
        slurm,
        shared,
        "--job-name",
        "bug",
        "--nodes",
        "2",
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        "50",
        "--bug-at-step",
        "5",
        "--ckpt-dir",
        str(shared / "ckpt"),
        nodes=2,
    )
    code, _out, err = _finish(proc, 180)
    assert code == 1, err[-3000:]
    status = _reader(shared).json("status", "bug")
    why = _reader(shared)("explain", "bug").stdout  # what the first attempt was read as
    assert status["state"] == "FAILED" and status["attempts"] == 1, why
    assert "KeyError" in (status["error_message"] or "")


def test_scancel_ends_every_step(slurm: SlurmCluster, shared: Path) -> None:
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home")}
    script = (
        f"exec {TRAINGUARD} run --plain --job-name long --nodes 2 -- {sys.executable} "
        f"{EXAMPLE} --steps 100000 --step-time 0.05 --ckpt-dir {shared / 'ckpt'}"
    )
    submit = slurm.run(
        [
            "sbatch",
            "--parsable",
            "-N2",
            "--no-kill",
            f"--output={shared / 'out.txt'}",
            "--wrap",
            script,
        ],
        env=env,
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    tg = _reader(shared)

    def training() -> bool:
        status = tg.status_or_none("long")
        progress = (status or {}).get("progress") or {}
        return (progress.get("step") or 0) >= 5

    wait_for(training, 120, "the job training on 2 nodes")
    assert slurm.run(["scancel", job]).returncode == 0

    def ended() -> bool:
        return not slurm.processes()  # no slurmstepd, srun, python left on any host

    wait_for(ended, 60, "every step of the job ended")
    status = tg.json("status", "long")
    assert status["state"] == "CANCELLED", status
    assert "SIGTERM from Slurm" in (shared / "out.txt").read_text()


def test_a_hangs_stacks_are_dumped_on_its_node(slurm: SlurmCluster, shared: Path) -> None:
    proc = _job(
        slurm,
        shared,
        "--job-name",
        "hang",
        "--nodes",
        "2",
        "--job-hang-interval",
        "6",
        "--max-restarts",
        "0",
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        "200",
        "--step-time",
        "0.05",
        "--hang-at-step",
        "15",
        "--ckpt-dir",
        str(shared / "ckpt"),
        nodes=2,
    )
    _finish(proc, 180)
    tg = _reader(shared)
    stacks: list[dict[str, Any]] = tg.json("stacks", "hang")
    assert stacks, "no stack dump was taken"
    report = json.dumps(stacks)
    assert "_stall_forever" in report, report[:3000]  # rank 1's own frame, on tg-host-1
    diagnosis = {r["replica"]: r for r in stacks[0]["report"]["replicas"]}
    frames = [f["name"] for f in diagnosis["worker-1"]["main_stack"]]
    assert "_stall_forever" in frames, diagnosis["worker-1"]


def test_a_preemption_notice_checkpoints_and_the_requeued_job_resumes(
    slurm: SlurmCluster, shared: Path, baseline: Path
) -> None:
    """Slurm's warning (`--signal=B:USR1@N`, sent here at once with scancel) reaches the
    training code, which checkpoints; `scontrol requeue` stops the job (SIGTERM) and runs
    its script again, whose `run --resume` goes on from that checkpoint."""
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home")}
    script = (
        f"exec {TRAINGUARD} run --plain --job-name pre --resume --nodes 2 -- {sys.executable} "
        f"{EXAMPLE} {' '.join(ARGS)} --ckpt-every 1000 --report "
        f"--ckpt-dir {shared / 'ckpt'} --out {shared / 'final.pt'} --step-time 0.3"
    )  # 0.3 s a step (the weights do not change): the requeue must land before step 90
    submit = slurm.run(
        [
            "sbatch",
            "--parsable",
            "-N2",
            "--no-kill",
            "--requeue",
            "--open-mode=append",
            f"--output={shared / 'out.txt'}",
            "--wrap",
            script,
        ],
        env=env,
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    tg = _reader(shared)

    def at_step(step: int) -> bool:
        status = tg.status_or_none("pre")
        return (((status or {}).get("progress") or {}).get("step") or 0) >= step

    wait_for(lambda: at_step(20), 120, "the job training")
    notice_s = time.time()
    assert slurm.run(["scancel", "--batch", "--signal=USR1", job]).returncode == 0
    ckpt = shared / "ckpt" / "checkpoint.pt"
    wait_for(ckpt.exists, 30, "the checkpoint the notice asked for")
    saved = int(torch.load(ckpt, weights_only=True)["step"])
    assert slurm.run(["scontrol", "requeue", job]).returncode == 0
    requeued_s = time.time()

    seen: list[str] = []

    def resumed_and_done() -> bool:
        """Release the requeue if Slurm holds it (~2 min of BeginTime, or a hold), then wait
        for trainguard's record of the job: done, on a later attempt than the first."""
        shown = slurm.run(["scontrol", "show", "job", job], timeout=30)
        state = re.search(r"JobState=(\S+)", shown.stdout)
        # gone: done and purged (MinJobAge is 2 s), or slurmctld did not answer (its words)
        seen.append(state[1] if state else f"(gone: {shown.stderr.strip()[:80]})")
        if state and state[1] in ("PENDING", "REQUEUE_HOLD", "SPECIAL_EXIT"):
            slurm.run(["scontrol", "release", job], timeout=30)  # a held requeue
            slurm.run(["scontrol", "update", f"jobid={job}", "starttime=now"], timeout=30)
        status = tg.status_or_none("pre") or {}
        if state is None and status.get("attempts", 0) < 2 and status.get("state") in TERMINAL:
            raise AssertionError("the batch job is gone and trainguard's job never ran again")
        time.sleep(0.3)  # each poll starts two processes: not a busy loop on 2 cores
        return status.get("state") == "SUCCEEDED" and status.get("attempts", 0) >= 2

    try:
        wait_for(resumed_and_done, 300, "the requeued job to resume and finish")
    except AssertionError:
        out = (shared / "out.txt").read_text(errors="replace")[-4000:]
        ctld = [line for line in slurm.logs(tail=20000).splitlines() if f"JobId={job}" in line]
        raise AssertionError(
            f"job states seen after the requeue: {seen[:5]} ... {seen[-10:]}\n"
            f"trainguard status: {tg.status_or_none('pre')}\n--- out.txt\n{out}\n"
            "--- slurmctld on the job\n" + "\n".join(ctld[-40:])
        ) from None
    out = (shared / "out.txt").read_text()
    assert "preemption notice" in out and "SIGTERM from Slurm" in out
    resumed = re.search(rf"resumed from reported checkpoint (\S+) of step {saved}\b", out)
    assert resumed, out[-3000:]
    assert _same_weights(shared / "final.pt", baseline)
    status = tg.json("status", "pre")
    print(
        f"\nslurm preemption: checkpoint of step {saved} {ckpt.stat().st_mtime - notice_s:.1f} s "
        f"after the notice; requeued job done {time.time() - requeued_s:.1f} s after the "
        f"requeue ({status['attempts']} attempts)"
    )


def test_too_few_nodes_left_is_a_clear_capacity_failure_and_the_node_is_drained(
    slurm: SlurmCluster, shared: Path
) -> None:
    spec = shared / "job.yaml"
    spec.write_text(
        "name: tight\nbackend: slurm\nslurm: {nodes: 2, drain_lost_nodes: true}\n"
        "worker_pools:\n  - role: worker\n    replicas: 2\n"
        f"    command: [{sys.executable}, {EXAMPLE}, --steps, '400', --step-time, '0.05',"
        f" --ckpt-dir, {shared / 'ckpt'}]\n"
    )
    proc = _job(slurm, shared, "-f", str(spec), nodes=2)  # no spare node
    tg = _reader(shared)
    _wait_step(tg, "tight", 10, proc, 120)
    slurm.kill(1)
    code, _out, err = _finish(proc, 180)
    assert code == 1, err[-3000:]
    status = tg.json("status", "tight")
    assert status["state"] == "FAILED" and status["error_code"] == "CAPACITY", status
    assert (
        "the job needs 2 node(s) of 1 task(s), and the allocation has 1 usable"
        in (status["error_message"])
    )
    assert "tg-host-1 was lost under worker-1" in status["error_message"]
    assert "DRAIN" in slurm.node_state(1)  # the spec allowed draining it
    reason = slurm.scontrol("show", "node", "tg-host-1")
    assert "Reason=trainguard: node tg-host-1 was lost under worker-1" in reason
    slurm.run(["scontrol", "update", "nodename=tg-host-1", "state=resume"])
    slurm.revive(1)
