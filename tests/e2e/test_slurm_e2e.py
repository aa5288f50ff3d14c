"""trainguard inside a real Slurm allocation (issue 19): a 3-node cluster on hosts that share
nothing (tests/clusters/slurmcluster.py), the master on the batch host.

With each replica its own job step (`--no-node-agents`; test_slurm_agents_e2e runs the
same with node agents, the default): a 2-node DDP job loses a node (its machine dies:
slurmd, slurmstepd and the rank with it) and goes on on the spare from its checkpoint,
with the weights of a run without the fault; scancel ends every step; a hang's stacks are
taken on the node. With the default: a bug is not retried, a preemption notice
checkpoints and the requeued job resumes, too few nodes left is a capacity failure."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import slurm_jobs
import slurmcluster
from conftest import TG, wait_for
from slurm_jobs import ARGS, EXAMPLE, TRAINGUARD, shared, slurm
from slurmcluster import SlurmCluster

torch = pytest.importorskip("torch")  # the torch extra

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster
# the fixtures, used by name
__all__ = ["shared", "slurm", "slurm_cluster"]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
STEPS = "--no-node-agents"


def _reader(shared: Path) -> TG:
    return TG(shared / "home")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of the same job run on this machine without any fault."""
    return slurm_jobs.baseline_weights(tmp_path_factory, ranks=2)


def _same_weights(a: Path, b: Path) -> bool:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_2_node_ddp_job_survives_the_loss_of_a_node(
    slurm: SlurmCluster, shared: Path, baseline: Path
) -> None:
    tg = _reader(shared)
    proc = slurm_jobs.ddp_job(slurm, shared, STEPS, ranks_per_node=1)
    slurm_jobs.wait_step(tg, "ddp", 30, proc, 120)
    before = tg.json("status", "ddp")
    assert [r["node"] for r in before["replicas"]] == ["tg-host-0", "tg-host-1"]
    killed_s = time.time()
    slurm.kill(1)  # the machine of rank 1 dies
    code, _out, err = slurm_jobs.finish(proc)
    assert code == 0, err[-3000:]
    (rec,) = tg.json("records", "ddp")
    assert rec["replica"] == "worker-1" and rec["failure_class"] == "node_lost", rec
    assert "tg-host-1" in rec["error_message"] and "tg-host-1" in (rec["isolated"] or "")
    after = tg.json("status", "ddp")
    assert after["state"] == "SUCCEEDED" and after["attempts"] == 2
    assert [r["node"] for r in after["replicas"]] == ["tg-host-0", "tg-host-2"]
    assert _same_weights(shared / "final.pt", baseline)
    rows = slurm_jobs.progress_rows(shared)
    again = min(at for attempt, _step, at in rows if attempt == 1)
    print(  # the numbers for the README and the closing note
        f"\nslurm node loss: detected {rec['at_s'] - killed_s:.1f} s after the kill, "
        f"first step again {again - killed_s:.1f} s after it"
    )


def test_a_bug_is_not_retried_on_slurm(slurm: SlurmCluster, shared: Path) -> None:
    proc = slurm_jobs.salloc(
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
    code, _out, err = slurm_jobs.finish(proc, 180)
    assert code == 1, err[-3000:]
    status = _reader(shared).json("status", "bug")
    why = _reader(shared)("explain", "bug").stdout  # what the first attempt was read as
    assert status["state"] == "FAILED" and status["attempts"] == 1, why
    assert "KeyError" in (status["error_message"] or "")


def test_scancel_ends_every_step(slurm: SlurmCluster, shared: Path) -> None:
    status, out = slurm_jobs.scancelled(slurm, shared, STEPS)
    assert status["state"] == "CANCELLED", status
    assert "SIGTERM from Slurm" in out


def test_a_hangs_stacks_are_dumped_on_its_node(slurm: SlurmCluster, shared: Path) -> None:
    stacks = slurm_jobs.hang_stacks(slurm, shared, STEPS)
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
    script = (
        f"exec {TRAINGUARD} run --plain --job-name pre --resume --nodes 2 -- {sys.executable} "
        f"{EXAMPLE} {' '.join(ARGS)} --ckpt-every 1000 --report "
        f"--ckpt-dir {shared / 'ckpt'} --out {shared / 'final.pt'} --step-time 0.3"
    )  # 0.3 s a step (the weights do not change): the requeue must land before step 90
    job = slurm_jobs.sbatch(slurm, shared, script, "--requeue", "--open-mode=append")
    tg = _reader(shared)
    wait_for(lambda: slurm_jobs.at_step(tg, "pre", 20), 120, "the job training")
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
    assert "preemption notice" in out, out[-3000:]
    # The requeue is heard twice: its SIGTERM to the master, and the agents' steps ending,
    # after which Slurm is asked; whichever comes first cancels (seen both ways in CI).
    heard = ("SIGTERM from Slurm", "Slurm ended allocation")
    assert any(f"cancelled ({h}" in out for h in heard), out[-3000:]
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
    proc = slurm_jobs.salloc(slurm, shared, "-f", str(spec), nodes=2)  # no spare node
    tg = _reader(shared)
    slurm_jobs.wait_step(tg, "tight", 10, proc, 120)
    slurm.kill(1)
    code, _out, err = slurm_jobs.finish(proc, 180)
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
