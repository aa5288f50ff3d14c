"""trainguard jobs on the real Slurm cluster (tests/clusters/slurmcluster.py): the fixtures
and helpers the Slurm end-to-end files share, so that each starts, waits for and reads a job
one way, with node agents (the default) or a step per rank (`--no-node-agents` among
`run`'s flags).

A file takes the fixtures `slurm` and `shared` by importing them beside its own cluster,
`slurm_cluster = slurmcluster.slurm_cluster`, which they use."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG, wait_for
from slurmcluster import SlurmCluster

EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))
ARGS = ("--steps", "90", "--ckpt-every", "10", "--step-time", "0.05")
"""The DDP example's run: the job a node loss interrupts (`ddp_job`) and its run without one
(`baseline_weights`) end with the same weights."""


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    slurm_cluster.heal()  # a node an earlier test killed comes back
    return slurm_cluster


_STARTED: list[subprocess.Popen[str]] = []
"""Every `salloc` of the running test: one a failed test left running is ended with it,
not garbage-collected while it runs during the next test (a warning that fails that one)."""


@pytest.fixture
def shared(slurm: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder of this test on the storage every host sees (the store, checkpoints)."""
    folder = slurm.hosts.shared / request.node.name
    folder.mkdir(parents=True)
    yield folder
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def baseline_weights(tmp_path_factory: pytest.TempPathFactory, ranks: int) -> Path:
    """The final weights of the `ARGS` run on this machine, `ranks` ranks, without a fault:
    what a job that loses a node must end with."""
    home = tmp_path_factory.mktemp("baseline")
    out = home / "final.pt"
    train = [sys.executable, EXAMPLE, *ARGS, "--ckpt-dir", str(home / "ckpt"), "--out", str(out)]
    run = ["run", "--quiet", "--nproc-per-node", str(ranks), "--", *train]
    res = TG(home / "home")(*run, timeout=240)
    assert res.returncode == 0, res.stderr
    return out


def salloc(slurm: SlurmCluster, shared: Path, *run: str, nodes: int = 3) -> subprocess.Popen[str]:
    """`salloc -N<nodes> --no-kill trainguard run --plain RUN...` on the batch host."""
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    argv = ["salloc", f"-N{nodes}", "--no-kill", TRAINGUARD, "run", "--plain", *run]
    proc = slurm.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=shared
    )
    _STARTED.append(proc)
    return proc


def ddp_job(
    slurm: SlurmCluster, shared: Path, *run: str, ranks_per_node: int
) -> subprocess.Popen[str]:
    """The job `ddp` on 2 nodes of 3 that a node loss interrupts: the run of `baseline_weights`,
    slower (the same weights): under load it must not finish between the status that saw
    step 30 and the kill."""
    slow = [*ARGS, "--step-time", "0.2"]
    train = [EXAMPLE, *slow, "--ckpt-dir", str(shared / "ckpt"), "--out", str(shared / "final.pt")]
    job = ["--job-name", "ddp", "--nodes", "2", "--nproc-per-node", str(ranks_per_node)]
    return salloc(slurm, shared, *run, *job, "--", sys.executable, *train)


def sbatch(slurm: SlurmCluster, shared: Path, script: str, *options: str) -> str:
    """Submit `script` as a 2-node batch job (its output in shared/out.txt); its job id."""
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home")}
    out = f"--output={shared / 'out.txt'}"
    argv = ["sbatch", "--parsable", "-N2", "--no-kill", *options, out, "--wrap", script]
    submit = slurm.run(argv, env=env)
    assert submit.returncode == 0, submit.stderr
    return submit.stdout.strip()


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def at_step(tg: TG, job: str, step: int) -> bool:
    """Whether `job`'s progress has reached `step` (not while the job does not exist)."""
    progress = (tg.status_or_none(job) or {}).get("progress") or {}
    return (progress.get("step") or 0) >= step


def wait_step(tg: TG, job: str, step: int, proc: subprocess.Popen[str], timeout: float) -> None:
    """Wait for `job` at `step`, failing at once if `proc` (its master) ends first."""

    def reached() -> bool:
        assert proc.poll() is None, proc.communicate()
        return at_step(tg, job, step)

    wait_for(reached, timeout, f"job {job} at step {step}")


def progress_rows(shared: Path) -> list[tuple[int, int, float]]:
    """(attempt, step, at_s) of every progress report in the test's store, oldest first."""
    db = sqlite3.connect(shared / "home" / "trainguard.db")
    try:
        rows = db.execute("select attempt, step, at_s from progress order by at_s")
        return [(int(a), int(s), float(t)) for a, s, t in rows]
    finally:
        db.close()


def hang_stacks(slurm: SlurmCluster, shared: Path, *run: str) -> list[dict[str, Any]]:
    """The stack dumps of a 2-node job (no restart) whose rank 1 hangs at step 15."""
    hang = ["--job-name", "hang", "--nodes", "2", "--job-hang-interval", "6", "--max-restarts", "0"]
    train = [EXAMPLE, "--steps", "200", "--step-time", "0.05", "--hang-at-step", "15"]
    ckpt = ["--ckpt-dir", str(shared / "ckpt")]
    proc = salloc(slurm, shared, *run, *hang, "--", sys.executable, *train, *ckpt, nodes=2)
    finish(proc, 180)
    stacks: list[dict[str, Any]] = TG(shared / "home").json("stacks", "hang")
    return stacks


def scancelled(slurm: SlurmCluster, shared: Path, *run: str) -> tuple[dict[str, Any], str]:
    """A long 2-node batch job scancelled once it trains: its status once every step on
    every host ended, and its batch output."""
    head = ["exec", TRAINGUARD, "run", "--plain", *run, "--job-name", "long", "--nodes", "2"]
    train = f"{EXAMPLE} --steps 100000 --step-time 0.05 --ckpt-dir {shared / 'ckpt'}"
    script = " ".join([*head, "--", sys.executable, train])
    job_id = sbatch(slurm, shared, script)
    tg = TG(shared / "home")
    wait_for(lambda: at_step(tg, "long", 5), 120, "the job training on 2 nodes")
    assert slurm.run(["scancel", job_id]).returncode == 0
    # no slurmstepd, srun, python left on any host
    wait_for(lambda: not slurm.processes(), 60, "every step of the job ended")
    return tg.json("status", "long"), (shared / "out.txt").read_text()
