"""The rendezvous store held by trainguard (backends/local/rendezvous_keeper.py): every rank of a
warm-started torch job connects to a store that already listens, as under torchrun."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
from conftest import TG

from trainguard.backends.local.rendezvous_keeper import KEEP, KeeperError
from trainguard.backends.local.zygote import Zygote

pytestmark = pytest.mark.slow


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def test_the_keeper_opens_fresh_stores_and_keeps_the_newest() -> None:
    pytest.importorskip("torch")

    async def scenario() -> None:
        zygote = await Zygote.start(["torch"], distributed=True)
        try:
            keeper = await zygote.keeper()
            ports = [await keeper.open("127.0.0.1") for _ in range(KEEP + 1)]
            assert len(set(ports)) == len(ports)
            assert not _listens(ports[0])  # the oldest is closed
            assert all(_listens(p) for p in ports[1:])
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                with pytest.raises(KeeperError, match=r"(?i)address already in use|bind"):
                    await keeper.open("127.0.0.1", taken.getsockname()[1])
            assert keeper.alive  # one store it could not open does not end it
            await zygote.close()  # the keeper dies with the zygote
            with pytest.raises(KeeperError):
                await keeper.open("127.0.0.1")
            assert not keeper.alive
            keeper.close()
        finally:
            await zygote.close()

    asyncio.run(scenario())


PROBE = """
import os, socket, sys, time
from datetime import timedelta
rank = int(os.environ["RANK"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 1:
    # rank 0 has not even imported torch.distributed: the store must listen already
    socket.create_connection((addr, port), timeout=2).close()
    print("LISTENING", port, flush=True)
else:
    time.sleep(1.0)
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
dist.barrier()
print("AGENT", os.environ["TORCHELASTIC_USE_AGENT_STORE"], port, flush=True)
dist.destroy_process_group()
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if rank == 1:
        os.kill(os.getpid(), 9)
    time.sleep(120)  # rank 0 waits for rank 1's kill to end this attempt (not its own exit)
"""


def _lines(tg: TG, prefix: str) -> list[str]:
    job = tg.only_job()
    out = []
    for rep in job["replicas"]:
        for f in sorted(Path(rep["log_path"]).parent.parent.rglob(f"{rep['name']}*.log")):
            out += [x for x in f.read_text().splitlines() if x.startswith(prefix)]
    return out


def test_a_warm_job_meets_at_a_store_that_listens_before_rank_0_starts(
    tg: TG, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    res = tg("run", "--quiet", "--nproc-per-node", "2", "--", sys.executable, str(script))
    assert res.returncode == 0, res.stderr
    assert "the rendezvous store is held by trainguard" in res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    agent = _lines(tg, "AGENT ")
    assert len(agent) == 4 and {x.split()[1] for x in agent} == {"True"}
    assert len({x.split()[2] for x in agent}) == 2  # a fresh store for each attempt
    assert len(_lines(tg, "LISTENING ")) == 2


def test_a_cold_job_leaves_the_store_to_rank_0(tg: TG, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace("if rank == 1:", "if False:", 1))
    res = tg(
        "run", "--quiet", "--no-preload", "--nproc-per-node", "2", "--", sys.executable, str(script)
    )
    assert res.returncode == 0, res.stderr
    assert "rendezvous store" not in res.stderr
    assert {x.split()[1] for x in _lines(tg, "AGENT ")} == {"False"}
