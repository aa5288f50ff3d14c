"""`framework: mpi` end to end: trainguard runs mpirun, supervises its ranks, restarts.

Needs Open MPI and mpi4py (scripts/mpi_deps.sh, which scripts/test.sh runs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TG, alive, wait_for
from test_mpi_mpirun import requires_mpi

from trainguard.records.rows import RunRow
from trainguard.records.store import Store

pytestmark = [pytest.mark.slow, requires_mpi]

EXAMPLE = str(ROOT / "examples" / "mpi_allreduce.py")


def _job(tmp_path: Path, name: str, *args: str) -> str:
    out = tmp_path / f"{name}.json"
    command = [sys.executable, EXAMPLE, "--ckpt-dir", str(tmp_path / f"{name}-ckpt")]
    data = {
        "name": name,
        "framework": "mpi",
        "worker_pools": [
            {"role": "launcher", "command": ["mpirun"]},
            {"role": "worker", "replicas": 2, "command": [*command, "--out", str(out), *args]},
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _runs(tg: TG, job_id: str) -> list[RunRow]:
    return Store(tg.home).runs_of(job_id)


def test_a_killed_rank_restarts_the_mpi_job_which_ends_as_if_unbroken(
    tg: TG, tmp_path: Path
) -> None:
    # 10 s of training: the kill at step 10 must land while rank 1 runs, after the test's
    # status polls and log reads on a busy machine (at 2 s, a CI run found it gone)
    args = ("--steps", "100", "--ckpt-every", "5", "--step-time", "0.1")
    res = tg("run", "--quiet", "-f", _job(tmp_path, "clean", *args), timeout=120)
    assert res.returncode == 0, res.stderr
    proc = tg.start("run", "--quiet", "-f", _job(tmp_path, "broken", *args))
    status = wait_for(
        lambda: (
            (s := tg.status_or_none("broken"))
            and any(r["name"] == "worker-1" and r["pid"] for r in s["replicas"])
            and s
        ),
        60,
        "rank 1's pid",
    )
    (rank1,) = [r for r in status["replicas"] if r["name"] == "worker-1"]
    wait_for(lambda: "step 10" in Path(rank1["log_path"]).read_text(), 60, "step 10 of rank 1")
    signal_pid = int(rank1["pid"])
    os.kill(signal_pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not alive(signal_pid)
    status = tg.json("status", "broken")
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 2
    (record,) = tg.json("records", "broken")
    assert record["replica"] == "worker-1" and record["failure_class"] == "preemption"
    first = {r.replica: r for r in _runs(tg, status["id"]) if r.attempt == 0}
    assert first["worker-1"].signal == "SIGKILL" and first["worker-1"].state == "FAILED"
    assert first["worker-0"].state == "STOPPED"  # aborted by mpirun: a consequence
    clean = json.loads((tmp_path / "clean.json").read_text())
    assert json.loads((tmp_path / "broken.json").read_text()) == clean
    rank0 = Path(status["log_dir"]) / "attempt-1" / "worker-0.log"
    assert "resumed" in rank0.read_text() and "[1," not in rank0.read_text()


def test_a_bug_in_a_rank_is_not_retried_and_names_the_rank(tg: TG, tmp_path: Path) -> None:
    job = _job(tmp_path, "buggy", "--steps", "30", "--bug-at-step", "5")
    res = tg("run", "--quiet", "-f", job, timeout=120)
    assert res.returncode == 1
    status = tg.json("status", "buggy")
    assert status["state"] == "FAILED" and status["attempts"] == 1
    assert "worker-1" in status["error_message"]
    (why,) = tg.json("explain", "buggy")["failures"][:1]
    assert "KeyError" in json.dumps(why)
    assert "KeyError: 'lr'" in res.stderr  # the rank's own traceback, from its own log
    assert "trainguard/" not in res.stderr.replace(str(tg.home), "")  # none of ours


def test_a_hung_rank_is_snapshot_by_pid_and_the_job_restarts(tg: TG, tmp_path: Path) -> None:
    job = _job(tmp_path, "hung", "--steps", "20", "--ckpt-every", "5", "--hang-at-step", "8")
    spec = yaml.safe_load(Path(job).read_text())
    spec["fault_tolerance"] = {"job_hang_interval_s": 3}
    Path(job).write_text(yaml.safe_dump(spec))
    res = tg("run", "--quiet", "-f", job, timeout=180)
    assert res.returncode == 0, res.stderr
    (taken,) = tg.json("stacks", "hung")
    snaps = {s["replica"]: s for s in taken["snapshots"]}
    assert {"worker-0", "worker-1"} <= set(snaps)
    assert "mpi_allreduce.py" in json.dumps(snaps["worker-1"])  # py-spy reached the rank
    assert tg.json("status", "hung")["attempts"] == 2
