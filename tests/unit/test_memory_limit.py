"""A run held to its pool's `resources.memory` (backends.local.memory_limit): the files a
limit is written to, where the limit lives (v2 on the run, v1 on the run, a v1 cgroup
beside it) and what is said where it cannot be, on fake cgroup trees in tmp. The real
kernel's kill is `test_memory_limit_e2e` and the fault matrix's memory rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from trainguard.backends.local import oom, tracking
from trainguard.backends.local.cgroups import Hierarchy, JobCgroups, RunCgroup
from trainguard.backends.local.memory_limit import MemoryCgroups, limit_writes, write_limit
from trainguard.classify.readings import Finding
from trainguard.frameworks import preset
from trainguard.frameworks.replica_plan import plan_replicas
from trainguard.master.launch import LaunchBuilder
from trainguard.spec.models import validate_spec

MIB64 = 64 << 20


def test_v2_writes_the_limit_then_no_swap_then_the_group_kill() -> None:
    present = ["memory.max", "memory.swap.max", "memory.oom.group"]
    assert limit_writes(MIB64, True, present) == [
        ("memory.max", str(MIB64)),
        ("memory.swap.max", "0"),
        ("memory.oom.group", "1"),
    ]
    assert limit_writes(MIB64, True, ["memory.max"]) == [("memory.max", str(MIB64))]  # no swap


def test_v1_writes_the_limit_before_memsw_which_may_never_be_below_it() -> None:
    both = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
    assert limit_writes(MIB64, False, both) == [
        ("memory.limit_in_bytes", str(MIB64)),
        ("memory.memsw.limit_in_bytes", str(MIB64)),
    ]
    assert limit_writes(MIB64, False, both[1:]) == [("memory.limit_in_bytes", str(MIB64))]


def test_no_limit_file_or_no_positive_size_is_refused() -> None:
    with pytest.raises(FileNotFoundError, match=r"no memory\.limit_in_bytes"):
        limit_writes(MIB64, False, ["memory.memsw.limit_in_bytes"])
    with pytest.raises(ValueError, match="must be positive, got 0"):
        limit_writes(0, True, ["memory.max"])


def _files(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("max\n")
    return folder


def test_write_limit_fills_a_fake_cgroup_or_names_what_it_lacks(tmp_path: Path) -> None:
    v1 = _files(tmp_path / "v1", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    write_limit(v1, MIB64, v2=False)
    assert (v1 / "memory.memsw.limit_in_bytes").read_text() == str(MIB64)
    with pytest.raises(OSError, match=f"{tmp_path / 'bare'}: no memory.max"):
        write_limit(_files(tmp_path / "bare"), MIB64, v2=True)


def _jobs(mount: Path, v2: bool, controller: str = "") -> JobCgroups:
    """A job's run-cgroup folder on a fake hierarchy (a kernel's probe would not rmdir
    with files in it: made as `JobCgroups.create` makes it once its probe passed)."""
    h = Hierarchy(_files(mount, "cgroup.procs"), "/", v2=v2, controller=controller)
    folder = h.home / f"trainguard-{'f' * 12}"
    folder.mkdir()
    return JobCgroups(folder, h)


def test_v2_with_its_memory_controller_holds_the_run_itself(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path / "v2", v2=True)
    (jobs.folder / "cgroup.controllers").write_text("cpu memory pids\n")
    memory = MemoryCgroups.create(jobs, "f" * 16, among=[])
    assert isinstance(memory, MemoryCgroups) and memory.folder is None
    assert (jobs.folder / "cgroup.subtree_control").read_text() == "+memory"
    run = jobs.new_run()
    memory.attach(run, MIB64)
    assert run.companions == [] and run.procs_files == (run.procs_file,)
    _files(run.path, "memory.max", "memory.swap.max")  # what the kernel makes
    assert run.hold() is None and run.hold() is None  # once
    assert (run.path / "memory.max").read_text() == str(MIB64)
    assert (run.path / "memory.swap.max").read_text() == "0"


def test_v2_without_it_takes_a_v1_memory_cgroup_beside_each_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _jobs(tmp_path / "v2", v2=True)
    (jobs.folder / "cgroup.controllers").write_text("cpu pids\n")
    beside_jobs = _jobs(tmp_path / "memory", v2=False, controller="memory")
    made: list[list[Hierarchy]] = []

    def create(token: str, among: list[Hierarchy]) -> JobCgroups:
        made.append(list(among))
        return beside_jobs

    monkeypatch.setattr(JobCgroups, "create", create)
    v1 = Hierarchy(tmp_path / "memory", "/", False, "memory")
    cpu = Hierarchy(tmp_path / "cpu", "/", False, "cpu")
    memory = MemoryCgroups.create(jobs, "f" * 16, among=[cpu, v1])
    assert made == [[v1]]  # in v1's memory hierarchy alone
    assert isinstance(memory, MemoryCgroups)
    assert memory.folder == tmp_path / "memory" / f"trainguard-{'f' * 12}"
    run = jobs.new_run()
    memory.attach(run, MIB64)
    (beside,) = run.companions
    assert beside.path == memory.folder / "run-1"
    assert run.procs_files == (run.procs_file, beside.procs_file)  # a forked child joins both
    assert run.add(4242)
    assert (beside.path / "cgroup.procs").read_text() == "4242"
    assert run.hold() == f"{beside.path}: no memory.limit_in_bytes"  # the kernel made none
    assert run.hold() is None  # tried once: the run goes on unlimited, and is said so
    run.pending_limit = None
    memory.attach(run, MIB64)
    _files(run.companions[-1].path, "memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    assert run.hold() is None
    assert (run.companions[-1].path / "memory.limit_in_bytes").read_text() == str(MIB64)


def test_a_v1_memory_run_cgroup_is_held_itself(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path / "memory", v2=False, controller="memory")
    memory = MemoryCgroups.create(jobs, "f" * 16, among=[])
    assert isinstance(memory, MemoryCgroups) and memory.folder is None
    run = jobs.new_run()
    memory.attach(run, MIB64)
    _files(run.path, "memory.limit_in_bytes")
    assert run.hold() is None
    assert (run.path / "memory.limit_in_bytes").read_text() == str(MIB64)


def test_no_memory_controller_anywhere_is_said_not_raised(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path / "pids", v2=False, controller="pids")
    why = MemoryCgroups.create(jobs, "f" * 16, among=[])
    assert isinstance(why, str) and why.endswith("a replica's resources.memory is not enforced")
    assert "no memory controller we may use" in why
    assert "not enforced" in str(MemoryCgroups.create(None, "f" * 16))


def test_tracking_says_once_per_job_that_memory_is_not_enforced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(JobCgroups, "create", lambda token: "switched off for the test")
    said: list[str] = []
    t = tracking.Tracking("t" * 32, "TOKEN", said.append)
    said.clear()  # (the tree's own note is the backend's to say)
    for _ in range(3):
        run = t.new_run(MIB64)
        assert run.procs_files == () and run.hold() is None  # runs, unlimited
    assert said == ["no cgroup of ours: a replica's resources.memory is not enforced"]
    for _ in range(2):  # a limit that fails at each run's hold: said once too
        t.say_once("a replica's resources.memory is not enforced: EBUSY")
    assert len(said) == 2
    assert t.new_run(None).hold() is None


def _with_counter(path: Path, limit: str) -> Any:
    path.mkdir()
    (path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (path / "memory.limit_in_bytes").write_text(limit)
    return cast(Any, SimpleNamespace(processes=RunCgroup(path, v2=False), oom_before=0))


def test_the_oom_reading_names_the_limit_it_was_held_to(tmp_path: Path) -> None:
    r = oom.memory_reading(_with_counter(tmp_path / "held", str(MIB64)))
    assert (r.finding, r.sure) == (Finding.OOM_KILL, True)
    assert r.value.endswith(f"oom_kill 1, oom_group_kill 0; limit {MIB64} bytes")
    assert r.reading.endswith("own cgroup, held to its resources.memory of 64 MiB")
    unlimited = oom.memory_reading(_with_counter(tmp_path / "free", "9223372036854771712"))
    assert "limit" not in unlimited.value and "held" not in unlimited.reading


def test_the_oom_counter_of_a_run_is_its_memory_companions(tmp_path: Path) -> None:
    run = RunCgroup(_files(tmp_path / "v2run", "cgroup.procs"), v2=True)
    beside = _with_counter(tmp_path / "memrun", str(MIB64)).processes
    run.companions.append(beside)
    assert run.memory_path == beside.path and run.oom_kills() == 1
    assert oom.counter_of(run) == beside.path / "memory.oom_control"


def test_each_launch_carries_its_pools_memory_in_bytes(tmp_path: Path) -> None:
    spec = validate_spec(
        {
            "name": "x",
            "worker_pools": [
                {"role": "a", "command": ["t"], "resources": {"memory": "64Mi"}},
                {"role": "b", "command": ["t"], "resources": {"memory": "1.5G"}},
                {"role": "c", "command": ["t"]},
            ],
        }
    )
    plans = tuple(plan_replicas(spec))
    builder = LaunchBuilder("job-1", preset("generic"), plans, tmp_path, "/w", 3, spec)
    built = [builder.build(p, 0, 0, ("127.0.0.1", 1), {}, None) for p in plans]
    assert [la.memory_bytes for la in built] == [MIB64, 1_500_000_000, None]


def test_a_run_removes_its_memory_companion_with_itself(tmp_path: Path) -> None:
    run = RunCgroup(tmp_path / "v2" / "run-1", v2=True)
    beside = RunCgroup(tmp_path / "memory" / "run-1", v2=False)
    run.path.mkdir(parents=True)
    beside.path.mkdir(parents=True)
    run.companions.append(beside)
    run.remove()  # at each exit, stop and restart of the run
    assert not run.path.exists() and not beside.path.exists()
