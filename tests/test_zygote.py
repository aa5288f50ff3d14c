"""Warm start: replicas forked from a zygote behave as replicas started the ordinary way."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from conftest import TG, alive, child, wait_for

from trainguard.backends.local.zygote import expand, forkable


def test_which_commands_can_be_forked() -> None:
    assert forkable([sys.executable, "train.py", "--lr", "1"])
    assert forkable(["python", "train.py"])
    assert not forkable([sys.executable, "-m", "pkg"])
    assert not forkable(["bash", "run.sh"])
    assert not forkable(["/usr/bin/env"])
    assert expand(["torch", "json"])[:2] == ["torch", "torch.distributed"]
    assert expand(["json", "json"]) == ["json"]


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def test_forked_replicas_print_exit_restart_and_get_their_own_env(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    res = tg(
        "run",
        "--quiet",
        "--preload",
        "json",
        "--nproc-per-node",
        "2",
        "--",
        *child(
            f"*:pidfile:{pids}",
            "*:env:RANK",
            "*:print:cwd={rank}",
            "1@0:signal:SIGKILL",
            "0:sleep:1.5",  # the primary ends the job: let rank 1 finish first
            "*:print:done {attempt}",
        ),
    )
    assert res.returncode == 0, res.stderr
    assert "warm start: json imported once" in res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1)
    (rec,) = tg.json("records", job["id"])
    assert rec["replica"] == "worker-1" and rec["error_code"] == "137"  # the signal, as usual
    log1 = Path(job["replicas"][1]["log_path"]).read_text()
    assert "RANK=1" in log1 and "done 1" in log1


def test_a_killed_master_takes_the_zygote_and_its_replicas_along(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--preload",
        "json",
        "--nproc-per-node",
        "2",
        "--",
        *child(f"*:spawn-child:{pids}", f"*:pidfile:{pids}", "*:forever"),
    )
    try:
        wait_for(lambda: all(Path(f"{pids}.{r}").is_file() for r in range(2)), 60, "2 replicas")
        replicas = [int(Path(f"{pids}.{r}").read_text()) for r in range(2)]
        grandchildren = [int(Path(f"{pids}.{r}.child").read_text()) for r in range(2)]
        zygote = _ppid(replicas[0])
        assert zygote != proc.pid and _ppid(zygote) == proc.pid  # forked by the zygote
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # also when the test fails: no master left behind
        proc.wait()
    everything = [*replicas, *grandchildren, zygote]
    wait_for(lambda: not any(alive(p) for p in everything), 15, "nothing left")
