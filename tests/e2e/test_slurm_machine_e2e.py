"""The machine read on a Slurm node at a failure (R-EVID-1, issue 38), on the real
3-node cluster (tests/clusters/slurmcluster.py): the task runs under `slurm.node_probe`, which
reads the node where the replica ran and tells the master. A rank that segfaults is read
in the kernel log with its library; a rank SIGKILLed from outside, with no OOM kill
logged, is an external kill."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurmcluster
import yaml
from conftest import TG, wait_for
from slurmcluster import SlurmCluster

from trainguard.classify.readings import Finding, Source, from_json

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster

TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))
KMSG_READABLE = os.access("/dev/kmsg", os.R_OK)  # the hosts share this machine's kernel


@pytest.fixture
def shared(slurm_cluster: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    slurm_cluster.heal()
    folder = slurm_cluster.hosts.shared / request.node.name
    folder.mkdir(parents=True)
    yield folder


def _start(slurm: SlurmCluster, shared: Path, body: str, replicas: int = 1, **env: str) -> Any:
    """A job of `replicas` on as many nodes of a 2-node allocation, each replica `body`."""
    (shared / "replica.py").write_text(body)
    job = {
        "name": "m",
        "backend": "slurm",
        "slurm": {"nodes": replicas, "tasks_per_node": 1},
        "worker_pools": [
            {"replicas": replicas, "command": [sys.executable, str(shared / "replica.py")]}
        ],
    }
    (shared / "job.yaml").write_text(yaml.safe_dump(job))
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), **env}
    argv = [
        "salloc",
        "-N2",
        "--no-kill",
        TRAINGUARD,
        "run",
        "--plain",
        "-f",
        str(shared / "job.yaml"),
    ]
    return slurm.popen(argv, env=env, stdout=-1, stderr=-1, text=True, cwd=shared)


def _first_failure(shared: Path, proc: Any) -> tuple[dict[str, Any], str]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, (
        out[-2000:],
        err[-6000:],
        TG(shared / "home")("explain", TG(shared / "home").json("jobs")[0]["id"]).stdout,
    )
    tg = TG(shared / "home")
    job = tg.json("jobs")[0]["id"]
    failures = tg.json("explain", job)["failures"]
    first = next((f for f in failures if f.get("root_cause")), failures[0])
    shown = tg("explain", job).stdout
    print(shown)
    return first, shown


def test_a_segfault_on_a_node_is_read_in_its_kernel_log(
    slurm_cluster: SlurmCluster, shared: Path
) -> None:
    body = (
        "import ctypes, os, sys\n"
        "if os.environ['TRAINGUARD_ATTEMPT'] != '0':\n    sys.exit(0)\n"
        "print('step 1 loss 0.5', flush=True)\n"
        "ctypes.string_at(0)\n"
    )
    first, shown = _first_failure(shared, _start(slurm_cluster, shared, body))
    readings = from_json(first["machine"])
    assert readings, first  # read on the node, not on the master's host
    assert not any("trainguard-machine:" in line for line in first.get("log_tail") or ()), first
    kernel = [r for r in readings if r.source == Source.KMSG]
    if not KMSG_READABLE:
        assert [r.finding for r in kernel] == [Finding.ABSENT]
        return
    (crash,) = kernel
    assert crash.finding is Finding.SEGFAULT and crash.sure, crash
    assert crash.subject.startswith("libc"), crash
    assert f"a segfault in {crash.subject}" in first["message"], first["message"]
    assert f"kmsg: {crash.value} -> a segfault at address 0" in shown, shown


@pytest.mark.skipif(not KMSG_READABLE, reason="the kernel log is not readable here")
def test_a_rank_sigkilled_from_outside_on_its_node_is_an_external_kill(
    slurm_cluster: SlurmCluster, shared: Path
) -> None:
    pid_file = shared / "pid"
    body = (
        "import os, sys, time\n"
        "if os.environ['TRAINGUARD_ATTEMPT'] != '0':\n    sys.exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "print('step 1 loss 0.5', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = _start(slurm_cluster, shared, body)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 120, "the rank's pid"))
    os.kill(pid, signal.SIGKILL)  # the hosts share this machine's pid namespace
    first, shown = _first_failure(shared, proc)
    readings = from_json(first["machine"])
    origin = next(r for r in readings if r.source == Source.SIGNAL)
    if any(r.finding is Finding.OOM_KILL for r in readings):  # another test's hog meanwhile
        assert origin.finding is Finding.SENT_BY_KERNEL and not origin.sure
        return
    assert (first["failure_class"], first["rule"], first["retryable"]) == (
        "preemption",
        "external-kill",
        True,
    ), shown
    assert origin.finding is Finding.SENT_BY_OTHER, origin
    assert "signal: SIGKILL" in shown and "sent by another process" in shown, shown


def test_a_rank_still_reading_its_node_is_the_root_cause_not_a_stop(
    slurm_cluster: SlurmCluster, shared: Path
) -> None:
    """Rank 1 segfaults; rank 0 sees it at once and fails on the lost peer (a cascade)
    while rank 1's wrapper still reads its node (an nvidia-smi that takes 3 s there): the
    master stops the rest then, and rank 1's exit, with its readings, is still the root
    cause: its wrapper said the program exited (srun waits for it through the stop's
    grace), so the stop is not what ended it."""
    fake = shared / "bin"
    fake.mkdir()
    # Only rank 1's wrapper is slow: rank 0's failure always reaches the master first.
    (fake / "nvidia-smi").write_text('#!/bin/sh\n[ "$RANK" = 1 ] && sleep 3\nexit 9\n')
    (fake / "nvidia-smi").chmod(0o755)
    pid_file = shared / "pid"
    body = (
        "import ctypes, os, sys, time\n"
        "if os.environ['TRAINGUARD_ATTEMPT'] != '0':\n    sys.exit(0)\n"
        "print('step 1 loss 0.5', flush=True)\n"
        "if os.environ['RANK'] == '1':\n"
        f"    open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"    os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "    time.sleep(1)\n"
        "    ctypes.string_at(0)\n"
        f"while not os.path.exists({str(pid_file)!r}):\n    time.sleep(0.01)\n"
        f"peer = int(open({str(pid_file)!r}).read())\n"
        "while os.path.exists(f'/proc/{peer}'):\n    time.sleep(0.01)\n"
        "raise ConnectionResetError('Connection reset by peer')\n"
    )
    path = f"{fake}:{os.environ['PATH']}"
    first, shown = _first_failure(shared, _start(slurm_cluster, shared, body, 2, PATH=path))
    assert first["replica"] == "worker-1", shown
    assert "segfault" in first["message"], shown
    assert any(r.finding is Finding.SEGFAULT for r in from_json(first["machine"])), shown
