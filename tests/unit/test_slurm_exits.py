"""The Slurm backend's reading of a replica's failure (issues 19, 37), its Slurm calls
replaced by their answers: a node whose slurmd does not answer is lost; a probe this
machine could not make, or a replica it could not start (EMFILE), loses no node; an
allocation Slurm ended (scancel of an salloc) is the master's cancel, told once and ahead
of the exits it caused. The same on a real cluster: tests/e2e/test_slurm_misreads.py."""

from __future__ import annotations

import asyncio
import errno

import pytest

from trainguard.backends.interface import ReplicaExited
from trainguard.backends.slurm import backend as slurm_backend
from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.backend import SlurmBackend
from trainguard.backends.slurm.cluster import (
    Allocation,
    Answer,
    Node,
    Probe,
    SlurmError,
    ended_state,
)
from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.master.runner import OutsideCancels
from trainguard.spec.engines import SlurmOptions

ALIVE = {"n0": Probe(Answer.ALIVE), "n1": Probe(Answer.ALIVE)}


def _slurm(
    probes: dict[str, Probe],
    asked: list[str],
    monkeypatch: pytest.MonkeyPatch,
    ended: str | None = None,
) -> tuple[SlurmBackend, list[object]]:
    """A Slurm backend of two replicas on n0 and n1 in allocation 7: its probes answer
    `probes`, Slurm says the allocation ended as `ended`. What it tells the master, in
    order: its events, and ("on_ended", why) when it reports the allocation's end."""
    seen: list[object] = []
    backend = SlurmBackend(
        SlurmOptions(), replicas=2, on_ended=lambda why: seen.append(("on_ended", why))
    )
    backend.bind(seen.append)
    backend._alloc = Allocation("7", ("n0", "n1"))
    backend._nodes = {n: Node(n, f"10.0.0.{i}", "MIXED") for i, n in enumerate(probes)}
    backend._where.update({"worker-0": "n0", "worker-1": "n1"})

    async def probe(node: Node, timeout_s: float) -> Probe:
        asked.append(node.name)
        return probes[node.name]

    async def allocation_end(job_id: str) -> str | None:
        asked.append(f"job {job_id}")
        return ended

    monkeypatch.setattr(cluster, "probe", probe)
    monkeypatch.setattr(cluster, "allocation_end", allocation_end)
    return backend, seen


def _exit(ev: ExitEvidence) -> ReplicaExited:
    return ReplicaExited(0, ev.replica, 0, None, ev, 1.0)


async def _deliver(backend: SlurmBackend, ev: ReplicaExited) -> None:
    backend._from_inner(ev)
    if backend._tasks:
        await asyncio.wait(list(backend._tasks))


def test_slurm_probes_no_node_for_a_spawn_out_of_descriptors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    lost = Probe(Answer.LOST, "refused")
    backend, seen = _slurm({"n0": lost, "n1": lost}, asked, monkeypatch)
    ev = ExitEvidence("worker-0", None, spawn_error="cannot start", spawn_errno=errno.EMFILE)
    asyncio.run(_deliver(backend, _exit(ev)))
    assert asked == []  # no node is to blame: none is probed
    (out,) = seen
    assert isinstance(out, ReplicaExited)
    assert out.evidence.node_lost is None
    assert classify_exit(out.evidence).failure_class is FailureClass.INTERNAL


def test_slurm_loses_no_node_whose_probe_could_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = Probe(Answer.UNKNOWN, "the probe could not run here: EMFILE")
    backend, seen = _slurm({"n0": unknown, "n1": unknown}, [], monkeypatch)
    asyncio.run(_deliver(backend, _exit(ExitEvidence("worker-0", 1))))
    (out,) = seen
    assert isinstance(out, ReplicaExited) and out.evidence.node_lost is None
    assert classify_exit(out.evidence).failure_class is not FailureClass.NODE_LOST
    assert backend._excluded == {}


def test_slurm_still_loses_a_node_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, seen = _slurm(
        {"n0": Probe(Answer.LOST, "refused"), "n1": Probe(Answer.ALIVE)}, [], monkeypatch
    )
    asyncio.run(_deliver(backend, _exit(ExitEvidence("worker-0", 1))))
    (out,) = seen
    assert isinstance(out, ReplicaExited) and out.evidence.node_lost is not None
    assert "n0" in out.evidence.node_lost


_STEP_LOST = (
    "srun: error: _server_read: fd 14 error reading header: Connection reset by peer",
    "srun: error: step_launch_notify_io_failure: aborting, io error with slurmstepd on node 0",
    "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.",
    "srun: error: Timed out waiting for job step to complete",
)
"""What srun said, exiting 0, when the node under its step died (a fresh-clone run)."""


@pytest.mark.parametrize(
    ("answer", "lost"), [(Answer.LOST, True), (Answer.ALIVE, False)], ids=["dead", "alive"]
)
def test_srun_that_lost_its_step_and_exits_0_is_no_success(
    monkeypatch: pytest.MonkeyPatch, answer: Answer, lost: bool
) -> None:
    """Its node is probed: lost if it does not answer; a failure either way."""
    asked: list[str] = []
    backend, seen = _slurm(
        {"n0": Probe(answer, "x"), "n1": Probe(Answer.ALIVE)}, asked, monkeypatch
    )
    ev = ExitEvidence("worker-0", 0, log_tail=("step 3", *_STEP_LOST))
    asyncio.run(_deliver(backend, _exit(ev)))
    (out,) = seen
    assert isinstance(out, ReplicaExited) and out.evidence.returncode == 1
    assert "n0" in asked
    assert (out.evidence.node_lost is not None) is lost
    c = classify_exit(out.evidence)
    assert c.retryable and (c.failure_class is FailureClass.NODE_LOST) is lost


def test_srun_exiting_0_with_no_word_of_a_lost_step_is_a_success(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    backend, seen = _slurm(ALIVE, asked, monkeypatch)
    tail = ("srun: error: Timed out waiting for job step to complete", "done")
    asyncio.run(_deliver(backend, _exit(ExitEvidence("worker-0", 0, log_tail=tail))))
    (out,) = seen
    assert isinstance(out, ReplicaExited) and out.evidence.returncode == 0 and asked == []


def test_an_allocation_slurm_ended_is_a_cancel_told_once_before_the_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    backend, seen = _slurm(ALIVE, asked, monkeypatch, ended="CANCELLED")

    async def both() -> None:
        backend._from_inner(_exit(ExitEvidence("worker-0", 143)))
        backend._from_inner(_exit(ExitEvidence("worker-1", 1, log_tail=("srun: error: x",))))
        await asyncio.wait(list(backend._tasks))

    asyncio.run(both())
    assert seen[0] == (
        "on_ended",
        "cancelled (Slurm ended allocation 7: CANCELLED; scancel, a time limit or a preemption)",
    )
    assert [type(ev) for ev in seen[1:]] == [ReplicaExited, ReplicaExited]
    assert asked == ["job 7"]  # one question for both failures, and no probe
    assert all(isinstance(ev, ReplicaExited) and ev.evidence.node_lost is None for ev in seen[1:])


def test_a_running_allocation_tells_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, seen = _slurm(ALIVE, [], monkeypatch, ended=None)
    asyncio.run(_deliver(backend, _exit(ExitEvidence("worker-0", 1))))
    assert [type(ev) for ev in seen] == [ReplicaExited]


def test_a_stop_returns_after_the_failed_exits_whose_nodes_were_being_probed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """worker-1 died of its own bug and its node is still being probed when worker-0's
    cascade makes the master stop the rest: the stop tells worker-1's exit before it
    returns, so the master settles with the root cause in hand (CI, 994c53b)."""
    backend, seen = _slurm(ALIVE, [], monkeypatch)
    slow = asyncio.Event()

    async def probe(node: Node, timeout_s: float) -> Probe:
        await slow.wait()
        return ALIVE[node.name]

    async def nothing(*_args: object, **_kwargs: object) -> None:
        return None

    monkeypatch.setattr(cluster, "probe", probe)
    monkeypatch.setattr(backend._launcher, "stop", nothing)

    async def race() -> list[object]:
        backend._from_inner(_exit(ExitEvidence("worker-1", 1, log_tail=("KeyError: 'lr'",))))
        asyncio.get_running_loop().call_later(0.05, slow.set)
        await backend.stop(["worker-1"], grace_s=1.0)
        return list(seen)

    told = asyncio.run(race())
    assert [ev.replica for ev in told if isinstance(ev, ReplicaExited)] == ["worker-1"]


@pytest.mark.parametrize(
    ("line", "ended"),
    [
        ("JobId=7 JobName=sh JobState=RUNNING Reason=None", None),
        ("JobId=7 JobName=sh JobState=CANCELLED Reason=None", "CANCELLED"),
        ("JobId=7 JobName=sh JobState=COMPLETING Reason=None", "COMPLETING"),
        ("JobId=7 JobName=sh JobState=TIMEOUT Reason=TimeLimit", "TIMEOUT"),
        ("JobId=7 JobName=sh JobState=SUSPENDED Reason=None", None),
        ("", None),
    ],
)
def test_the_state_of_an_allocation(line: str, ended: str | None) -> None:
    assert ended_state(line) == ended


def test_slurm_ending_the_allocation_cancels_only_where_no_signal_did() -> None:
    """Under salloc only the end says so: it cancels. Under sbatch SIGTERM comes with it:
    the end adds no second cancel (one that would stop the replicas without grace)."""
    salloc, sbatch = OutsideCancels(), OutsideCancels()
    asked: list[str] = []
    salloc.cancel = sbatch.cancel = asked.append
    salloc.ended("cancelled (Slurm ended allocation 7: CANCELLED)")
    sbatch.signalled("cancelled (SIGTERM from Slurm)")
    sbatch.ended("cancelled (Slurm ended allocation 8: CANCELLED)")
    sbatch.signalled("cancelled (SIGINT)")  # a second signal still escalates
    assert asked == [
        "cancelled (Slurm ended allocation 7: CANCELLED)",
        "cancelled (SIGTERM from Slurm)",
        "cancelled (SIGINT)",
    ]


def test_a_rendezvous_whose_probes_cannot_run_is_an_error_here_not_too_few_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unknown = Probe(Answer.UNKNOWN, "the probe could not run here: EMFILE (Too many open files)")
    backend, _seen = _slurm({"n0": unknown, "n1": unknown}, [], monkeypatch)

    async def nodes(names: list[str]) -> dict[str, Node]:
        return backend._nodes

    monkeypatch.setattr(cluster, "nodes", nodes)
    with pytest.raises(SlurmError, match="Slurm node n0: the probe could not run here: EMFILE"):
        asyncio.run(backend.rendezvous())  # not NoCapacity: no node is lost or excluded
    assert backend._excluded == {}


def test_an_agent_that_hung_up_on_a_live_node_waits_for_slurm_to_say_the_allocation_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A requeue ends the agents' steps before `scontrol` shows the job requeued: the
    first answer is RUNNING, the second (a moment later) REQUEUED, so the loss is told as
    the allocation's end (a cancel), ahead of the exit, not as a lost node's."""
    asked: list[str] = []
    backend, seen = _slurm(ALIVE, asked, monkeypatch)
    answers = iter([None, "REQUEUED"])

    async def allocation_end(job_id: str) -> str | None:
        asked.append(f"job {job_id}")
        return next(answers)

    monkeypatch.setattr(cluster, "allocation_end", allocation_end)
    monkeypatch.setattr(slurm_backend, "STEP_ENDED_S", 0.01)
    monkeypatch.setattr(backend._launcher, "hung_up", lambda replica: replica == "worker-0")
    lost = ExitEvidence("worker-0", None, node_lost="node n0 lost: its agent closed the connection")
    asyncio.run(_deliver(backend, _exit(lost)))
    assert asked == ["job 7", "n0", "job 7"]
    assert seen[0] == (
        "on_ended",
        "cancelled (Slurm ended allocation 7: REQUEUED; scancel, a time limit or a preemption)",
    )
    assert isinstance(seen[1], ReplicaExited)


def test_an_agent_silent_or_on_a_dead_node_is_a_lost_node_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    dead = {"n0": Probe(Answer.LOST, "refused"), "n1": Probe(Answer.ALIVE)}
    backend, seen = _slurm(dead, asked, monkeypatch)
    monkeypatch.setattr(backend._launcher, "hung_up", lambda replica: replica == "worker-0")
    gone = ExitEvidence("worker-0", None, node_lost="node n0 lost: its agent closed the connection")
    silent = ExitEvidence("worker-1", None, node_lost="node n1 lost: its agent was silent")
    asyncio.run(_deliver(backend, _exit(gone)))
    asyncio.run(_deliver(backend, _exit(silent)))
    assert asked == ["job 7", "n0", "job 7"]  # the dead node probed once; the silent one not
    assert [type(ev) for ev in seen] == [ReplicaExited, ReplicaExited]


def test_the_replicas_of_a_node_whose_agent_hung_up_share_one_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both replicas on n0, its agent gone: Slurm and the node are asked once, not per
    replica, and each replica's exit is told after that look."""
    asked: list[str] = []
    backend, seen = _slurm(ALIVE, asked, monkeypatch)
    backend._where["worker-1"] = "n0"
    monkeypatch.setattr(slurm_backend, "STEP_ENDED_S", 0.01)
    monkeypatch.setattr(backend._launcher, "hung_up", lambda replica: True)
    why = "node n0 lost: its agent closed the connection"

    async def both() -> None:
        backend._from_inner(_exit(ExitEvidence("worker-0", None, node_lost=why)))
        backend._from_inner(_exit(ExitEvidence("worker-1", None, node_lost=why)))
        await asyncio.wait(list(backend._tasks))

    asyncio.run(both())
    assert asked == ["job 7", "n0", "job 7"]
    assert sorted(ev.replica for ev in seen if isinstance(ev, ReplicaExited)) == [
        "worker-0",
        "worker-1",
    ]
