"""What the scale benchmarks (bench/scale.py) share: /proc sampling of the master, starting
and stopping it, reading its store, and the median tables they print."""

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


# ------------------------------------------------------------------ runs of one measurement


@dataclass
class RestartResult:
    metrics: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def runs_and_table(
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
