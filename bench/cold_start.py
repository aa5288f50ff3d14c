"""Cold start benchmark: `run` -> the first step of every rank, for a DDP job (gloo, CPU) of
2, 8 and 32 ranks on this machine, under `trainguard run` (default flags: warm start),
`trainguard run --no-preload`, and `torchrun --standalone`, interleaved in one run.

Each rank of examples/ddp_train.py prints `step 1 ... t=<time.time()>` after its first
step; the time of the last rank's first step minus the time just before the launcher was
started is the cold start (the job is up when every rank has stepped). Each run is a fresh
session, killed as a group at --timeout.

    python bench/cold_start.py --ranks 2,8,32 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from recovery import STEP_RE, chosen_tools, command, launch, log_files, scratch

TOOLS = ("tg", "tg-cold", "torchrun")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,8,32", help="comma list of world sizes")
    p.add_argument("--runs", type=int, default=3, help="runs per tool and world size")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {TOOLS}")
    p.add_argument("--timeout", type=float, default=300.0, help="per-run limit, seconds")
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = p.parse_args()
    # What recovery.command reads: a short job, no checkpoint to speak of, no fault.
    args.steps, args.ckpt_every, args.step_time = 3, 1000, 0.0
    return args


def run_once(tool: str, nproc: int, args: argparse.Namespace, work: Path) -> dict[str, object]:
    work.mkdir(parents=True)
    cmd = command(tool, work, args, crash=False, nproc=nproc)
    t0, rc, _ = launch(cmd, work / "launcher.out", args.timeout)
    first: dict[int, float] = {}  # rank -> t of its first step
    for _, log in log_files(tool, work):
        for line in log.read_text(errors="replace").splitlines():
            if (m := STEP_RE.match(line)) and int(m.group(1)) == 1:
                first.setdefault(int(m.group(2)), float(m.group(3)))
    up = max(first.values()) - t0 if len(first) == nproc else None
    return {"tool": tool, "ranks": nproc, "rc": rc, "all_ranks_stepped_s": up}


def main() -> int:
    args = _args()
    tools = chosen_tools(args.tools, TOOLS)
    sizes = [int(n) for n in args.ranks.split(",") if n.strip()]
    print(f"{os.cpu_count()} cores, ranks {sizes}, runs {args.runs}, tools {tools}", flush=True)
    results: list[dict[str, object]] = []
    with scratch("tg-cold-", args.keep) as tmp:
        for i in range(args.runs):
            for nproc in sizes:
                for tool in tools:
                    r = run_once(tool, nproc, args, tmp / f"{i}-{nproc}-{tool}")
                    results.append(r)
                    up = r["all_ranks_stepped_s"]
                    print(
                        f"run {i + 1} ranks {nproc:3} {tool:8} rc {r['rc']}  all ranks stepped "
                        f"{'-' if up is None else f'{up:.2f} s'}",
                        flush=True,
                    )
        print()
        for nproc in sizes:
            meds: dict[str, float] = {}
            for tool in tools:
                ups = [
                    float(str(r["all_ranks_stepped_s"]))
                    for r in results
                    if r["tool"] == tool and r["ranks"] == nproc and r["all_ranks_stepped_s"]
                ]
                if ups:
                    meds[tool] = statistics.median(ups)
                    print(
                        f"ranks {nproc:3} {tool:8} run -> every rank's first step: median "
                        f"{meds[tool]:.2f} s, min-max {min(ups):.2f}-{max(ups):.2f} "
                        f"({len(ups)}/{args.runs} ok)"
                    )
            for ours in ("tg", "tg-cold"):
                if ours in meds and "torchrun" in meds:
                    print(
                        f"ranks {nproc:3} ratio {ours}/torchrun of medians: "
                        f"{meds[ours] / meds['torchrun']:.2f}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
