"""Chatty replica benchmark (issue 37): how many bytes a replica that prints fast gets out
in N seconds under `trainguard run` with progress read from its output (the default) and
with `--no-progress`, interleaved in one run.

The replica (tests/bins/chatty_output.py) writes --line-byte lines at --rate bytes/s for
--seconds and says how many bytes it got out and how long it was blocked in write(). A
master that reads progress a line at a time on the replica's path holds it back: its
bytes fall far below the --no-progress arm's. Prints per arm and style the median and
spread of MiB out and of seconds blocked, and the ratio progress / --no-progress of the
medians (1.0: not held back at all).

    python bench/chatty_output.py --seconds 10 --rate 50e6 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHATTY = ROOT / "tests" / "bins" / "chatty_output.py"
ARMS = {"progress": [], "no-progress": ["--no-progress"]}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="how long the replica prints")
    p.add_argument("--rate", type=float, default=50e6, help="bytes/s the replica tries")
    p.add_argument("--line", type=int, default=1024, help="bytes a line")
    p.add_argument("--styles", default="step,plain", help="comma list of step, plain")
    p.add_argument("--runs", type=int, default=3, help="runs per arm and style")
    p.add_argument("--timeout", type=float, default=120.0, help="per-run limit, seconds")
    return p.parse_args()


def run_once(arm: str, style: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    out = work / "out.json"
    cmd = [
        str(Path(sys.executable).parent / "trainguard"),
        "run",
        "--quiet",
        *ARMS[arm],
        "--",
        sys.executable,
        str(CHATTY),
        str(args.seconds),
        str(args.rate),
        str(out),
        style,
        str(args.line),
    ]
    env = {**os.environ, "TRAINGUARD_HOME": str(work / "home")}
    res = subprocess.run(cmd, env=env, capture_output=True, timeout=args.timeout, check=False)
    if res.returncode != 0 or not out.is_file():
        raise SystemExit(f"{arm} {style}: rc {res.returncode}: {res.stderr.decode()[-2000:]}")
    got = json.loads(out.read_text())
    return {"mib": got["bytes"] / 2**20, "blocked_s": got["blocked_s"]}


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):8.1f}, min-max {min(xs):.1f}-{max(xs):.1f}"


def main() -> int:
    args = _args()
    styles = [s for s in args.styles.split(",") if s]
    target = args.rate * args.seconds / 2**20
    print(
        f"{os.cpu_count()} cores, {args.line}-byte lines at {args.rate / 1e6:g} MB/s for "
        f"{args.seconds:g} s (target {target:.0f} MiB), runs {args.runs}",
        flush=True,
    )
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tg-chatty-") as tmp:
        for i in range(args.runs):
            for style in styles:
                for arm in ARMS:
                    work = Path(tmp) / f"{i}-{style}-{arm}"
                    work.mkdir()
                    r = run_once(arm, style, args, work)
                    got.setdefault((style, arm), []).append(r)
                    print(
                        f"run {i + 1} {style:5} {arm:11} {r['mib']:7.1f} MiB out, "
                        f"blocked {r['blocked_s']:.2f} s",
                        flush=True,
                    )
    print()
    for style in styles:
        meds = {}
        for arm in ARMS:
            rs = got[(style, arm)]
            mib = [r["mib"] for r in rs]
            meds[arm] = statistics.median(mib)
            print(f"{style:5} {arm:11} MiB out:   {_spread(mib)}")
            print(f"{style:5} {arm:11} blocked s: {_spread([r['blocked_s'] for r in rs])}")
        ratio = meds["progress"] / meds["no-progress"] if meds["no-progress"] else float("nan")
        print(f"{style:5} ratio progress / no-progress of the medians: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
