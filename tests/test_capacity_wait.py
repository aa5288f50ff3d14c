"""queue.wait_for_capacity in the master: a capacity failure waits and retries, for free."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import TG, child

NO_GPU = "print:RuntimeError: No CUDA GPUs are available"


def _run(tg: TG, tmp_path: Path, actions: list[str], **queue: object) -> tuple[int, str]:
    spec = {
        "name": "flex",
        "worker_pools": [{"replicas": 1, "command": child(*actions)}],
        "fault_tolerance": {"max_capacity_restarts": 0},
        "queue": {"wait_for_capacity": True, "capacity_retry_s": 0.3, **queue},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    res = tg("run", "--quiet", "-f", str(path))
    return res.returncode, res.stderr


def test_capacity_shortage_waits_then_runs_without_charging_a_budget(
    tg: TG, tmp_path: Path
) -> None:
    code, err = _run(tg, tmp_path, [f"0@0:{NO_GPU}", "0@0:exit:1", f"0@1:{NO_GPU}", "0@1:exit:1"])
    assert code == 0, err
    job = tg.only_job()
    assert job["state"] == "SUCCEEDED" and job["attempts"] == 3
    records = tg.json("records", job["id"])
    assert [r["decision"].split(":")[0] for r in records] == ["WaitForCapacity"] * 2
    assert all(r["failure_class"] == "insufficient_capacity" for r in records)
    history = tg.json("status", job["id"])
    assert history["queued_reason"] is None  # cleared once it ran


def test_capacity_wait_expires_after_max_wait(tg: TG, tmp_path: Path) -> None:
    code, err = _run(
        tg, tmp_path, [NO_GPU.replace("print", "*:print", 1), "*:exit:1"], max_wait_s=1
    )
    assert code == 1
    job = tg.only_job()
    assert job["state"] == "EXPIRED" and job["error_code"] == "EXPIRED"
    assert "No CUDA GPUs" in job["error_message"]
    assert "Traceback" not in err
