"""A real mpirun with mpi4py ranks, read as trainguard reads it.

These tests need `mpirun` (Debian's openmpi-bin) and mpi4py in the venv; both come from
scripts/mpi_deps.sh. Where they are missing they skip and say why, except under CI
(CI=true), where they fail instead, so a missing install step can't pass green.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive, needs, wait_for

from trainguard.backends.mpi.launch import (
    ALLOW_ROOT_ENV,
    TagDemux,
    exit_on_error,
    find_ranks,
    hostfile_text,
    mpirun_argv,
    parse_rank_failure,
)

EXAMPLE = ROOT / "examples" / "mpi_allreduce.py"


def _mpi_missing() -> str | None:
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (bash scripts/mpi_deps.sh installs Open MPI)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed in this Python (bash scripts/mpi_deps.sh installs it)"
    return None


requires_mpi = needs(_mpi_missing(), "the real-MPI tests")


class MpiRun:
    """mpirun started as trainguard will start it, its two pipes read through TagDemux."""

    def __init__(self, tmp: Path, np: int, command: list[str]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        hostfile = tmp / "hostfile"
        hostfile.write_text(hostfile_text([("127.0.0.1", np)]))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if os.geteuid() == 0:
            env.update(ALLOW_ROOT_ENV)
        argv = mpirun_argv("mpirun", hostfile, np, command, ["PYTHONUNBUFFERED"])
        self.lines: list[tuple[str, int | None, str]] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(name, pipe.fileno()), daemon=True)
            for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: str, fd: int) -> None:
        d = TagDemux()
        while chunk := os.read(fd, 61):  # small reads: lines and tags get cut
            self._keep(stream, d.feed(chunk))
        self._keep(stream, d.close())

    def _keep(self, stream: str, lines: list[tuple[int | None, str]]) -> None:
        with self._lock:
            self.lines += [(stream, rank, text) for rank, text in lines]

    def of(self, rank: int | None, stream: str | None = None) -> list[str]:
        with self._lock:
            return [t for s, r, t in self.lines if r == rank and stream in (None, s)]

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for t in self._readers:
            t.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return rc


def allreduce(*args: str) -> list[str]:
    return exit_on_error([sys.executable, str(EXAMPLE), *args])


def last_step(lines: list[str]) -> int:
    steps = [int(t.split()[1]) for t in lines if t.startswith("step ")]
    return max(steps, default=0)


@pytest.mark.slow
@requires_mpi
def test_a_killed_rank_is_found_named_and_resumed_to_the_same_state(tmp_path: Path) -> None:
    args = ["--steps", "40", "--ckpt-every", "5"]
    out_a = tmp_path / "a.json"
    command = allreduce(*args, "--ckpt-dir", str(tmp_path / "ck-a"), "--out", str(out_a))
    unbroken = MpiRun(tmp_path / "a", 2, command)
    assert unbroken.wait(30) == 0, unbroken.lines
    expected = json.loads(out_a.read_text())

    ck = str(tmp_path / "ck-b")
    run = MpiRun(tmp_path / "b", 2, allreduce(*args, "--ckpt-dir", ck, "--step-time", "0.1"))
    wait_for(lambda: last_step(run.of(1)) >= 12, 30, "rank 1 at step 12")
    ranks = find_ranks(run.proc.pid)
    assert sorted(ranks) == [0, 1], ranks
    for pid in ranks.values():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert str(EXAMPLE).encode() in cmdline
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    assert run.wait(30) == 128 + signal.SIGKILL
    print(f"mpirun exited {time.monotonic() - t0:.2f}s after its rank 1 was SIGKILLed")
    assert not alive(ranks[0]) and not alive(ranks[1])

    failure = parse_rank_failure(run.of(None, "err"))
    assert failure is not None, run.of(None)
    assert (failure.rank, failure.kind, failure.signal) == (1, "signal", 9)
    assert failure.returncode == -9
    for rank in (0, 1):
        steps = [t for t in run.of(rank) if t.startswith("step ")]
        assert len(steps) >= 12 and all(f" rank {rank} " in t for t in steps)
    assert not any(t.startswith("step ") for t in run.of(None))
    assert run.of(None, "out") == []

    out = tmp_path / "c.json"
    resumed = MpiRun(tmp_path / "c", 2, allreduce(*args, "--ckpt-dir", ck, "--out", str(out)))
    assert resumed.wait(30) == 0, resumed.lines
    assert any(t.startswith("rank 1: resumed from step") for t in resumed.of(1))
    assert json.loads(out.read_text()) == expected


@pytest.mark.slow
@requires_mpi
def test_a_python_exception_in_a_rank_ends_the_job_and_mpirun_names_the_rank(
    tmp_path: Path,
) -> None:
    command = allreduce("--steps", "1000", "--ckpt-dir", str(tmp_path / "ck"), "--bug-at-step", "5")
    run = MpiRun(tmp_path, 2, command)
    t0 = time.monotonic()
    assert run.wait(30) == 1
    assert time.monotonic() - t0 < 20  # not a hang: a rank in MPI_Finalize would never end
    failure = parse_rank_failure(run.of(None))
    assert failure is not None, run.of(None)
    assert (failure.rank, failure.kind, failure.exit_code) == (1, "exit", 1)
    assert "KeyError: 'lr'" in run.of(1, "err")
    assert not any("KeyError" in t for t in run.of(0))
