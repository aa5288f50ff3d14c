"""Chaos benchmark (R-CKPT-3, "nothing lost"): the deterministic DDP example through a
schedule of faults, over several seeds, each final model compared bit for bit with a
fault-free run.

Faults, injected with `trainguard run --inject` at a seeded random time of the running
attempt (35-70% into the fault-free runs' replicas' run, counted as --inject counts, from
the attempt's RUNNING): SIGKILL of a rank, SIGSEGV, a hang
(SIGSTOP, found by the hang detector), a SIGTERM "preemption", and a SIGKILL of the
master followed by `trainguard resume`.

With `--snapshot` the example keeps every step's state in memory (`sdk.snapshot`) and
resumes from the newest step all ranks hold; it also prints what a snapshot costs. Each
line then shows the steps redone per fault (step lines of rank 0 beyond the run's own
steps) next to the time lost.

    python bench/chaos.py --seeds 3
    python bench/chaos.py --seeds 3 --snapshot
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_train.py"
TRAIN_ARGS = ("--steps", "150", "--ckpt-every", "10", "--step-time", "0.03")
SHA = re.compile(r"final weights sha256 ([0-9a-f]{64})")
STEP0 = re.compile(r"^step \d+ loss \S+ rank 0 ", re.M)
COST = re.compile(r"snapshot cost rank \d+: ([\d.]+) ms median per step, ([\d.]+)% of a step")

FAULTS = {
    "sigkill": ("signal:worker-1:SIGKILL@{t}s",),
    "sigsegv": ("signal:worker-0:SEGV@{t}s",),
    "hang": ("stop:worker-1@{t}s", "--job-hang-interval", "4"),
    "preempt": ("signal:worker-1:SIGTERM@{t}s",),
    "master": ("master@{t}s",),
}


def _tg(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "trainguard", "--home", str(home), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def one_run(work: Path, fault: str | None, t: float, snapshot: bool) -> dict[str, object]:
    home = work / f"{fault or 'clean'}-{time.monotonic_ns()}"
    ckpt = home / "ckpt"
    extra: list[str] = []
    if fault is not None:
        spec, *flags = FAULTS[fault]
        extra = ["--inject", spec.format(t=f"{t:.2f}"), *flags]
    cmd = [sys.executable, str(EXAMPLE), *TRAIN_ARGS, "--ckpt-dir", str(ckpt)]
    cmd += ["--snapshot"] if snapshot else []
    t0 = time.monotonic()
    res = _tg(
        home, "run", "--quiet", "--nproc-per-node", "2", "--job-name", "chaos", *extra, "--", *cmd
    )
    if fault == "master":  # the master killed itself: resume the job
        res = _tg(home, "resume", "chaos", "--quiet")
    wall = time.monotonic() - t0
    logs = "".join(p.read_text(errors="replace") for p in sorted(home.glob("jobs/*/*/*.log")))
    digest = SHA.search(logs)
    status = json.loads(_tg(home, "status", "chaos", "--json").stdout or "{}")
    started = [r["started_at_s"] for r in status.get("replicas", []) if r.get("started_at_s")]
    ended = [r["ended_at_s"] for r in status.get("replicas", []) if r.get("ended_at_s")]
    return {
        "fault": fault,
        "rc": res.returncode,
        "wall_s": wall,
        "attempts": int(status.get("attempts", 0)),
        # from the job's creation to its replicas' start, and how long they then ran
        "lead_s": min(started) - status["created_at_s"] if started else 0.0,
        "run_s": max(ended) - min(started) if started and ended else 0.0,
        "sha": digest[1] if digest else None,
        "redone": len(STEP0.findall(logs)) - int(TRAIN_ARGS[1]),
        "cost": [(float(a), float(b)) for a, b in COST.findall(logs)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--snapshot", action="store_true", help="in-memory snapshots every step")
    args = p.parse_args()
    faults = args.faults.split(",")
    with tempfile.TemporaryDirectory(prefix="tg-chaos-") as tmp:
        work = Path(tmp)
        clean = [one_run(work, None, 0, args.snapshot) for _ in range(2)]
        base = clean[0]["sha"]
        assert base and all(c["sha"] == base for c in clean), clean
        clean_wall = statistics.median(float(str(c["wall_s"])) for c in clean)
        lead = statistics.median(float(str(c["lead_s"])) for c in clean)
        run = statistics.median(float(str(c["run_s"])) for c in clean)
        print(
            f"fault-free: sha256 {str(base)[:12]}, wall {clean_wall:.1f} s (median of 2); "
            f"replicas start {lead:.1f} s after the job and run {run:.1f} s: faults land in "
            "35-70% of that run"
        )
        costs = [c for r in clean for c in r["cost"]]  # type: ignore[attr-defined]
        if costs:
            print(
                f"snapshot cost: {statistics.median(c[0] for c in costs):.2f} ms median, "
                f"{statistics.median(c[1] for c in costs):.1f}% of a step (without the "
                f"--step-time sleep), over {len(costs)} ranks of the fault-free runs"
            )
        totals = {"runs": 0, "recovered": 0, "mismatches": 0}
        for fault in faults:
            rows = []
            for seed in range(args.seeds):
                # Within the replicas' run (--inject counts from the attempt's RUNNING, after
                # the zygote's imports): a fault after the job ended would find nothing to
                # do (and a master fault, nothing to resume).
                t = random.Random(f"{fault}-{seed}").uniform(0.35, 0.7) * run
                rows.append(one_run(work, fault, t, args.snapshot))
            ok = [r for r in rows if r["rc"] == 0 and r["sha"] is not None]
            bad = [r for r in ok if r["sha"] != base]
            lost = [float(str(r["wall_s"])) - clean_wall for r in ok]
            totals["runs"] += len(rows)
            totals["recovered"] += len(ok)
            totals["mismatches"] += len(bad)
            print(
                f"{fault:<8} runs {len(rows)}, recovered {len(ok)}, mismatches {len(bad)}, "
                f"attempts {[r['attempts'] for r in rows]}, time lost per fault "
                f"{statistics.median(lost) if lost else float('nan'):.1f} s median, steps redone "
                f"{[r['redone'] for r in ok]}"
            )
        print(
            f"total: {totals['runs']} runs, {totals['runs']} faults injected, "
            f"{totals['recovered']} recovered, {totals['mismatches']} mismatches"
        )


if __name__ == "__main__":
    main()
