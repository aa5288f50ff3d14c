"""The machine read for real at a replica's failure (R-EVID-1): a segfault the kernel logs,
an OOM kill under a limit that is not the replica's own, a SIGKILL from outside, a full
checkpoint disk, and the probes' own limits (an unreadable kernel log, a hung call)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TG, wait_for

from trainguard.backends.machine_probe import (
    bounded,
    gpu_probe,
    kernel_probe,
    monotonic_us,
    probe_exit,
)
from trainguard.classify.readings import Finding, Source, from_json

KMSG_READABLE = os.access("/dev/kmsg", os.R_OK)


def _failures(tg: TG) -> list[dict[str, Any]]:
    job = tg.json("jobs")[0]
    data = tg.json("explain", job["id"])
    return list(data["failures"])


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "replica.py"
    path.write_text(body)
    return path


def _run(tg: TG, script: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return tg("run", "--quiet", "--nproc-per-node", "1", *flags, "--", sys.executable, str(script))


@pytest.mark.slow
def test_a_real_segfault_is_read_in_the_kernel_log_with_its_library(tg: TG, tmp_path: Path) -> None:
    script = _script(
        tmp_path, "import ctypes\nprint('step 1 loss 0.5', flush=True)\nctypes.string_at(0)\n"
    )
    res = _run(tg, script)
    assert res.returncode == 1, res.stderr
    first = _failures(tg)[0]
    readings = from_json(first["machine"])
    kernel = [r for r in readings if r.source == Source.KMSG]
    if not KMSG_READABLE:  # a container without kmsg access records it absent
        assert [r.finding for r in kernel] == [Finding.ABSENT]
        return
    # the segfault's line; under a busy suite the kernel may log more about the pid
    crashes = [r for r in kernel if r.finding is Finding.SEGFAULT]
    assert crashes, kernel
    crash = crashes[0]
    assert crash.sure, kernel
    assert crash.subject.startswith("libc"), crash  # ctypes.string_at(0) dies in memmove/strlen
    assert first["failure_class"] == "transient_exit" and first["retryable"]
    assert f"a segfault in {crash.subject}" in first["message"]
    shown = tg("explain", tg.json("jobs")[0]["id"]).stdout
    assert f"machine      kmsg: {crash.value} -> a segfault at address 0" in shown


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[Path]:
    """A v1 memory cgroup below ours, with a limit of its own (not the replica run's)."""
    own = next(
        (
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        ),
        None,
    )
    root = Path("/sys/fs/cgroup/memory")
    if own is None or not root.is_dir():
        pytest.skip("no cgroup v1 memory controller here")
    folder = root / own.lstrip("/") / f"tg-test-oom-{os.getpid()}"
    folder.mkdir()
    try:
        (folder / "memory.limit_in_bytes").write_text(str(limit))
        yield folder
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                folder.rmdir()
                break
            time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not KMSG_READABLE, reason="the kernel log is not readable here")
def test_an_oom_kill_under_a_limit_not_its_own_is_a_sure_host_oom(tg: TG, tmp_path: Path) -> None:
    """The replica joins a memory cgroup with a 48 MiB limit and outgrows it: the kernel
    kills it. No counter trainguard reads rose (a v1 cgroup counts its own kills), so only
    the kernel log tells; without it this SIGKILL reads as a kill from outside, retried."""
    with _memory_cgroup(48 << 20) as cg:
        body = (
            "import os\n"
            f"open({str(cg / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
            "print('step 1 loss 0.5', flush=True)\n"
            "hog = []\n"
            "while True:\n    hog.append(bytearray(4 << 20))\n"
        )
        res = _run(tg, _script(tmp_path, body))
    assert res.returncode == 1, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 1)
    (first,) = _failures(tg)
    assert (first["failure_class"], first["rule"], first["retryable"]) == (
        "host_oom",
        "host-oom-kernel",
        False,
    )
    assert first["confidence"] == pytest.approx(0.99)
    readings = from_json(first["machine"])
    assert any(r.source == Source.KMSG and r.finding is Finding.OOM_KILL for r in readings)
    assert "ran out of memory" in job["error_message"]


@pytest.mark.slow
def test_a_sigkill_from_outside_with_no_oom_is_an_external_kill(tg: TG, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    body = (
        "import os, sys, time\n"
        "if os.environ['TRAINGUARD_ATTEMPT'] != '0':\n    sys.exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "print('step 1 loss 0.5', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "1",
        "--",
        sys.executable,
        str(_script(tmp_path, body)),
    )
    pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the replica's pid")
    )
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (first,) = _failures(tg)
    readings = from_json(first["machine"])
    origin = next(r for r in readings if r.source == Source.SIGNAL)
    if any(r.finding is Finding.OOM_KILL for r in readings):
        # another test's memory hog on this shared machine: the kernel was killing for
        # memory meanwhile, so no kill is read as someone else's
        assert (origin.finding, origin.sure) == (Finding.SENT_BY_KERNEL, False)
        return
    assert (first["failure_class"], first["rule"], first["retryable"]) == (
        "preemption",
        "external-kill" if KMSG_READABLE else "external-SIGKILL",
        True,
    )
    if KMSG_READABLE:
        assert first["confidence"] >= 0.6  # as sure as the log's external kill: retried
        assert origin.finding is Finding.SENT_BY_OTHER and not origin.sure
        assert origin.shown().startswith(
            "signal: SIGKILL (exit status 137) -> sent by another process"
        )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (we are root here; skipped where mounting is not allowed)."""
    where = tmp_path / "ckpt"
    where.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_full_checkpoint_disk_stops_the_job_and_names_the_path(
    tg: TG, tmp_path: Path, small_disk: Path
) -> None:
    body = (
        "import os\n"
        "print('step 1 loss 0.5', flush=True)\n"
        "with open(os.path.join(os.environ['TRAINGUARD_CHECKPOINT_DIR'], 'blob'), 'wb') as f:\n"
        "    while True:\n        f.write(b'x' * 65536)\n        f.flush()\n"
    )
    script = _script(tmp_path, body)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "fills-disk",
                "worker_pools": [
                    {"role": "worker", "replicas": 1, "command": [sys.executable, str(script)]}
                ],
                "checkpoint": {"storage": str(small_disk)},
                "fault_tolerance": {"retry_uncertain": True},
            }
        )
    )
    res = tg("run", "--quiet", "-f", str(spec))
    assert res.returncode == 1, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 1)  # not retried blindly
    assert f"Free space on {small_disk}" in job["error_message"]
    (first,) = _failures(tg)
    assert (first["rule"], first["retryable"]) == ("disk-full", False)
    full = [r for r in from_json(first["machine"]) if r.finding is Finding.DISK_FULL]
    assert {r.source for r in full} == {Source.DISK, Source.TAIL}
    assert any(r.subject == str(small_disk) for r in full)


def test_an_unreadable_kernel_log_is_recorded_absent(tmp_path: Path) -> None:
    for path in (tmp_path / "no-kmsg", tmp_path):  # missing; a folder (EISDIR on read)
        (r,) = kernel_probe({os.getpid()}, monotonic_us(), path=path)
        assert (r.source, r.finding, r.sure) == (Source.KMSG, Finding.ABSENT, False)
        assert r.shown().endswith("-> absent (uncertain)")


def test_the_probes_run_together_and_say_what_they_could_not_read(tmp_path: Path) -> None:
    readings = asyncio.run(
        probe_exit(
            pids={os.getpid()},
            since_us=monotonic_us(),
            paths=[str(tmp_path), str(tmp_path / "gone")],
            tail=("OSError: [Errno 5] Input/output error",),
            kmsg=tmp_path / "no-kmsg",
            gpus=False,  # the fast tier starts no process (nvidia-smi where there is one)
        )
    )
    by = {(r.source, r.subject): r for r in readings}
    assert by[(Source.DISK, str(tmp_path))].finding is Finding.NOTHING
    assert by[(Source.DISK, str(tmp_path / "gone"))].finding is Finding.ABSENT
    assert by[(Source.KMSG, "")].finding is Finding.ABSENT
    assert any(r.finding is Finding.IO_ERROR for r in readings)


def test_no_nvidia_smi_is_an_absent_gpu_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    (r,) = gpu_probe()
    assert (r.source, r.finding, r.value) == (
        Source.GPU,
        Finding.ABSENT,
        "no nvidia-smi on this machine",
    )


def test_a_call_that_hangs_is_abandoned_at_its_limit() -> None:
    """A statvfs on a hung NFS mount never returns: the probe gives up, the thread is a
    daemon left behind, nothing waits for it."""

    def hang() -> int:
        time.sleep(30)
        return 0

    async def go() -> tuple[object, float]:
        start = time.monotonic()
        got = await bounded(hang, 0.2)
        return got, time.monotonic() - start

    got, took = asyncio.run(go())
    assert got is None and took < 10
