"""The Ray backend's parts that need no cluster: the node-side host, bundles, node loss."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import alive, child

from trainguard.backends.ray.host import ReplicaHost
from trainguard.backends.ray.node_zygote import NodeZygote
from trainguard.backends.ray.placement import bundle_of
from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.policy.actions import RestartJob
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.spec.models import FaultTolerance, Resources
from trainguard.storage.checkpoints import write_marker
from trainguard.storage.env import ENV_CHECKPOINT_DIR, ENV_FAULTHANDLER_FILE, ENV_STORAGE_CHECK


def _drain(host: ReplicaHost, deadline_s: float = 20) -> tuple[bytes, int]:
    out = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        data, code = host.read(0.2)
        out += data
        if code is not None:
            return out, code
    raise AssertionError(f"no exit within {deadline_s}s; output so far {out!r}")


@pytest.mark.slow
def test_the_host_runs_a_command_and_hands_over_output_and_exit_code(tmp_path: object) -> None:
    host = ReplicaHost()
    info = host.start(child("*:print:one", "*:print:two", "*:exit:3"), {"RANK": "0"}, "/")
    assert "pid" in info
    out, code = _drain(host)
    host.close()
    assert out.decode().splitlines() == ["one", "two"] and code == 3


@pytest.mark.slow
def test_a_signal_reaches_the_replicas_group_and_the_exit_says_so() -> None:
    host = ReplicaHost()
    info = host.start(child("*:print:up", "*:forever"), {}, "/")
    data, _ = host.read(5)
    assert data == b"up\n"
    assert host.signal(signal.SIGTERM)
    _, code = _drain(host)
    host.close()
    assert code == -signal.SIGTERM
    assert not alive(int(info["pid"]))


@pytest.mark.slow
def test_spawn_errors_name_what_is_missing_on_the_node() -> None:
    host = ReplicaHost()
    assert "command not found" in host.start(["/nope/python"], {}, "/")["error"]
    assert "working directory not found" in host.start(["true"], {}, "/nope/dir")["error"]


def test_bundles_use_rays_resource_names() -> None:
    assert bundle_of(Resources()) == {"CPU": 1.0}
    res = Resources(cpus=2, gpus=1, memory="1Gi", custom={"node_a": 1})
    assert bundle_of(res) == {"CPU": 2, "GPU": 1.0, "memory": float(2**30), "node_a": 1}


def test_a_lost_node_is_retryable_on_its_own_budget() -> None:
    ev = ExitEvidence("worker-1", None, node_lost="ActorDiedError: the node died")
    c = classify_exit(ev)
    assert c.failure_class is FailureClass.NODE_LOST and c.retryable and c.rule == "node-lost"
    assert c.message == "The node hosting replica worker-1 was lost: ActorDiedError: the node died."
    failure = Failure("worker-1", "worker", 1, 0, None, 1.0, c)
    d = decide_failure(FaultTolerance(), Budgets(), failure, 3)
    assert isinstance(d, RestartJob)
    assert any(ch.budget == "max_node_lost_restarts" for ch in d.charges)
    spent = Budgets(class_restarts={"max_node_lost_restarts": 3})
    assert (
        "max_node_lost_restarts is spent"
        in decide_failure(FaultTolerance(), spent, failure, 3).reason
    )
    # A stop on its way when the node died does not make the loss the master's doing.
    stopped = classify_exit(ExitEvidence("worker-1", None, stop_requested=True, node_lost="x"))
    assert stopped.failure_class is FailureClass.NODE_LOST


@pytest.mark.slow
def test_a_host_that_does_not_see_the_storage_refuses_to_start(tmp_path: Path) -> None:
    """The master's marker missing (a folder on another machine's disk) or another job's:
    no replica starts there, and the error names this host and the storage."""
    storage = tmp_path / "ck"
    env = {ENV_CHECKPOINT_DIR: str(storage), ENV_STORAGE_CHECK: "tg-token-1"}
    host = ReplicaHost()
    err = host.start(child("*:print:trained"), env, "/")["error"]
    assert f"host {socket.gethostname()} does not see the checkpoint storage {storage}" in err
    assert "marker the master wrote there is not there" in err
    write_marker(storage, "tg-token-2")
    assert "another job's marker" in host.start(child("*:print:trained"), env, "/")["error"]
    write_marker(storage, "tg-token-1")
    assert "pid" in host.start(child("*:print:trained"), env, "/")
    out, code = _drain(host)
    host.close()
    assert (out, code) == (b"trained\n", 0)


@pytest.mark.slow
def test_stacks_go_to_a_file_on_the_node_when_the_masters_folder_is_not_there(
    tmp_path: Path,
) -> None:
    """The master's log folder exists on its own machine only: a replica elsewhere dumps
    its stacks into a file of its node, and snapshots read that one."""
    where = tmp_path / "out.txt"
    script = f"import os; open({str(where)!r}, 'w').write(os.environ['{ENV_FAULTHANDLER_FILE}'])"
    host = ReplicaHost()
    gone = "/nonexistent-master-logs/attempt-0/worker-1.stacks.txt"
    host.start([sys.executable, "-c", script], {ENV_FAULTHANDLER_FILE: gone}, "/")
    _drain(host)
    local = where.read_text()
    assert local != gone and local.endswith("attempt-0-worker-1.stacks.txt")
    assert Path(local).parent.is_dir()
    here = tmp_path / "attempt-0" / "worker-0.stacks.txt"
    here.parent.mkdir()
    host.start([sys.executable, "-c", script], {ENV_FAULTHANDLER_FILE: str(here)}, "/")
    _drain(host)
    host.close()
    assert where.read_text() == str(here)  # one machine: the master's own file


@pytest.mark.slow
def test_a_node_zygote_forks_replicas_whose_output_and_exit_reach_the_host(
    tmp_path: Path,
) -> None:
    """The node-level zygote as a plain object (no Ray): it imports once, forks a Python
    replica writing into a FIFO the host reads, reports its exit status, and refuses what
    it cannot fork (another interpreter) so that the host starts that one cold."""

    async def scenario() -> None:
        node = NodeZygote()
        said = await node.ready(["json"], dict(os.environ), distributed=False)
        assert "import_s" in said, said
        fifo = tmp_path / "out"
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        code = "import sys; print('forked', flush=True); sys.exit(3)"
        info = await node.spawn([sys.executable, "-c", code], dict(os.environ), "/", str(fifo))
        os.set_blocking(fd, True)
        out = b""
        while chunk := await asyncio.to_thread(os.read, fd, 4096):
            out += chunk
        os.close(fd)
        assert out == b"forked\n"
        assert await node.exit_code(int(info["pid"]), 10) == 3
        other = await node.spawn(["/bin/sh", "-c", "true"], dict(os.environ), "/", str(fifo))
        assert "cold" in other, other
        port = await node.open_store("127.0.0.1")  # a store already listening for rank 0
        if importlib.util.find_spec("torch") is None:  # a base install: rank 0 hosts it
            assert port is None
        else:
            assert port is not None
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        await node.close()

    asyncio.run(scenario())
