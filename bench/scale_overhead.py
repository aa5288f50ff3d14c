"""`bench/scale.py overhead`: the master's CPU and memory while N replicas print heavily,
and every line accounted for in the logs (see bench/scale.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scale_harness import Sampler, StoreView, master_cmd, print_table, stop_all

# The replica of `overhead`: RATE numbered lines per second for SECONDS, written in one
# os.write per BATCH_MS tick (lines due but not yet written are caught up to 200 ms' worth
# per tick, so a starved replica prints fewer lines rather than bursting), then a marker.
EMITTER = r"""
import os, sys, time
rate, seconds, batch_s = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]) / 1000
rank = int(os.environ.get("RANK", "0"))
pad = "x" * 80
cap = max(1, int(rate * 0.2))
n = 0
blocked = 0.0
t0 = time.time()
start = time.monotonic()
end = start + seconds
while True:
    now = time.monotonic()
    if now >= end:
        break
    due = min(int((now - start) * rate) - n, cap)
    if due > 0:
        data = "".join(f"r{rank:04d} {n + i:09d} {pad}\n" for i in range(due)).encode()
        w0 = time.monotonic()
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
        blocked += time.monotonic() - w0
        n += due
    time.sleep(max(0.0, min(batch_s, end - time.monotonic())))
t1 = time.time()
os.write(1, f"DONE lines={n} t0={t0:.6f} t1={t1:.6f} blocked={blocked:.6f}\n".encode())
"""


# ------------------------------------------------------------------ overhead


@dataclass
class OverheadResult:
    metrics: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_log(path: Path) -> tuple[int, int, float, float, float, str | None]:
    """(lines printed per the marker, lines in the file, t0, t1, blocked_s, problem)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return 0, 0, 0.0, 0.0, 0.0, f"{path.name}: {exc}"
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines or not lines[-1].startswith(b"DONE "):
        return 0, len(lines), 0.0, 0.0, 0.0, f"{path.name}: no DONE marker"
    marker = dict(kv.split("=", 1) for kv in lines[-1].decode().split()[1:])
    said = int(marker["lines"])
    body = lines[:-1]
    problem = None
    if len(body) != said:
        problem = f"{path.name}: said {said} lines, the log holds {len(body)}"
    else:
        for i, raw in enumerate(body):
            parts = raw.split(b" ", 2)
            if len(parts) < 2 or int(parts[1]) != i:
                problem = f"{path.name}: line {i} is {raw[:30]!r} (a gap or a duplicate)"
                break
    return (
        said,
        len(body),
        float(marker["t0"]),
        float(marker["t1"]),
        float(marker["blocked"]),
        problem,
    )


def overhead_once(args: argparse.Namespace, work: Path) -> OverheadResult:
    res = OverheadResult()
    home = work / "home"
    emitter = work / "emit.py"
    emitter.write_text(EMITTER)
    command = [sys.executable, str(emitter), str(args.rate), str(args.seconds), str(args.batch_ms)]
    flags = ["--success-policy", "all", "--job-name", "overhead"]
    out = open(work / "master.out", "wb")  # noqa: SIM115 - closed below
    t_start = time.time()
    master = subprocess.Popen(
        master_cmd(home, args.replicas, flags, command), stdout=out, stderr=subprocess.STDOUT
    )
    sampler = Sampler(master.pid)
    sampler.start()
    try:
        rc = master.wait(timeout=args.seconds + args.timeout)
    except subprocess.TimeoutExpired:
        res.problems.append(f"the master did not end within {args.seconds + args.timeout} s")
        rc = None
    finally:
        sampler.stop()
        left = stop_all(master, str(work))
        out.close()
    t_end = time.time()
    if left:
        res.problems.append(f"{len(left)} process(es) left behind and killed: {left}")
    if rc != 0:
        res.problems.append(f"`trainguard run` exited {rc}")

    store = StoreView(home)
    job = store.job() or {}
    runs = store.runs() if job else []
    store.close()
    if job.get("state") != "SUCCEEDED":
        res.problems.append(f"job state {job.get('state')}, expected SUCCEEDED")
    succeeded = [r for r in runs if r["state"] == "SUCCEEDED" and r["attempt"] == 0]
    if len(succeeded) != args.replicas or len(runs) != args.replicas:
        res.problems.append(f"{len(succeeded)} SUCCEEDED runs of {len(runs)}, {args.replicas}")

    said_total = in_logs = 0
    t0s: list[float] = []
    t1s: list[float] = []
    blocked: list[float] = []
    exit_lag: list[float] = []
    by_replica = {r["replica"]: r for r in runs}
    log_dir = home / "jobs" / str(job.get("id")) / "attempt-0"
    for i in range(args.replicas):
        said, have, t0, t1, blk, problem = check_log(log_dir / f"worker-{i}.log")
        said_total += said
        in_logs += have
        if problem:
            res.problems.append(problem)
            continue
        t0s.append(t0)
        t1s.append(t1)
        blocked.append(blk)
        run = by_replica.get(f"worker-{i}")
        if run and run["ended_at_s"]:
            exit_lag.append(run["ended_at_s"] - t1)

    samples = sampler.samples
    w0, w1 = (min(t0s), max(t1s)) if t0s else (t_start, t_end)
    window = max(1e-9, w1 - w0)
    target = args.replicas * args.rate * args.seconds
    m = res.metrics
    m["replicas x target lines/s"] = f"{args.replicas} x {args.rate:g}"
    m["wall time of `run` (s)"] = t_end - t_start
    m["output window, first start -> last end (s)"] = window
    m["lines printed (all replicas)"] = float(said_total)
    m["lines in the log files"] = float(in_logs)
    m["... of the target"] = 100 * said_total / max(1, target)
    m["lines/s handled by the master (window)"] = in_logs / window
    m["MB/s handled by the master (window)"] = in_logs * 100 / 1e6 / window
    m["master CPU, mean over the run (% of a core)"] = sampler.cpu_pct()
    win_pct = sampler.cpu_pct(w0, w1)
    m["master CPU, mean over the window"] = win_pct
    m["master CPU, peak 0.5 s interval"] = sampler.peak_cpu_pct()
    m["master CPU per 1,000 lines, window (ms)"] = 10 * win_pct * window / max(1, in_logs) * 1000
    m["machine CPU busy in the window (% of all)"] = sampler.machine_pct(w0, w1)
    early = [s for s in samples if s.at_s >= w0] or samples
    m["master RSS at the first replica's start (MiB)"] = (
        early[0].rss_kb / 1024 if early else float("nan")
    )
    m["master RSS peak, VmHWM (MiB)"] = max((s.hwm_kb for s in samples), default=0) / 1024
    m["master RSS end (MiB)"] = samples[-1].rss_kb / 1024 if samples else float("nan")
    m["master threads, peak"] = float(max((s.threads for s in samples), default=0))
    m["replica time blocked writing, max (s)"] = max(blocked, default=float("nan"))
    m["replica time blocked writing, median (s)"] = (
        statistics.median(blocked) if blocked else float("nan")
    )
    m["exit seen by master after last line, max (s)"] = max(exit_lag, default=float("nan"))
    m["SUCCEEDED runs recorded"] = f"{len(succeeded)}/{args.replicas}"
    m["checks"] = "ok" if not res.problems else f"{len(res.problems)} problem(s)"
    return res


def cmd_overhead(args: argparse.Namespace) -> int:
    load = os.getloadavg()[0]  # before this bench adds its own
    results = []
    for i in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="tg-scale-overhead-"))
        try:
            results.append(overhead_once(args, work))
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            else:
                print(f"kept {work}")
        print(f"run {i + 1}/{args.runs}: {results[-1].metrics['checks']}", file=sys.stderr)
    title = (
        f"master overhead: {args.replicas} replicas x {args.rate:g} lines/s x {args.seconds:g} s"
        f" ({args.batch_ms:g} ms batches), {os.cpu_count()} cores, "
        f"load average {load:.2f} before, median of {args.runs} run(s)"
    )
    keys = list(results[0].metrics)
    print_table(title, [(k, "", [r.metrics[k] for r in results]) for k in keys], args.runs)
    problems = [p for r in results for p in r.problems]
    for p in problems[:20]:
        print(f"  PROBLEM: {p}")
    return 1 if problems else 0
