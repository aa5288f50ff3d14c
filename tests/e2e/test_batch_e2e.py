"""`framework: batch` with real processes: shards retried alone, partial success."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import TG, child

from trainguard.records.rows import RunRow
from trainguard.records.store import Store

pytestmark = pytest.mark.slow  # real jobs

# shard 0 succeeds; shard 1 is killed on its first two runs, then succeeds; shard 2 is
# killed every time, a while later (shard 1 is done by then, whether the job then fails
# or not). Each shard prints its own SHARD_INDEX / SHARD_COUNT first.
SHARDS = child(
    "*:env:SHARD_INDEX",
    "*:env:SHARD_COUNT",
    "1@0:signal:KILL",
    "1@1:signal:KILL",
    "2:sleep:1.5",
    "2:signal:KILL",
    "*:print:shard done",
)


def _job(tmp_path: Path, **extra: object) -> str:
    data = {
        "name": "shards",
        "framework": "batch",
        "worker_pools": [{"role": "shard", "replicas": 3, "command": SHARDS}],
        "fault_tolerance": {"max_replica_restarts": 2},
        **extra,
    }
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("partial", [False, True])
def test_shards_retry_alone_and_a_spent_shard_fails_the_job_or_is_listed(
    tg: TG, tmp_path: Path, partial: bool
) -> None:
    res = tg("run", "-f", _job(tmp_path, allow_partial=partial))
    status = tg.only_job()
    by_shard: dict[str, list[RunRow]] = {}
    for run in Store(tg.home).runs_of(status["id"]):
        by_shard.setdefault(str(run.replica), []).append(run)
    assert len(by_shard["shard-0"]) == 1  # never restarted: the others' failures are theirs
    assert [r.state for r in by_shard["shard-1"]] == ["FAILED", "FAILED", "SUCCEEDED"]
    assert [r.state for r in by_shard["shard-2"]] == ["FAILED"] * 3
    assert status["attempts"] == 1  # no job restart, ever
    log = (Path(status["log_dir"]) / "attempt-0" / "shard-1.r2.log").read_text()
    assert log.splitlines()[:2] == ["SHARD_INDEX=1", "SHARD_COUNT=3"]
    if partial:
        assert res.returncode == 0, res.stderr
        assert status["state"] == "SUCCEEDED" and status["error_code"] == "PARTIAL"
        assert status["error_message"] == (
            "partial success: 2 of 3 replicas succeeded; given up: shard-2"
        )
    else:
        assert res.returncode == 1
        assert status["state"] == "FAILED"
        assert "shard-2 spent its 2 restarts" in res.stderr
    assert "Traceback" not in res.stderr
