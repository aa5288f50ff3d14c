"""The machine read on a Ray node at a replica's failure (R-EVID-1), on a real 3-node Ray
cluster (tests/clusters/raycluster.py): the replica's host actor probes its own node (kernel log,
cgroup counters, paths, GPUs) and the readings reach `explain` as locally
(tests/e2e/test_machine_e2e.py): a segfault names its library, a SIGKILL from outside reads
as another process's kill."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TG, child, wait_for
from raycluster import DRIVER_ENV, RayCluster
from test_ray import spec
from test_ray_escapees import _exit_of

from trainguard.backends.ray.host import ReplicaHost
from trainguard.classify.readings import Finding, Source, from_json

pytestmark = [pytest.mark.slow, pytest.mark.ray]

KMSG_READABLE = os.access("/dev/kmsg", os.R_OK)
ONCE = "import os, sys\nif os.environ['TRAINGUARD_ATTEMPT'] != '0':\n    sys.exit(0)\n"


@pytest.fixture
def rtg(tg: TG, ray_cluster: RayCluster) -> TG:
    ray_cluster.heal()
    tg.env.update(DRIVER_ENV)
    return tg


def _first_failure(tg: TG) -> dict[str, Any]:
    job = tg.json("jobs")[0]
    return dict(tg.json("explain", job["id"])["failures"][0])


def test_a_segfault_on_a_ray_node_is_read_in_that_nodes_kernel_log(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(ONCE + "import ctypes\nprint('step 1 loss 0.5', flush=True)\n")
    script.write_text(script.read_text() + "ctypes.string_at(0)\n")
    job = spec(tmp_path, ray_cluster, 1, [sys.executable, str(script)], name="crash")
    res = rtg("run", "--quiet", "-f", job, timeout=180)
    assert res.returncode == 0, res.stderr  # a segfault is retried; the second run ends well
    first = _first_failure(rtg)
    readings = from_json(first["machine"])
    kernel = [r for r in readings if r.source == Source.KMSG]
    assert any(r.source == Source.DISK for r in readings), readings  # the node read its paths
    if not KMSG_READABLE:
        assert [r.finding for r in kernel] == [Finding.ABSENT]
        return
    (crash,) = kernel
    assert crash.finding is Finding.SEGFAULT and crash.sure
    assert crash.subject.startswith("libc"), crash
    assert f"a segfault in {crash.subject}" in first["message"]
    shown = rtg("explain", rtg.json("jobs")[0]["id"]).stdout
    assert f"machine      kmsg: {crash.value} -> a segfault at address 0" in shown


def test_a_sigkill_from_outside_on_a_ray_node_is_read_as_an_external_kill(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    script = tmp_path / "victim.py"
    script.write_text(
        ONCE + "import time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "print('step 1 loss 0.5', flush=True)\ntime.sleep(120)\n"
    )
    job = spec(tmp_path, ray_cluster, 1, [sys.executable, str(script)], name="victim")
    proc = rtg.start("run", "--quiet", "-f", job)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="its pid"))
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    first = _first_failure(rtg)
    readings = from_json(first["machine"])
    origin = next(r for r in readings if r.source == Source.SIGNAL)
    if any(r.finding is Finding.OOM_KILL for r in readings):  # another test's memory hog
        assert (origin.finding, origin.sure) == (Finding.SENT_BY_KERNEL, False)
        return
    assert any(r.source == Source.CGROUP for r in readings), readings
    expected_rule = "external-kill" if KMSG_READABLE else "external-SIGKILL"
    assert (first["failure_class"], first["rule"]) == ("preemption", expected_rule)
    if KMSG_READABLE:
        assert origin.finding is Finding.SENT_BY_OTHER
        shown = rtg("explain", rtg.json("jobs")[0]["id"]).stdout
        assert "machine      signal: SIGKILL (exit status 137) -> sent by another" in shown


def test_the_host_reads_its_machine_at_a_failure_and_not_at_a_stop(tmp_path: Path) -> None:
    """The host actor's part alone (an ordinary object here): the failed run's cgroup
    counter and the job's paths as the node sees them; nothing for a stopped one."""
    host = ReplicaHost()
    try:
        assert "pid" in host.start(child("*:exit:3"), {}, "/", paths=[str(tmp_path)])
        assert _exit_of(host) == 3
        readings = from_json(host.machine(30))
        sources = [r.source for r in readings]
        assert sources[0] == Source.CGROUP and Source.KMSG in sources, readings
        (disk,) = [r for r in readings if r.source == Source.DISK]
        assert disk.subject == str(tmp_path) and disk.finding is Finding.NOTHING
        assert "pid" in host.start(child("*:print:up", "*:forever"), {}, "/")
        assert host.machine(0) is None  # a new run: the last one's readings are gone
        host.read(5)
        assert host.signal(signal.SIGTERM, stop=True)
        assert _exit_of(host) == -signal.SIGTERM
        assert host.machine(0) is None
    finally:
        host.close()
