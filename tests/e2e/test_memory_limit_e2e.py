"""A replica held to its own `resources.memory` on the local backend (issue 38), for real:
the whole job in a capped v1 memory cgroup (the fault matrix's `node_memory`, 256 MiB), so
a hog never reaches the machine's OOM killer. The hog row itself is the fault matrix's
(`test_fault_matrix_e2e`); here: one under its limit across a restart, a forked hog, a
master killed (its guardian removes the memory cgroups), and the zygote's child joining
both of its run's cgroups before its program begins."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import TG, needs, wait_for
from test_fault_matrix_e2e import MEMORY, _children, _in_cgroup, _run, node_memory

from trainguard.backends.interface import Launch, ReplicaExited
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.local.memory_limit import MemoryCgroups
from trainguard.backends.local.zygote import Zygote

pytestmark = pytest.mark.slow  # real jobs

__all__ = ["node_memory"]  # the fixture, used by name

_REPLICA = """\
import os, sys
forked = "fractions" in sys.modules  # the zygote preloaded it; a cold start has not
mine = [ln.split(":", 2)[2].strip() for ln in open("/proc/self/cgroup") if ":memory:" in ln]
limit = int(open(f"/sys/fs/cgroup/memory{mine[0]}/memory.limit_in_bytes").read())
print(f"forked {forked} limit {limit}", flush=True)
if sys.argv[1] == "once-then-hold":  # fail the first attempt, then hold 24 MiB and end
    marker = sys.argv[2]
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(1)
    held = b"\\x01" * (24 << 20)
    print("held 24 MiB", flush=True)
elif sys.argv[1] == "sleep":
    __import__("time").sleep(600)
else:  # hog: 8 MiB at a time, saying how much, until killed
    held = []
    while True:
        held.append(b"\\x01" * (8 << 20))
        print(f"holding {8 * len(held)} MiB", flush=True)
"""


def _spec(tmp_path: Path, *args: str, preload: bool = False) -> Path:
    script = tmp_path / "replica.py"
    script.write_text(_REPLICA)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: held\n"
        + ("preload: [fractions]\n" if preload else "preload: none\n")
        + "worker_pools:\n"
        "  - role: worker\n"
        "    replicas: 1\n"
        f"    command: [{sys.executable}, {script}, {', '.join(args)}]\n"
        "    resources: {memory: 64Mi}\n"
    )
    return spec


def _lines(tg: TG, job: dict[str, Any], attempt: int) -> list[str]:
    res = tg("logs", job["id"], "--attempt", str(attempt))
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@needs(None if MEMORY else "no writable v1 memory cgroup", "the memory limit")
def test_a_replica_under_its_limit_runs_held_and_restarts_held(
    tg: TG, tmp_path: Path, node_memory: Path
) -> None:
    spec = _spec(tmp_path, "once-then-hold", str(tmp_path / "failed-once"))
    job = _run(_in_cgroup(tg, node_memory), spec=spec)
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2), job
    for attempt in (0, 1):  # each run in a memory cgroup of its own, held to 64 MiB
        assert f"forked False limit {64 << 20}" in _lines(tg, job, attempt)
    assert "held 24 MiB" in _lines(tg, job, 1)
    assert _children(node_memory) == [], "its memory cgroups outlived it"


@needs(None if MEMORY else "no writable v1 memory cgroup", "the memory limit")
def test_a_forked_replica_is_held_from_its_birth(tg: TG, tmp_path: Path, node_memory: Path) -> None:
    job = _run(_in_cgroup(tg, node_memory), spec=_spec(tmp_path, "hog", preload=True))
    assert (job["state"], job["attempts"]) == ("FAILED", 1), job
    lines = _lines(tg, job, 0)
    assert lines[0].endswith(f"forked True limit {64 << 20}"), lines[:3]
    held = int([x for x in lines if "holding " in x][-1].split("holding ")[1].split()[0])
    assert held < 2 * 64, f"a forked hog held {held} MiB past its resources.memory of 64Mi"
    text = tg("explain", job["id"]).stdout
    assert "held to its resources.memory of 64 MiB (sure)" in text, text
    assert _children(node_memory) == [], "its memory cgroups outlived it"


@needs(None if MEMORY else "no writable v1 memory cgroup", "the memory limit")
def test_a_master_killed_leaves_no_memory_cgroup_behind(
    tg: TG, tmp_path: Path, node_memory: Path
) -> None:
    """Its guardian sweeps the memory cgroups beside the runs' as it sweeps theirs."""
    cli = _in_cgroup(tg, node_memory).start("run", "--quiet", "-f", str(_spec(tmp_path, "sleep")))

    def replica_held() -> bool:
        return any((g / "cgroup.procs").read_text().strip() for g in _children(node_memory))

    wait_for(replica_held, 60, "the replica to join a memory cgroup of its own")
    cli.kill()
    cli.wait(timeout=30)
    wait_for(lambda: _children(node_memory) == [], 60, "its memory cgroups to go with the master")


def test_a_forked_child_joins_every_cgroup_of_its_run_before_it_runs(tmp_path: Path) -> None:
    """The zygote's child writes its pid to each `cgroup.procs` it is given (its run's own,
    its memory one) before the replica's first line: plain files stand in for them here."""

    async def fork() -> tuple[int, list[str], str]:
        zygote = await Zygote.start(["fractions"], distributed=False)
        try:
            r, w = os.pipe()
            files = [tmp_path / "run" / "cgroup.procs", tmp_path / "memory" / "cgroup.procs"]
            for f in files:
                f.parent.mkdir()
                f.touch()
            code = "import sys; print(open(sys.argv[1]).read() + ' ' + open(sys.argv[2]).read())"
            argv = [sys.executable, "-c", code, *map(str, files)]
            pid = await zygote.spawn(argv, dict(os.environ), str(tmp_path), w, [*map(str, files)])
            os.close(w)
            with os.fdopen(r) as out:
                printed = await asyncio.to_thread(out.read)
            return pid, [f.read_text() for f in files], printed
        finally:
            await zygote.close()

    pid, joined, printed = asyncio.run(fork())
    assert joined == [str(pid), str(pid)]
    assert printed.split() == [str(pid), str(pid)]  # there already when its program began


def test_no_memory_controller_is_said_once_and_the_replicas_run_unlimited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = "no memory controller we may use (for the test): resources.memory is not enforced"
    monkeypatch.setattr(MemoryCgroups, "create", lambda jobs, token: why)

    async def run_two() -> tuple[list[ReplicaExited], list[str]]:
        backend = LocalBackend(one_node=True)
        exits: list[ReplicaExited] = []
        backend.bind(lambda ev: exits.append(ev) if isinstance(ev, ReplicaExited) else None)
        argv = (sys.executable, "-c", "print('ran')")
        env = dict(os.environ)
        await backend.start(
            [
                Launch(0, f"worker-{r}", r, 0, argv, env, str(tmp_path), tmp_path / f"{r}.log", 1)
                for r in range(2)
            ]
        )
        await wait_for_async(lambda: len(exits) == 2)
        notes = list(backend.warm_start_notes)
        await backend.close()
        return exits, notes

    exits, notes = asyncio.run(run_two())
    assert [ev.evidence.returncode for ev in exits] == [0, 0]  # a limit of 1 byte: not held
    assert notes.count(why) == 1, notes


async def wait_for_async(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.05)
