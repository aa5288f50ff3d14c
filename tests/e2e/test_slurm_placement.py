"""The Slurm backend's pure parts (issue 19): where replicas go, the srun of a step, what
scontrol says of a node, and the spec and flags of a Slurm job."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.backends.interface import Launch
from trainguard.backends.slurm.cluster import SlurmError, allocation_from_env, parse_node
from trainguard.backends.slurm.placement import place, srun_argv
from trainguard.cli.parser import build_parser, split_command
from trainguard.cli.spec_flags import build_spec
from trainguard.errors import SpecError
from trainguard.spec.models import validate_spec


def test_ranks_fill_the_usable_nodes_in_order() -> None:
    ranks = [("worker-0", 0), ("worker-1", 1), ("worker-2", 2), ("worker-3", 3)]
    assert place(ranks, ["n0", "n1", "n2"], 2) == {
        "worker-0": "n0",
        "worker-1": "n0",
        "worker-2": "n1",
        "worker-3": "n1",
    }
    assert place(ranks, ["n0", "n2"], 2) == {
        "worker-0": "n0",
        "worker-1": "n0",
        "worker-2": "n2",
        "worker-3": "n2",
    }
    assert place(ranks, ["n0"], 2) == (
        "the job needs 2 node(s) of 2 task(s), and the allocation has 1 usable"
    )


def test_a_replica_restarted_alone_keeps_its_node_or_takes_a_spare() -> None:
    assert place([("worker-1", 1)], ["n1", "n2"], 1, {"worker-1": "n1"}) == {"worker-1": "n1"}
    assert place([("worker-1", 1)], ["n2"], 1, {"worker-1": "n1"}) == {"worker-1": "n2"}
    assert "no usable node" in str(place([("worker-1", 1)], [], 1, {"worker-1": "n1"}))


def test_a_step_is_one_task_on_its_node_named_after_its_replica(tmp_path: Path) -> None:
    launch = Launch(0, "worker-1", 1, 0, ("python", "train.py"), {}, "/work", tmp_path / "l")
    argv = srun_argv(launch, "n2", "42", ["n1"], ["--mem=0"])
    assert argv[0] == "srun" and argv[-3:] == ["--mem=0", "python", "train.py"]
    for flag in ("--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--exclude=n1"):
        assert flag in argv
    assert "--job-name=worker-1" in argv and "--chdir=/work" in argv and "--overlap" in argv


def test_what_scontrol_says_of_a_node() -> None:
    line = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=4 NodeAddr=10.5.0.3 "
        "NodeHostName=n1 Port=6818 State=IDLE ThreadsPerCore=1"
    )
    node = parse_node(line)
    assert node is not None and (node.name, node.addr, node.port) == ("n1", "10.5.0.3", 6818)
    assert node.usable
    for state in ("DOWN+NOT_RESPONDING", "IDLE+DRAIN", "IDLE*", "MIXED+FAIL"):
        gone = parse_node(line.replace("State=IDLE", f"State={state}"))
        assert gone is not None and not gone.usable, state
    assert parse_node("no node here") is None


def test_outside_an_allocation_the_error_says_where_to_start() -> None:
    with pytest.raises(SlurmError, match="sbatch script or an salloc shell"):
        allocation_from_env({})
    assert allocation_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[0-2]"}) == (
        "7",
        "n[0-2]",
    )


def _spec(monkeypatch: pytest.MonkeyPatch, *argv: str, slurm_job: bool = False) -> object:
    if slurm_job:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    flags, command = split_command(["run", *argv, "--", "python", "t.py"])
    return build_spec(build_parser().parse_args(flags), command)


def test_nodes_times_tasks_per_node_and_slurm_chosen_inside_an_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = _spec(monkeypatch, "--nodes", "2", "--nproc-per-node", "3", slurm_job=True)
    assert spec.backend == "slurm" and spec.world_size == 6  # type: ignore[attr-defined]
    assert spec.slurm.nodes == 2 and spec.slurm.tasks_per_node == 3  # type: ignore[attr-defined]
    assert _spec(monkeypatch, "--nodes", "1", slurm_job=True).backend == "local"  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="2 nodes need the slurm backend"):  # outside one
        _spec(monkeypatch, "--nodes", "2")
    with pytest.raises(SpecError, match="--nodes: must be 1 to "):
        _spec(monkeypatch, "--nodes", "0")


def test_a_slurm_spec_whose_replicas_do_not_fill_its_nodes() -> None:
    data = {
        "name": "s",
        "backend": "slurm",
        "slurm": {"nodes": 2, "tasks_per_node": 2},
        "worker_pools": [{"role": "worker", "replicas": 3, "command": ["x"]}],
    }
    with pytest.raises(SpecError, match="2 node\\(s\\) x 2 task\\(s\\) per node is 4"):
        validate_spec(data)


@pytest.mark.slow
def test_the_stacks_step_finds_the_replicas_own_process_not_its_children() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from trainguard.backends.slurm.step_stacks import find_replica

    env = {**os.environ, "TRAINGUARD_JOB_ID": "tg-x", "TRAINGUARD_REPLICA": "worker-3"}
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and find_replica("tg-x", "worker-3") != proc.pid:
            time.sleep(0.05)
        assert find_replica("tg-x", "worker-3") == proc.pid
        assert find_replica("tg-x", "worker-4") is None
        assert find_replica("tg-y", "worker-3") is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # it and its child
        proc.wait()


def test_srun_saying_node_failure_is_a_lost_node_though_it_exits_0() -> None:
    """What Debian's Slurm 22.05 srun prints when the node under its task dies (exit 0)."""
    from trainguard.backends.slurm.placement import node_failure

    tail = [
        "step 12 loss 0.5",
        "srun: error: Node failure on tg-host-2",
        "srun: error: Node failure on tg-host-2",
    ]
    assert node_failure(tail) == "tg-host-2"
    assert node_failure([*tail, "srun: Job step aborted: Waiting up to 4 seconds"]) == "tg-host-2"
    assert node_failure(["srun: error: tg-host-0: task 0: Exited with exit code 3"]) is None
