"""The Ray backend's parts that need no cluster: the node-side host, bundles, node loss."""

from __future__ import annotations

import signal
import time

from conftest import alive, child

from trainguard.backends.ray.backend import bundle_of
from trainguard.backends.ray.host import ReplicaHost
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.classes import ExitEvidence, FailureClass
from trainguard.policy.classify import classify_exit
from trainguard.policy.decisions import RestartJob, decide_failure
from trainguard.spec.models import FaultTolerance, Resources


def _drain(host: ReplicaHost, deadline_s: float = 20) -> tuple[bytes, int]:
    out = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        data, code = host.read(0.2)
        out += data
        if code is not None:
            return out, code
    raise AssertionError(f"no exit within {deadline_s}s; output so far {out!r}")


def test_the_host_runs_a_command_and_hands_over_output_and_exit_code(tmp_path: object) -> None:
    host = ReplicaHost()
    info = host.start(child("*:print:one", "*:print:two", "*:exit:3"), {"RANK": "0"}, "/")
    assert "pid" in info
    out, code = _drain(host)
    host.close()
    assert out.decode().splitlines() == ["one", "two"] and code == 3


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
