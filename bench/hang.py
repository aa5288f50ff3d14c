"""Hang benchmark: how long after the last sign of life a hang is detected, and how long
the stack snapshot of every replica takes, for 2 and 8 replicas.

Each run starts N small replicas that print one line and then stall forever in a
function, under `trainguard run --job-hang-interval I --max-restarts 0`. From the store:

  detection delay   hang detected (failure record) - the last line any replica printed
  snapshot time     the py-spy snapshots of all N replicas, taken in parallel (--native)

    python bench/hang.py --runs 3 --interval 2

False positives at a cold start (`--cold N`): N runs of a real 2-rank gloo DDP job
(examples/ddp_train.py, which imports torch before it prints anything) with the page
cache dropped before each (as root; otherwise the runs are only as cold as the machine),
under `--job-hang-interval 3`: every hang report counts, whatever it concluded.

    python bench/hang.py --cold 20 --runs 5 --interval 3 --replicas 2
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPLICA = (
    "import time\n"
    "def stalled_here():\n"
    "    while True:\n"
    "        time.sleep(3600)\n"
    "print(f'alive t={time.time():.6f}', flush=True)\n"
    "stalled_here()\n"
)


def _tg(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "trainguard", "--home", str(home), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def one_run(n: int, interval: float, work: Path) -> dict[str, float]:
    home = work / f"home-{n}-{time.monotonic_ns()}"
    res = _tg(
        home,
        "run",
        "--quiet",
        "--nproc-per-node",
        str(n),
        "--job-hang-interval",
        str(interval),
        "--max-restarts",
        "0",
        "--",
        sys.executable,
        "-c",
        REPLICA,
    )
    jobs = json.loads(_tg(home, "jobs", "--json").stdout)
    job_id = jobs[0]["id"]
    failures = json.loads(_tg(home, "explain", job_id, "--json").stdout)["failures"]
    snaps = json.loads(_tg(home, "stacks", job_id, "--json").stdout)
    last = 0.0
    log_dir = Path(json.loads(_tg(home, "status", job_id, "--json").stdout)["log_dir"])
    for log in (log_dir / "attempt-0").glob("worker-*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("alive t="):
                last = max(last, float(line.split("=", 1)[1]))
    ok = sum(1 for s in snaps[0]["snapshots"] if s["ok"]) if snaps else 0
    return {
        "rc": float(res.returncode),
        "detect_delay_s": failures[0]["at_s"] - last,
        "snapshot_ms": snaps[0]["duration_ms"] if snaps else float("nan"),
        "snapshots_ok": float(ok),
    }


# What the master says of a hang (detected, cleared, at start-up), not paths that hold "hang"
_HANG_SAID = re.compile(r"hang detected|hung|start-up hang|still importing|hang cleared", re.I)
DDP = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"


def _drop_caches() -> bool:
    """Empty the page cache, so torch is read from disk again; False if not allowed."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def cold_run(interval: float, work: Path) -> dict[str, float]:
    home = work / f"cold-{time.monotonic_ns()}"
    cold = _drop_caches()
    t0 = time.monotonic()
    res = _tg(
        home,
        "run",
        "--nproc-per-node",
        "2",
        "--job-hang-interval",
        str(interval),
        "--max-restarts",
        "0",
        "--",
        sys.executable,
        str(DDP),
        "--steps",
        "20",
        "--ckpt-dir",
        str(home / "ckpt"),
    )
    wall = time.monotonic() - t0
    job_id = json.loads(_tg(home, "jobs", "--json").stdout)[0]["id"]
    said = [x for x in res.stderr.splitlines() if x.startswith("trainguard:")]
    failures = json.loads(_tg(home, "explain", job_id, "--json").stdout)["failures"]
    return {
        "rc": float(res.returncode),
        "cold": float(cold),
        "wall_s": wall,
        "failures": float(len(failures)),
        "hang_words": float(sum(bool(_HANG_SAID.search(x)) for x in said)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--replicas", default="2,8")
    p.add_argument("--cold", type=int, default=0, help="also N cold starts of a 2-rank DDP job")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-hang-bench-") as tmp:
        if args.cold:
            cold = [cold_run(args.interval, Path(tmp)) for _ in range(args.cold)]
            walls = [r["wall_s"] for r in cold]
            print(
                f"{args.cold} starts of a 2-rank DDP job (page cache dropped before "
                f"{sum(int(r['cold']) for r in cold)} of them), interval {args.interval:g} s: "
                f"{sum(r['failures'] > 0 for r in cold):.0f} with a failure, "
                f"{sum(r['hang_words'] > 0 for r in cold):.0f} where the master reported a hang; "
                f"exit codes {sorted({int(r['rc']) for r in cold})}; wall "
                f"{statistics.median(walls):.1f} s median (min {min(walls):.1f}, "
                f"max {max(walls):.1f})",
                flush=True,
            )
        for n in (int(x) for x in args.replicas.split(",")):
            runs = [one_run(n, args.interval, Path(tmp)) for _ in range(args.runs)]
            delay = [r["detect_delay_s"] for r in runs]
            snap = [r["snapshot_ms"] for r in runs]
            print(
                f"{n} replicas, interval {args.interval:g} s, {args.runs} runs: "
                f"detected {statistics.median(delay):.2f} s after the last output "
                f"(min {min(delay):.2f}, max {max(delay):.2f}; i.e. "
                f"+{statistics.median(delay) - args.interval:.2f} s over the interval); "
                f"snapshot of all {n} replicas {statistics.median(snap):.0f} ms median "
                f"(min {min(snap):.0f}, max {max(snap):.0f}); "
                f"snapshots ok {min(r['snapshots_ok'] for r in runs):.0f}/{n}; "
                f"exit codes {[int(r['rc']) for r in runs]}"
            )


if __name__ == "__main__":
    main()
