"""The memory cgroup's OOM counters read at a run's exit (backends.local.oom): cgroup v2's
`memory.events` (`oom_kill`, `oom_group_kill`) and v1's `memory.oom_control`, the run's own
counter sure of it, the shared one not."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from trainguard.backends.local import oom
from trainguard.backends.local.cgroups import JobCgroups, hierarchies
from trainguard.classify.readings import Finding, Source


def test_v2_and_v1_counter_files(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 1\n")
    assert oom.oom_counts(v2) == {"oom_kill": 1, "oom_group_kill": 1}
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert oom.oom_counts(v1) == {"oom_kill": 3, "oom_group_kill": 0}
    assert oom.oom_counts(tmp_path / "gone") is None


def _run_in(path: Path | None, before: int = 0) -> Any:
    from trainguard.backends.local.cgroups import RunCgroup

    processes = RunCgroup(path, v2=False) if path is not None else object()
    return cast(Any, SimpleNamespace(processes=processes, oom_before=before))


def test_the_runs_own_v2_counter_is_sure(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("oom 1\noom_kill 0\noom_group_kill 1\n")
    r = oom.memory_reading(_run_in(tmp_path))
    assert (r.source, r.finding, r.sure) == (Source.CGROUP, Finding.OOM_KILL, True)
    assert "oom_group_kill 1" in r.value


def test_the_shared_counter_is_not_sure_and_no_counter_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "memory.oom_control"
    shared.write_text("oom_kill 5\n")
    monkeypatch.setattr(oom, "_FILE", shared)
    r = oom.memory_reading(_run_in(None, before=4))
    assert (r.finding, r.sure) == (Finding.OOM_KILL, False)
    assert oom.memory_reading(_run_in(None, before=5)).finding is Finding.NOTHING
    monkeypatch.setattr(oom, "_FILE", None)
    r = oom.memory_reading(_run_in(None))
    assert (r.finding, r.sure, r.reading) == (Finding.ABSENT, False, "absent")


MEMORY = [h for h in hierarchies() if h.controller == "memory"]


@pytest.mark.slow
@pytest.mark.skipif(not MEMORY, reason="no cgroup v1 memory controller here")
def test_a_run_in_its_own_v1_memory_cgroup_counts_its_oom_kill_until_it_goes() -> None:
    """Read before the cgroup is removed (as the backend does at exit): after, it is gone,
    and a v1 cgroup's kills never reach its parent's counter."""
    jobs = JobCgroups.create("machinetest0", among=MEMORY)
    assert isinstance(jobs, JobCgroups)
    run = jobs.new_run()
    try:
        (run.path / "memory.limit_in_bytes").write_text(str(32 << 20))
        code = (
            f"open({str(run.path / 'cgroup.procs')!r}, 'w').write(str(__import__('os').getpid()))\n"
            "hog = []\nwhile True:\n    hog.append(bytearray(4 << 20))\n"
        )
        res = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
        assert res.returncode == -9
        r = oom.memory_reading(_run_in(run.path))
        assert (r.finding, r.sure) == (Finding.OOM_KILL, True)
    finally:
        asyncio.run(jobs.close())
    assert oom.memory_reading(_run_in(run.path)).finding is not Finding.OOM_KILL
