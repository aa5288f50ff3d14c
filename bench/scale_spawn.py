"""`bench/scale.py spawn`: the master's own cost per spawn, with replicas that exec `sleep`
(see bench/scale.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from scale_harness import (
    RestartResult,
    StoreView,
    master_cmd,
    proc_sample,
    runs_and_table,
    stop_all,
    wait_for,
)

# ------------------------------------------------------------------ spawn


def children_named(pid: int, comm: str) -> int:
    """How many children of `pid` (any of its threads) run a program called `comm`."""
    kids: list[str] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += fh.read().split()
    count = 0
    for kid in kids:
        with contextlib.suppress(OSError), open(f"/proc/{kid}/comm") as fh:
            count += fh.read().strip() == comm
    return count


def spawn_once(args: argparse.Namespace, work: Path) -> RestartResult:
    res = RestartResult()
    n = args.replicas
    home = work / "home"
    program = work / "sleep"  # a link, so that leftovers name this run's folder
    found = shutil.which("sleep")
    if found is None:
        res.problems.append("no `sleep` program on PATH")
        return res
    program.symlink_to(found)
    flags = ["--job-name", "scale-spawn"]
    store = StoreView(home)
    out = open(work / "master.out", "wb")  # noqa: SIM115 - closed below
    m = res.metrics
    t_start = time.time()
    master = subprocess.Popen(
        master_cmd(home, n, flags, [str(program), "100000"]), stdout=out, stderr=subprocess.STDOUT
    )
    try:
        wait_for("the first replica", lambda: children_named(master.pid, "sleep") > 0, 60, 0.002)
        t_first = time.time()
        wait_for(f"{n} replicas", lambda: children_named(master.pid, "sleep") >= n, 120, 0.002)
        t_all = time.time()
        m["replicas"] = float(n)
        m["run -> first replica exec'd (s)"] = t_first - t_start
        m["run -> all replicas exec'd (s)"] = t_all - t_start
        m["first -> all exec'd, per replica (ms)"] = 1000 * (t_all - t_first) / max(1, n - 1)
        sample = proc_sample(master.pid)
        m["master threads with N running"] = float(sample.threads) if sample else float("nan")
        t_cancel = time.time()
        master.send_signal(signal.SIGINT)
        try:
            master.wait(timeout=120)
            m["cancel (SIGINT) -> master exited (s)"] = time.time() - t_cancel
        except subprocess.TimeoutExpired:
            res.problems.append("the master did not exit within 120 s of SIGINT")
        state = (store.job() or {}).get("state")
        m["final job state"] = state
        if state != "CANCELLED":
            res.problems.append(f"job state {state} after the cancel, expected CANCELLED")
    except TimeoutError as exc:
        res.problems.append(str(exc))
    finally:
        store.close()
        left = stop_all(master, str(work))
        out.close()
    if left:
        res.problems.append(f"{len(left)} process(es) left behind and killed: {left}")
    m["checks"] = "ok" if not res.problems else f"{len(res.problems)} problem(s)"
    return res


def cmd_spawn(args: argparse.Namespace) -> int:
    load = os.getloadavg()[0]  # before this bench adds its own
    title = f"spawn: {args.replicas} `sleep` replicas, {os.cpu_count()} cores"
    return runs_and_table(args, spawn_once, "spawn", title, load)
