"""Run tracking (issue 37): where a run's cgroup can live, that killing it ends every escape
shape in each hierarchy this machine has (v2, and v1 pids, freezer, memory), and the
subreaper fallback where no cgroup is usable."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, alive, wait_for
from test_escapees_e2e import ESCAPE, SHAPES

from trainguard.backends.local.cgroups import Hierarchy, JobCgroups, hierarchies

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "8:pids:/\n6:freezer:/\n4:memory:/process_api/37e7\n0::/\n"


def test_the_hierarchies_are_read_best_first() -> None:
    found = hierarchies(HYBRID_CGROUP, HYBRID_MOUNTINFO)
    assert [(str(h.home), h.v2, h.controller) for h in found] == [
        ("/sys/fs/cgroup/unified", True, ""),
        ("/sys/fs/cgroup/pids", False, "pids"),
        ("/sys/fs/cgroup/freezer", False, "freezer"),
        ("/sys/fs/cgroup/memory/process_api/37e7", False, "memory"),
    ]


def test_a_pure_v2_machine_and_a_container_s_own_subtree() -> None:
    v2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    (h,) = hierarchies("0::/user.slice/job.scope\n", v2)
    assert (str(h.home), h.v2) == ("/sys/fs/cgroup/user.slice/job.scope", True)
    # a container without a cgroup namespace sees its own subtree mounted at the top
    docker = "40 31 0:36 /docker/abc /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n"
    (h,) = hierarchies("8:pids:/docker/abc\n", docker)
    assert str(h.home) == "/sys/fs/cgroup/pids"


def test_no_cgroup_at_all_says_why() -> None:
    assert hierarchies("0::/\n", "") == []
    assert JobCgroups.create("t" * 32, among=[]) == "no cgroup we may use (none mounted)"
    missing = Hierarchy(Path("/nonexistent-cgroup-mount"), "/", v2=True)
    why = JobCgroups.create("t" * 32, among=[missing])
    assert isinstance(why, str) and why.startswith("no cgroup we may use (v2 at /nonexistent")


def _leave_escapees(
    tmp_path: Path, join: str | None
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """Start one replica per escape shape (each joins the cgroup first, as a forked
    replica does) and wait for its escapee; (replicas, escapees)."""
    out = tmp_path / "escapees"
    out.mkdir()
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    prefix = f"open({join!r}, 'w').write(str(__import__('os').getpid())); " if join else ""
    runner = prefix + "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", runner, str(script), str(out), "forever"],
            env={**os.environ, "RANK": str(rank)},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        for rank in range(len(SHAPES))
    ]
    files = [out / f"{rank}.0" for rank in range(len(SHAPES))]
    wait_for(lambda: all(f.is_file() for f in files), 30, "the escapees")
    return procs, [int(f.read_text()) for f in files]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["v2", "pids", "freezer", "memory"])
def test_killing_a_run_s_cgroup_ends_every_escape_shape(tmp_path: Path, kind: str) -> None:
    found = [h for h in hierarchies() if (h.controller or "v2") == kind]
    if not found:
        pytest.skip(f"no {kind} cgroup hierarchy here")
    job = JobCgroups.create(os.urandom(8).hex(), among=found)
    if isinstance(job, str):
        pytest.skip(job)
    run = job.new_run()
    procs, escapees = _leave_escapees(tmp_path, run.procs_file)
    everything = [*(p.pid for p in procs), *escapees]
    try:
        assert sorted(run.pids()) == sorted(everything)  # each is in, wherever it went
        assert asyncio.run(run.kill())
        assert [p.wait(timeout=10) for p in procs] == [-signal.SIGKILL] * len(procs)
        wait_for(lambda: not any(alive(p) for p in everything), 10, "every process to end")
        run.remove()
        assert not run.path.exists()
        asyncio.run(job.close())
        assert not job.folder.exists()
    finally:
        for pid in everything:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait()


# Without a cgroup: a backend in a process of its own (it becomes a child subreaper),
# replicas that each leave an escapee, then exit 0 (a success); the backend's close.
FALLBACK = textwrap.dedent(
    """
    import asyncio, os, sys
    sys.path.insert(0, {src!r})
    from pathlib import Path
    from trainguard.backends.interface import Launch, ReplicaExited
    from trainguard.backends.local import tracking
    from trainguard.backends.local.backend import LocalBackend
    tracking.JobCgroups.create = lambda token: "switched off for the test"
    script, out = sys.argv[1], sys.argv[2]
    async def main():
        backend = LocalBackend(tee=None)
        exits = []
        backend.bind(lambda ev: exits.append(ev) if isinstance(ev, ReplicaExited) else None)
        launches = [
            Launch(0, f"worker-{{r}}", r, 0, (sys.executable, script, out, "exit"),
                   {{**os.environ, "RANK": str(r)}}, out, Path(out, f"log-{{r}}"))
            for r in range({n})
        ]
        await backend.start(launches)
        while len(exits) < {n}:
            await asyncio.sleep(0.05)
        print(*backend.warm_start_notes, flush=True)
        await backend.close()
        print("closed", flush=True)
    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_without_a_cgroup_the_subreaper_fallback_ends_every_escape_shape(
    tmp_path: Path,
) -> None:
    out = tmp_path / "escapees"
    out.mkdir()
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    code = FALLBACK.format(src=str(ROOT / "src"), n=len(SHAPES))
    res = subprocess.run(
        [sys.executable, "-c", code, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    escapees = [int((out / f"{rank}.0").read_text()) for rank in range(len(SHAPES))]
    try:
        assert res.returncode == 0, res.stderr
        assert "tracked as a child subreaper: switched off for the test" in res.stdout
        wait_for(lambda: not any(alive(p) for p in escapees), 10, "every escapee to end")
    finally:
        for pid in escapees:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
