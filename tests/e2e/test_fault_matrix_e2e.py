"""The end-to-end fault matrix (issue 38): one real fault per row, our own tiny job
(tests/fixtures/fault_matrix/job.py) under the real CLI, master and local backend, with the
default policy. Each row asserts the final state, the number of attempts, and the evidence
the verdict used, as `trainguard explain` shows it. Other rows live beside their features
(the 503 outage, an external SIGKILL, a full disk, a network cut, a host failing 3 jobs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG, needs

from trainguard.backends.local.cgroups import hierarchies

pytestmark = pytest.mark.slow  # every row runs a real job

FIXTURES = ROOT / "tests" / "fixtures" / "fault_matrix"
JOB = str(FIXTURES / "job.py")


def _dice() -> Callable[[int, int], tuple[bool, int]]:
    """The random row's own dice (job.py's `draw`), to say what to expect of a seed."""
    spec = importlib.util.spec_from_file_location("fault_matrix_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    draw: Callable[[int, int], tuple[bool, int]] = module.draw
    return draw


def _run(tg: TG, *job: str, spec: Path | None = None, timeout: float = 120) -> dict[str, Any]:
    """Run the job to its end; its status."""
    head = ["-f", str(spec)] if spec else ["--", sys.executable, JOB, *job]
    res = tg("run", "--quiet", *head, timeout=timeout)
    assert "Traceback" not in res.stderr.split("last lines of")[0], res.stderr  # none of ours
    return tg.only_job()


def _roots(tg: TG, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The root-cause failures `explain --json` gives, in order."""
    return [f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"]]


def _explained(tg: TG, job: dict[str, Any]) -> str:
    res = tg("explain", job["id"])
    assert res.returncode == 0, res.stderr
    return res.stdout


# ---------------------------------------------------------------- memory


def _memory_hierarchy() -> Path | None:
    found = [h for h in hierarchies() if h.controller == "memory"]
    return found[0].home if found and os.access(found[0].home, os.W_OK) else None


MEMORY = _memory_hierarchy()


@pytest.fixture
def node_memory(tmp_path: Path) -> Iterator[Path]:
    """A v1 memory cgroup of 256 MiB that the whole job runs in (the master too): the
    node's own limit, so a hog never reaches the machine's OOM killer."""
    assert MEMORY is not None
    group = MEMORY / f"tg-fault-matrix-{os.getpid()}-{tmp_path.name}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 << 20))
        memsw = group / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no swapping out of it either
            memsw.write_text(str(256 << 20))
        yield group
    finally:
        _empty_then_remove(group)


def _empty_then_remove(group: Path) -> None:
    """Remove `group` once its processes have ended: a killed master's guardian may still be
    on its way out when the test ends. One that is still there after 30 s outlived its job:
    it is killed (so the machine stays clean) and the test fails, naming it."""

    def procs() -> list[int]:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]

    deadline = time.monotonic() + 30
    while procs() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = procs()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while procs():
        time.sleep(0.05)
    group.rmdir()
    assert not left, f"processes outlived their job in {group.name}: {left}"


def _in_cgroup(tg: TG, group: Path) -> TG:
    """`tg`, whose every command joins `group` first (so the job's processes are born in it)."""
    script = 'echo $$ > "$0" && exec "$@"'
    return TG(tg.home, ["sh", "-c", script, str(group / "cgroup.procs")])


def _hog_spec(tmp_path: Path, memory: str | None = "64Mi") -> Path:
    spec = tmp_path / "hog.yaml"
    spec.write_text(
        "name: hog\n"
        "worker_pools:\n"
        "  - role: worker\n"
        "    replicas: 1\n"
        f"    command: [{sys.executable}, {JOB}, hog]\n"
        + (f"    resources: {{memory: {memory}}}\n" if memory else "")
    )
    return spec


def _held_mib(tg: TG, job: dict[str, Any]) -> int:
    """The memory the hog said it held last before it was killed."""
    lines = tg("logs", job["id"], "--attempt", "0").stdout.splitlines()
    return int([line for line in lines if line.startswith("holding ")][-1].split()[1])


@needs(None if MEMORY else "no writable v1 memory cgroup", "the memory rows")
def test_a_memory_hog_is_stopped_at_its_own_resources_memory_a_sure_host_oom(
    tg: TG, tmp_path: Path, node_memory: Path
) -> None:
    """Held to its pool's 64Mi (well below its node's 256 MiB), read from its own cgroup."""
    job = _run(_in_cgroup(tg, node_memory), spec=_hog_spec(tmp_path))
    assert (job["state"], job["attempts"]) == ("FAILED", 1), job
    assert job["error_message"].startswith("The replica worker-0 ran out of memory")
    assert _held_mib(tg, job) < 2 * 64, "killed past twice its resources.memory of 64Mi"
    (oom,) = _roots(tg, job)
    assert (oom["failure_class"], oom["signal"]) == ("host_oom", "SIGKILL")
    assert oom["rule"].startswith("host-oom-") and oom["confidence"] >= 0.99  # sure
    text = _explained(tg, job)
    assert "confidence   0.99, phase" in text
    # the proof: the run's own cgroup counted the kill, at the limit it was held to
    assert "oom_kill 1" in text and "held to its resources.memory of 64 MiB (sure)" in text
    assert _children(node_memory) == [], "its memory cgroups outlived it"


@needs(None if MEMORY else "no writable v1 memory cgroup", "the memory rows")
def test_a_memory_hog_with_no_limit_of_its_own_is_a_host_oom_at_its_nodes(
    tg: TG, tmp_path: Path, node_memory: Path
) -> None:
    """No resources.memory: it grows to its node's 256 MiB, and the kill is still read as
    a sure host OOM (the kernel's line naming its pid), though not from its own cgroup."""
    job = _run(_in_cgroup(tg, node_memory), spec=_hog_spec(tmp_path, memory=None))
    assert (job["state"], job["attempts"]) == ("FAILED", 1), job
    assert _held_mib(tg, job) >= 128, "held below its node's limit with none of its own"
    (oom,) = _roots(tg, job)
    assert (oom["failure_class"], oom["signal"]) == ("host_oom", "SIGKILL")
    assert oom["rule"].startswith("host-oom-") and oom["confidence"] >= 0.99  # sure
    text = _explained(tg, job)
    assert "held to its resources.memory" not in text
    assert any(s in text for s in ("host-oom-cgroup", "oom_kill", "Killed process")), text


def _children(group: Path) -> list[Path]:
    """The cgroups left under `group` (its run cgroups, once the job ended: none)."""
    while group.exists():
        try:
            return [p for p in group.rglob("*") if p.is_dir()]
        except FileNotFoundError:
            continue  # one was removed while it was listed: list again
    return []


# ---------------------------------------------------------------- start-up


def test_a_port_taken_at_start_is_a_config_error_stopped_with_its_proof(tg: TG) -> None:
    with socket.socket() as held:  # the test holds the port the replica wants
        held.bind(("127.0.0.1", 0))
        held.listen()
        job = _run(tg, "bind", str(held.getsockname()[1]))
    assert (job["state"], job["attempts"]) == ("FAILED", 1), job
    (f,) = _roots(tg, job)
    proof = "OSError: [Errno 98] Address already in use"
    assert (f["failure_class"], f["rule"], f["matched_line"]) == (
        "user_error",
        "port-in-use",
        proof,
    )
    assert f["decision"].startswith("FailJob") and "port-in-use" in f["decision"]
    assert proof in job["error_message"]
    assert f"matched line {proof}" in _explained(tg, job)


def test_a_missing_module_is_stopped_at_the_first_attempt(tg: TG) -> None:
    job = _run(tg, "import")
    assert (job["state"], job["attempts"]) == ("FAILED", 1), job
    (f,) = _roots(tg, job)
    proof = "ModuleNotFoundError: No module named 'nonexistent_mod_xyz'"
    assert (f["failure_class"], f["rule"], f["matched_line"]) == (
        "user_error",
        "python-import",
        proof,
    )
    assert f["decision"].startswith("FailJob")
    assert proof in job["error_message"]
    assert f"matched line {proof}" in _explained(tg, job)


# ---------------------------------------------------------------- segfaults


def test_a_deterministic_segfault_at_step_5_ends_after_2_attempts(tg: TG) -> None:
    job = _run(tg, "segv-at", "5")
    assert (job["state"], job["attempts"], job["restarts"]) == ("FAILED", 2, 1), job
    first, second = _roots(tg, job)
    for f in (first, second):
        assert (f["failure_class"], f["signal"], f["exit_code"], f["step"]) == (
            "transient_exit",
            "SIGSEGV",
            139,
            5,
        )
    assert first["fingerprint"] == second["fingerprint"]
    assert first["decision"].startswith("RestartJob")
    assert "the same error at step 5 in attempts 0 and 1: not transient" in second["decision"]
    assert "at step      5" in _explained(tg, job)


SEED = 5  # attempt 0 crashes at step 4, attempt 1 does not


def test_a_segfault_one_time_in_three_is_retried_and_succeeds(tg: TG) -> None:
    draw = _dice()
    dice = [draw(SEED, attempt) for attempt in range(3)]
    assert dice[:2] == [(True, 4), (False, 4)]  # the seed still says what it did
    job = _run(tg, "segv-random", str(SEED))
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1), job
    (f,) = _roots(tg, job)
    assert (f["attempt"], f["failure_class"], f["signal"], f["step"]) == (
        0,
        "transient_exit",
        "SIGSEGV",
        4,
    )
    assert f["decision"].startswith("RestartJob") and "is retryable" in f["decision"]
