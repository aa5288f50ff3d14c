"""A port trainguard chose, taken before the replica bound it (seen in CI on a Slurm node:
rank 0's store lost port 38671 to EADDRINUSE): a race, retried with a fresh port; a port
the job fixed itself stays a set-up error. And where ports are drawn, so the race is rare.
"""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import TG

from trainguard.backends import net
from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import classify_exit

TORCH_TAIL = (
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/rendezvous.py", line 199, '
    "in _create_c10d_store",
    "    return TCPStore(",
    "           ^^^^^^^^^",
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: 38671, useIpv6: false, code: -98, name: EADDRINUSE, message: "
    "address already in use",
)


def _exit(*ports: int) -> ExitEvidence:
    return ExitEvidence("worker-0", 1, log_tail=TORCH_TAIL, own_ports=ports)


def test_a_port_trainguard_chose_and_lost_is_retried() -> None:
    c = classify_exit(_exit(29500, 38671))
    assert (c.rule, c.retryable, c.failure_class) == (
        "port-race",
        True,
        FailureClass.TRANSIENT_EXIT,
    )
    assert "38671" in c.reason and not c.uncertain
    assert any("trainguard chose for this attempt" in n for n in c.notes)


@pytest.mark.parametrize("ports", [(), (29500,), (3867,), (386710,)])
def test_a_port_trainguard_did_not_choose_stays_a_set_up_error(ports: tuple[int, ...]) -> None:
    c = classify_exit(_exit(*ports))
    assert (c.rule, c.retryable, c.failure_class) == ("port-in-use", False, FailureClass.USER_ERROR)


def test_a_python_bind_on_a_fixed_port_stays_a_set_up_error() -> None:
    tail = (
        "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8080): "
        "address already in use",
    )
    c = classify_exit(ExitEvidence("worker-0", 1, log_tail=tail, own_ports=(29500,)))
    assert (c.rule, c.retryable) == ("port-in-use", False)


def test_ports_are_drawn_below_the_ephemeral_range_and_skip_one_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lo, hi = net.QUIET_PORTS
    assert hi < 32768  # Linux's default ephemeral range starts there
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, lo + 7])
        monkeypatch.setattr("random.randint", lambda a, b: next(draws))
        assert net.free_port() == lo + 7
    monkeypatch.undo()
    assert all(lo <= net.free_port() <= hi for _ in range(20))


def test_a_host_that_is_not_this_machine_is_an_error() -> None:
    with pytest.raises(OSError):
        net.free_port("192.0.2.1")  # TEST-NET-1: never an address of this machine


SCRIPT = """
    import os, socket
    import torch.distributed as dist

    held = None
    if os.environ["TRAINGUARD_ATTEMPT"] == "0" and os.environ["RANK"] == "0":
        # another process on the host takes the port between trainguard's choice and the bind
        held = socket.socket()
        held.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        held.listen()
    dist.init_process_group("gloo")
    dist.barrier()
    print("step 1 loss 0.5", flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_lost_rendezvous_port_costs_one_attempt_not_the_job(tg: TG, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    res = tg(
        "run", "--quiet", "--no-preload", "--nproc-per-node", "2", "--",
        sys.executable, str(script), timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2), job
    roots = [f for f in tg.json("explain", job["id"])["failures"] if f["root_cause"]]
    assert [(f["attempt"], f["replica"], f["rule"]) for f in roots] == [
        (0, "worker-0", "port-race")
    ]
