"""`framework: tensorflow` end to end with real TensorFlow (tensorflow-cpu) on CPU.

ParameterServerStrategy (async, as a job with a ps pool is by default): a worker killed mid-run
restarts alone, with the same TF_CONFIG address, and the chief's coordinator takes it back;
MultiWorkerMirroredStrategy (no ps: sync by default): a killed worker restarts the whole
job, which resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, TG, needs, wait_for

from trainguard.records.store import Store


def _tf_missing() -> str | None:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return "tensorflow is not installed (the test extras install tensorflow-cpu)"
    return None


pytestmark = [pytest.mark.slow, needs(_tf_missing(), "the TensorFlow tests")]


def _job(tmp_path: Path, name: str, example: str, pools: dict[str, int], *args: str) -> str:
    command = [sys.executable, str(ROOT / "examples" / example), *args]
    data: dict[str, Any] = {
        "name": name,
        "framework": "tensorflow",
        "worker_pools": [
            {"role": role, "replicas": n, "command": command} for role, n in pools.items()
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _replica(status: dict[str, Any], name: str) -> dict[str, Any]:
    (rep,) = [r for r in status["replicas"] if r["name"] == name]
    return dict(rep)


def test_parameter_server_job_restarts_a_killed_worker_alone(tg: TG, tmp_path: Path) -> None:
    args: tuple[str, ...] = ("--steps", "300", "--step-time", "0.03", "--ckpt-every", "100")
    args += ("--ckpt-dir", str(tmp_path / "ckpt"))  # paced: ~9 s, the worker rejoins in time
    pools = {"chief": 1, "worker": 2, "ps": 1}
    # Cold: the test reads each worker's TF_CONFIG from /proc/<pid>/environ, which for a
    # replica forked from the warm-start zygote shows the zygote's (README: what differs).
    job = _job(tmp_path, "ps", "tf_ps.py", pools, *args)
    proc = tg.start("run", "--quiet", "--no-preload", "-f", job)
    try:
        status = wait_for(
            lambda: (s := tg.status_or_none("ps")) and s["state"] == "RUNNING" and s, 120, "a run"
        )
        chief_log = Path(_replica(status, "chief-0")["log_path"])
        wait_for(lambda: "step 50 " in chief_log.read_text(), 120, "the chief at step 50")
        before = _replica(status, "worker-1")
        config = _tf_config(int(before["pid"]))
        os.kill(int(before["pid"]), signal.SIGKILL)

        def restarted() -> int | None:  # its new run's pid, once that run has started
            s = tg.status_or_none("ps")
            rep = _replica(s, "worker-1") if s else {}
            pid = rep.get("pid")
            if rep.get("restart") != 1 or pid in (None, before["pid"]):
                return None  # the restart is decided; its run not started yet
            return int(pid)

        assert _tf_config(wait_for(restarted, 60, "worker-1 to restart")) == config  # same address
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    status = tg.json("status", "ps")
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 1
    (record,) = tg.json("records", "ps")
    assert record["replica"] == "worker-1"
    assert record["decision"].startswith("RestartReplica(worker-1)")
    runs = [r.replica for r in Store(tg.home).runs_of(status["id"])]
    assert sorted(runs) == ["chief-0", "ps-0", "worker-0", "worker-1", "worker-1"]
    assert "step 300 " in chief_log.read_text()


def _tf_config(pid: int) -> dict[str, Any]:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (raw,) = [e for e in environ if e.startswith(b"TF_CONFIG=")]
    config: dict[str, Any] = json.loads(raw.split(b"=", 1)[1])
    assert config["task"] == {"type": "worker", "index": 1}
    return config


def test_multi_worker_mirrored_job_restarts_whole_and_resumes(tg: TG, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = ("--steps", "30", "--ckpt-every", "5", "--ckpt-dir", str(ckpt))
    job = _job(tmp_path, "mwms", "tf_mwms.py", {"worker": 2}, *args, "--crash-at-step", "12")
    res = tg("run", "--quiet", "-f", job, timeout=240)
    assert res.returncode == 0, res.stderr
    status = tg.json("status", "mwms")
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 2
    (record,) = tg.json("records", "mwms")
    assert record["replica"] == "worker-1" and record["decision"].startswith("RestartJob")
    log = (Path(status["log_dir"]) / "attempt-1" / "worker-0.log").read_text()
    assert "step 30 " in log
