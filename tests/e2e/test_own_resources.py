"""The master's machine running out of file descriptors is its own fault (issue 37): the
soft RLIMIT_NOFILE is raised to the hard limit at start; a replica it cannot start for
EMFILE/ENFILE/EAGAIN is an internal error; a node probe it cannot make answers "could not
run", never "lost". (The Slurm backend's part: tests/unit/test_slurm_exits.py; on a real Slurm
cluster: tests/e2e/test_slurm_misreads.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TG

from trainguard.backends.interface import Launch
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.cluster import Answer, Node, Probe, read_probe
from trainguard.classify.classes import ExitEvidence, ExitKind, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.master.runner import raise_fd_limit
from trainguard.policy.decisions import error_code
from trainguard.states import ErrorCode

EMFILE = OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def _launch(tmp_path: Path, replica: str = "worker-0") -> Launch:
    argv = ("srun", "true")
    return Launch(0, replica, 0, 0, argv, {}, str(tmp_path), tmp_path / "w.log")


# -------------------------------------------------------------- the reading of a probe


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOBUFS])
def test_a_probe_this_machine_cannot_make_is_unknown_not_lost(code: int) -> None:
    probe = read_probe(OSError(code, os.strerror(code)))
    assert probe.answer is Answer.UNKNOWN
    assert errno.errorcode[code] in probe.why


def test_a_node_that_refuses_or_says_nothing_is_lost() -> None:
    assert read_probe(None) == Probe(Answer.ALIVE)
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert read_probe(refused).answer is Answer.LOST
    assert read_probe(OSError(errno.EHOSTUNREACH, "No route to host")).answer is Answer.LOST
    assert read_probe(TimeoutError()).answer is Answer.LOST


@contextlib.contextmanager
def _out_of_descriptors() -> Iterator[None]:
    """This process at its soft RLIMIT_NOFILE for real: every new descriptor is EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
    try:
        while True:  # fill the holes below the limit
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_real_emfile_makes_the_probe_unknown() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        node = Node("n0", "127.0.0.1", "IDLE", server.getsockname()[1])

        async def both() -> tuple[Probe, Probe]:
            with _out_of_descriptors():
                starved = await cluster.probe(node, 5.0)
            return starved, await cluster.probe(node, 5.0)

        starved, fed = asyncio.run(both())
    assert starved.answer is Answer.UNKNOWN and "EMFILE" in starved.why, starved
    assert fed.answer is Answer.ALIVE


# -------------------------------------------------------------- a spawn out of descriptors


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EAGAIN])
def test_a_spawn_this_machine_cannot_make_is_internal(tmp_path: Path, code: int) -> None:
    exc = OSError(code, os.strerror(code))
    ev = LocalBackend()._spawn_failed(_launch(tmp_path), exc)
    assert ev.evidence.spawn_errno == code
    c = classify_exit(ev.evidence)
    assert c.kind is ExitKind.SPAWN_ERROR
    assert c.failure_class is FailureClass.INTERNAL and c.retryable
    assert c.rule == "own-resources" and errno.errorcode[code] in c.reason
    assert error_code(c) == ErrorCode.INTERNAL


def test_a_spawn_the_command_itself_cannot_make_is_still_the_users(tmp_path: Path) -> None:
    ev = LocalBackend()._spawn_failed(_launch(tmp_path), FileNotFoundError(errno.ENOENT, "x"))
    c = classify_exit(ev.evidence)
    assert c.failure_class is FailureClass.USER_ERROR and not c.retryable


def test_own_errors_come_before_a_lost_node() -> None:
    ev = ExitEvidence("worker-0", None, spawn_errno=errno.EMFILE, node_lost="n0 is gone")
    assert classify_exit(ev).failure_class is FailureClass.INTERNAL


# -------------------------------------------------------------- the soft limit


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert raise_fd_limit() == (hard, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_a_job_runs_with_the_hard_limit_of_files(tg: TG) -> None:
    """`trainguard run` started with a soft limit of 256 under a hard one of 4,096: the
    master raised it, so its replicas see 4,096 too."""
    lowered = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    show = "import resource; print('nofile', *resource.getrlimit(resource.RLIMIT_NOFILE))"
    res = tg_with_prefix(tg, [sys.executable, "-c", lowered])(
        "run", "--", sys.executable, "-c", show, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "nofile 4096 4096" in res.stdout, res.stdout


def tg_with_prefix(tg: TG, prefix: list[str]) -> TG:
    """The same CLI, each command run through `prefix` (it execs what follows)."""
    other = TG(tg.home, prefix)
    other.env = tg.env
    return other
