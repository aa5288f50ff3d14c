"""Scale (R-RUN-1): the master's overhead under heavy logs, and restarts of many replicas.

Two measurements of one `trainguard run` process (the embedded master), each in a fresh
state directory:

    overhead  N replicas each print RATE ~100-byte lines/s for SECONDS, then exit 0 with a
              marker `DONE lines=K ...`. The master's CPU time (utime + stime) and memory
              (VmRSS, VmHWM) are sampled from /proc every 0.5 s. Checks: the job SUCCEEDED,
              every replica's exit is recorded (N SUCCEEDED runs), and every log file holds
              exactly the K numbered lines its replica says it printed (no gap, no
              duplicate), plus the marker. Reports the rate achieved (lines in the logs per
              second of the output window), how long replicas were blocked writing to the
              master's pipe, and how late the master recorded each exit.

    restart   N sleeping replicas (tests/bins/child.py `*:pidfile:P *:forever`). Times
              `run` -> all N RUNNING in the store and -> all N replica programs executing
              (their pid files), then SIGKILLs K replicas at once (never rank 0). Sync mode
              must make exactly one job restart (attempt 1 with all N running again); async
              mode K RestartReplica records and no new attempt. The job is then cancelled
              (SIGINT to the master: CANCELLED), and the cancel is timed too.

    spawn     N replicas that cost nothing to start (`sleep`, exec'd through a link in the
              temporary folder): times `run` -> first and -> all N exec'd (children of the
              master that are `sleep` by now), i.e. the master's own cost per spawn, which
              `restart` hides behind N Python start-ups on a machine with few cores; the
              master's thread count with N running; then the cancel.

    python bench/scale.py overhead --replicas 64 --rate 1000 --seconds 20
    python bench/scale.py restart --replicas 256 --kill 10 --mode async
    python bench/scale.py spawn --replicas 256 --runs 3

With `--runs R` every figure is the median of R runs. Exit status 1 if a check failed.
Every process started is stopped at the end (the master, then any leftover replica found
by its command line, which names this run's temporary folder).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "tests" / "bins" / "child.py"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

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


# ------------------------------------------------------------------ /proc sampling


@dataclass(frozen=True)
class Sample:
    at_s: float
    cpu_s: float  # utime + stime of the process (not its children)
    rss_kb: int
    hwm_kb: int
    threads: int


def proc_sample(pid: int) -> Sample | None:
    """The process's CPU time, memory and thread count now; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        with open(f"/proc/{pid}/status") as fh:
            status = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) * TICK_S  # fields 14 and 15 of stat(5)
    values: dict[str, int] = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            values[key] = int(rest.split()[0])
    if "VmRSS" not in values:  # a zombie has no memory left
        return None
    return Sample(time.time(), cpu, values["VmRSS"], values["VmHWM"], values.get("Threads", 0))


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        cols = [int(x) for x in fh.readline().split()[1:]]
    idle = cols[3] + cols[4]
    total = sum(cols[:8])
    return (total - idle) * TICK_S, total * TICK_S


class Sampler:
    """Samples one process every `interval_s` in a thread, until it is gone or stopped."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.machine: list[tuple[float, float, float]] = []  # (at_s, busy_s, total_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = proc_sample(self.pid)
            if s is None:
                return
            self.samples.append(s)
            self.machine.append((s.at_s, *machine_busy_s()))
            self._stop.wait(self.interval_s)

    def cpu_pct(self, t0: float | None = None, t1: float | None = None) -> float:
        """The process's mean CPU use, in % of one core, between the samples nearest t0, t1."""
        pts = [s for s in self.samples if (t0 is None or s.at_s >= t0)]
        pts = [s for s in pts if (t1 is None or s.at_s <= t1)]
        if len(pts) < 2:
            return float("nan")
        return 100 * (pts[-1].cpu_s - pts[0].cpu_s) / (pts[-1].at_s - pts[0].at_s)

    def peak_cpu_pct(self) -> float:
        s = self.samples
        rates = [
            100 * (b.cpu_s - a.cpu_s) / (b.at_s - a.at_s)
            for a, b in itertools.pairwise(s)
            if b.at_s > a.at_s
        ]
        return max(rates, default=float("nan"))

    def machine_pct(self, t0: float, t1: float) -> float:
        """The whole machine's busy CPU, in % of all its cores, between t0 and t1."""
        pts = [m for m in self.machine if t0 <= m[0] <= t1]
        if len(pts) < 2:
            return float("nan")
        return 100 * (pts[-1][1] - pts[0][1]) / (pts[-1][2] - pts[0][2])


# ------------------------------------------------------------------ processes and the store


def master_cmd(home: Path, nproc: int, flags: Sequence[str], command: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainguard",
        "--home",
        str(home),
        "run",
        "--quiet",
        "--nproc-per-node",
        str(nproc),
        *flags,
        "--",
        *command,
    ]


def pids_naming(marker: str) -> list[int]:
    """Processes of this user whose command line contains `marker` (not this one)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found


def stop_all(master: subprocess.Popen[bytes] | None, marker: str) -> list[int]:
    """Stop the master (SIGINT, then SIGKILL), then any leftover naming `marker`.

    Returns the leftovers that had to be killed (there should be none)."""
    if master is not None and master.poll() is None:
        master.send_signal(signal.SIGINT)
        try:
            master.wait(timeout=60)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()
    left = pids_naming(marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


class StoreView:
    """Read-only queries on the SQLite store of one state directory."""

    def __init__(self, home: Path) -> None:
        self.db = home / "trainguard.db"
        self._conn: sqlite3.Connection | None = None
        self.job_id: str | None = None

    def _c(self) -> sqlite3.Connection | None:
        if self._conn is None:
            if not self.db.exists():
                return None
            try:
                self._conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
            except sqlite3.Error:
                return None
            self._conn.row_factory = sqlite3.Row
        return self._conn

    def rows(self, sql: str, *params: object) -> list[dict[str, Any]]:
        conn = self._c()
        if conn is None:
            return []
        try:
            return [dict(r) for r in conn.execute(sql, params).fetchall()]
        except sqlite3.OperationalError:  # no tables yet
            return []

    def job(self) -> dict[str, Any] | None:
        rows = self.rows("SELECT * FROM jobs")
        if rows:
            self.job_id = rows[0]["id"]
        return rows[0] if rows else None

    def runs(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM replica_runs WHERE job_id = ? ORDER BY id", self.job_id)

    def transitions(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM transitions WHERE job_id = ? ORDER BY id", self.job_id)

    def attempts(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", self.job_id)

    def restarts(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM restart_records WHERE job_id = ? ORDER BY id", self.job_id)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


# ------------------------------------------------------------------ reporting


def fmt(value: object, unit: str = "") -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        if abs(value) >= 10 and abs(value) < 1000:
            text = f"{value:.1f}"
        return f"{text}{unit}"
    return f"{value}{unit}"


def print_table(title: str, rows: list[tuple[str, str, list[object]]], runs: int) -> None:
    """One line per metric: the median over runs (and min..max when runs > 1)."""
    print(f"\n== {title}")
    for label, unit, values in rows:
        nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            med = float(statistics.median(nums))
            text = fmt(med, unit)
            if runs > 1:
                text += f"   (min {fmt(float(min(nums)), unit)}, max {fmt(float(max(nums)), unit)})"
        else:
            text = " / ".join(str(v) for v in values)
        print(f"  {label:<46} {text}")


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


# ------------------------------------------------------------------ restart


@dataclass
class RestartResult:
    metrics: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


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


def _runs_and_table(
    args: argparse.Namespace,
    once: Callable[[argparse.Namespace, Path], RestartResult],
    prefix: str,
    title: str,
    load: float,
) -> int:
    """Run `once` --runs times in fresh folders, then one table of their metrics."""
    results = []
    for i in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix=f"tg-scale-{prefix}-"))
        try:
            results.append(once(args, work))
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            else:
                print(f"kept {work}")
        print(f"run {i + 1}/{args.runs}: {results[-1].metrics['checks']}", file=sys.stderr)
    keys: list[str] = []
    for r in results:
        keys += [key for key in r.metrics if key not in keys]
    rows = [(key, "", [r.metrics.get(key, "-") for r in results]) for key in keys]
    print_table(
        f"{title}, load average {load:.2f} before, median of {args.runs} run(s)", rows, args.runs
    )
    problems = [p for r in results for p in r.problems]
    for p in problems[:20]:
        print(f"  PROBLEM: {p}")
    return 1 if problems else 0


def cmd_restart(args: argparse.Namespace) -> int:
    if not 0 < args.kill < args.replicas:
        sys.exit("scale.py: --kill must be between 1 and --replicas - 1 (rank 0 is spared)")
    load = os.getloadavg()[0]  # before this bench adds its own
    title = (
        f"restart: {args.replicas} replicas, SIGKILL {args.kill} at once, {args.mode} mode, "
        f"{os.cpu_count()} cores"
    )
    return _runs_and_table(args, restart_once, "restart", title, load)


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
    return _runs_and_table(args, spawn_once, "spawn", title, load)


# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead", help="master CPU and memory under heavy replica output")
    o.add_argument("--replicas", type=int, default=64)
    o.add_argument("--rate", type=float, default=1000, help="lines per second per replica")
    o.add_argument("--seconds", type=float, default=20)
    o.add_argument("--batch-ms", type=float, default=20, help="one write per replica per tick")
    o.add_argument("--timeout", type=float, default=120, help="beyond --seconds")
    r = sub.add_parser("restart", help="start many sleeping replicas, kill some at once")
    r.add_argument("--replicas", type=int, default=256)
    r.add_argument("--kill", type=int, default=10)
    r.add_argument("--mode", choices=("sync", "async"), default="sync")
    r.add_argument("--timeout", type=float, default=180, help="for each wait")
    r.add_argument("--settle", type=float, default=2.0, help="wait before counting records")
    s = sub.add_parser("spawn", help="the master's own cost per spawn: replicas that exec sleep")
    s.add_argument("--replicas", type=int, default=256)
    for sp in (o, r, s):
        sp.add_argument("--runs", type=int, default=1)
        sp.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = p.parse_args(argv)
    commands = {"overhead": cmd_overhead, "restart": cmd_restart, "spawn": cmd_spawn}
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
