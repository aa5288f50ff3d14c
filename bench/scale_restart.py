"""`bench/scale.py restart`: N sleeping replicas, K of them SIGKILLed at once; one job
restart (sync) or K replica restarts (async), then a timed cancel (see bench/scale.py)."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scale_harness import (
    CHILD,
    RestartResult,
    Sampler,
    StoreView,
    master_cmd,
    proc_sample,
    runs_and_table,
    stop_all,
    wait_for,
)

# ------------------------------------------------------------------ restart


def read_pid(path: Path) -> tuple[int, float] | None:
    """(pid, mtime) of a pid file, None while it is missing or half written."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return (int(text), mtime) if text.strip().isdigit() else None


def restart_once(args: argparse.Namespace, work: Path) -> RestartResult:
    res = RestartResult()
    n, k = args.replicas, args.kill
    home = work / "home"
    pids = work / "pids"
    pids.mkdir()
    command = [sys.executable, str(CHILD), f"*:pidfile:{pids}/pid", "*:forever"]
    flags = [
        "--execution-mode",
        args.mode,
        "--max-restarts",
        "5",
        "--max-replica-restarts",
        "5",
        "--job-name",
        f"scale-{args.mode}",
    ]
    store = StoreView(home)
    out = open(work / "master.out", "wb")  # noqa: SIM115 - closed below
    m = res.metrics
    t_start = time.time()
    master = subprocess.Popen(
        master_cmd(home, n, flags, command), stdout=out, stderr=subprocess.STDOUT
    )
    sampler = Sampler(master.pid)
    sampler.start()
    pidfile = [pids / f"pid.{r}" for r in range(n)]

    def running(attempt: int, restart: int | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in store.runs()
            if r["attempt"] == attempt
            and r["state"] == "RUNNING"
            and (restart is None or r["restart"] == restart)
        ]

    def pidfiles_after(t: float, ranks: Sequence[int]) -> list[tuple[int, float]] | None:
        got = [read_pid(pidfile[r]) for r in ranks]
        if any(g is None or g[1] < t for g in got):
            return None
        return [g for g in got if g is not None]

    try:
        wait_for("the job row", lambda: store.job() is not None, 60)
        job = store.job() or {}
        wait_for(f"{n} RUNNING runs of attempt 0", lambda: len(running(0)) == n, args.timeout)
        t_store = time.time()
        wait_for("every pid file", lambda: pidfiles_after(0, range(n)) is not None, args.timeout)
        first = {r["rank"]: r for r in running(0)}
        files = pidfiles_after(0, range(n)) or []
        att0 = store.attempts()[0]
        starts = sorted(r["started_at_s"] for r in first.values())
        up = [t for t in store.transitions() if t["to_state"] == "RUNNING"]
        m["replicas, mode"] = f"{n}, {args.mode}"
        m["run -> job created (s)"] = job["created_at_s"] - t_start
        m["run -> attempt 0 started (s)"] = att0["started_at_s"] - t_start
        m["run -> first replica spawned (s)"] = starts[0] - t_start
        m["run -> all spawned, job RUNNING (s)"] = up[0]["at_s"] - t_start if up else float("nan")
        m["spawn rate, first -> last spawn (replicas/s)"] = (n - 1) / max(
            1e-9, starts[-1] - starts[0]
        )
        m["run -> all replica programs executing (s)"] = max(f[1] for f in files) - t_start
        m["(bench saw all RUNNING in the store after, s)"] = t_store - t_start
        mismatched = [r for r in range(n) if files[r][0] != first[r]["pid"]]
        if mismatched:
            res.problems.append(f"pid files differ from the store's pids for ranks {mismatched}")
        warm = proc_sample(master.pid)
        if warm:
            m["master threads with N running"] = float(warm.threads)
            m["master RSS with N running (MiB)"] = warm.rss_kb / 1024

        victims = [1 + i * (n - 1) // k for i in range(k)]
        assert len(set(victims)) == k and 0 not in victims
        vpids = [files[r][0] for r in victims]
        t_kill = time.time()
        for pid in vpids:
            os.kill(pid, signal.SIGKILL)
        if args.mode == "sync":
            wait_for(f"{n} RUNNING runs of attempt 1", lambda: len(running(1)) == n, args.timeout)
            t_seen = time.time()
            wait_for(
                "every pid file rewritten",
                lambda: pidfiles_after(t_kill, range(n)) is not None,
                args.timeout,
            )
            files1 = pidfiles_after(t_kill, range(n)) or []
            time.sleep(args.settle)
            recs = store.restarts()
            atts = store.attempts()
            up = [t for t in store.transitions() if t["to_state"] == "RUNNING"]
            runs1 = running(1)
            m["restart records (expected 1)"] = float(len(recs))
            m["attempts (expected 2)"] = float(len(atts))
            if len(recs) != 1:
                res.problems.append(f"{len(recs)} restart records, expected 1")
            if len(atts) != 2:
                res.problems.append(f"{len(atts)} attempts, expected 2")
            if len(runs1) != n:
                res.problems.append(f"{len(runs1)} of {n} replicas of attempt 1 running")
            rec = recs[0] if recs else {}
            m["kill -> restart decided, record at_s (s)"] = rec.get("at_s", 0.0) - t_kill
            if len(atts) > 1:
                m["kill -> attempt 1 started (s)"] = atts[1]["started_at_s"] - t_kill
            starts1 = sorted(r["started_at_s"] for r in runs1)
            m["kill -> all N spawned, job RUNNING again (s)"] = (
                up[1]["at_s"] - t_kill if len(up) > 1 else float("nan")
            )
            m["kill -> all N programs executing again (s)"] = max(f[1] for f in files1) - t_kill
            m["(bench saw all RUNNING in the store after, s)"] = t_seen - t_kill
            m["respawn rate, first -> last spawn (replicas/s)"] = (n - 1) / max(
                1e-9, starts1[-1] - starts1[0]
            )
            for phase in ("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms"):
                value = rec.get(phase)
                m[f"record {phase}"] = float(value) if value is not None else "null"
            m["record decision"] = str(rec.get("decision", ""))[:60]
        else:
            wait_for(
                f"{k} replicas restarted alone and RUNNING",
                lambda: len(running(0, restart=1)) == k,
                args.timeout,
            )
            t_seen = time.time()
            wait_for(
                "the victims' pid files rewritten",
                lambda: pidfiles_after(t_kill, victims) is not None,
                args.timeout,
            )
            files1 = pidfiles_after(t_kill, victims) or []
            time.sleep(args.settle)
            recs = store.restarts()
            atts = store.attempts()
            again = running(0, restart=1)
            alone = [r for r in recs if str(r["decision"]).startswith("RestartReplica")]
            m["restart records (expected K RestartReplica)"] = f"{len(alone)}/{len(recs)}"
            m["attempts (expected 1)"] = float(len(atts))
            if len(alone) != k or len(recs) != k:
                res.problems.append(f"{len(recs)} restart records ({len(alone)} alone), want {k}")
            if len(atts) != 1:
                res.problems.append(f"{len(atts)} attempts, expected 1 (no job restart)")
            names = {f"worker-{r}" for r in victims}
            if {r["replica"] for r in again} != names:
                res.problems.append("the replicas restarted are not the ones killed")
            if len(running(0)) != n:
                res.problems.append(f"{len(running(0))} of {n} replicas running at the end")
            decided = sorted(r["at_s"] - t_kill for r in recs)
            m["kill -> first restart decided (s)"] = decided[0] if decided else float("nan")
            m["kill -> last restart decided (s)"] = decided[-1] if decided else float("nan")
            m["kill -> last of K respawned (s)"] = (
                max(r["started_at_s"] for r in again) - t_kill if again else float("nan")
            )
            m["kill -> last of K programs executing (s)"] = max(f[1] for f in files1) - t_kill
            m["(bench saw K RUNNING in the store after, s)"] = t_seen - t_kill
            start_ms = [r["start_ms"] for r in recs if r["start_ms"] is not None]
            m["record start_ms, median"] = statistics.median(start_ms) if start_ms else "null"
            m["record decision (first)"] = str(recs[0]["decision"])[:60] if recs else ""
        peak = max((s.threads for s in sampler.samples), default=0)
        m["master threads, peak"] = float(peak)
        m["master RSS peak, VmHWM (MiB)"] = (
            max((s.hwm_kb for s in sampler.samples), default=0) / 1024
        )
        m["master CPU, mean from run to now (% of a core)"] = sampler.cpu_pct()

        t_cancel = time.time()
        master.send_signal(signal.SIGINT)
        try:
            master.wait(timeout=args.timeout)
            m["cancel (SIGINT) -> master exited (s)"] = time.time() - t_cancel
        except subprocess.TimeoutExpired:
            res.problems.append(f"the master did not exit within {args.timeout} s of SIGINT")
        state = (store.job() or {}).get("state")
        m["final job state"] = state
        if state != "CANCELLED":
            res.problems.append(f"job state {state} after the cancel, expected CANCELLED")
        still = [r for r in store.runs() if r["ended_at_s"] is None]
        if still:
            res.problems.append(f"{len(still)} runs with no end recorded after the cancel")
    except TimeoutError as exc:
        res.problems.append(str(exc))
    finally:
        sampler.stop()
        store.close()
        left = stop_all(master, str(work))
        out.close()
    if left:
        res.problems.append(f"{len(left)} process(es) left behind and killed: {left}")
    m["checks"] = "ok" if not res.problems else f"{len(res.problems)} problem(s)"
    return res


def cmd_restart(args: argparse.Namespace) -> int:
    if not 0 < args.kill < args.replicas:
        sys.exit("scale.py: --kill must be between 1 and --replicas - 1 (rank 0 is spared)")
    load = os.getloadavg()[0]  # before this bench adds its own
    title = (
        f"restart: {args.replicas} replicas, SIGKILL {args.kill} at once, {args.mode} mode, "
        f"{os.cpu_count()} cores"
    )
    return runs_and_table(args, restart_once, "restart", title, load)
