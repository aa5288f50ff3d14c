"""Recovery benchmark: a 2-rank DDP job (gloo, CPU) under `trainguard run` (default flags)
vs `torchrun` and NVIDIA's `ft_launcher` (nvidia-resiliency-ext), in one interleaved run.

Each run launches examples/ddp_train.py with `--crash-at-step K`: on the first attempt
rank 1 SIGKILLs itself, and the launcher must restart the job, which resumes from its
last checkpoint. Per run we measure, from the replicas' own logs (`t=` is time.time()):

  kill -> first step   fault line's t  ->  earliest step line of any later attempt
  cold start           time.time() just before Popen  ->  earliest step line of attempt 0
  recovered            a later attempt printed a step within 60 s of the fault, and exit 0
  identical weights    `final weights sha256` equals an uninterrupted baseline run's

Tools are interleaved (tg, tg-cold, torchrun, ft_launcher, tg, ...). `tg` is
`trainguard run` with no flag (warm start is the default); `tg-cold` adds `--no-preload`.
`torchrun` is stock `torchrun --standalone --max-restarts 3`; `ft_launcher` is the same
command line under `ft_launcher` (pip install nvidia-resiliency-ext; on a machine without
NVIDIA's driver it logs NVML errors and runs on); `torchrun-noshare` (not in the default
list) adds TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the documented workaround for restarts
failing on a stale shared rendezvous store (pytorch/pytorch#135712). Every run gets a fresh
session and is killed as a whole process group at --timeout, so a hung launcher never
blocks the bench.

    python bench/recovery.py --runs 20 --json /tmp/recovery.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = ROOT / "examples" / "ddp_train.py"
RECOVERY_LIMIT_S = 60.0
PHASES = ("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms")
TOOLS = ("tg", "tg-cold", "torchrun", "ft_launcher", "torchrun-noshare")
DEFAULT_TOOLS = TOOLS[:4]
PEERS = ("torchrun", "ft_launcher", "torchrun-noshare")
"""The launchers trainguard is compared with."""

STEP_RE = re.compile(r"^step (\d+) loss \S+ rank (\d+) t=([\d.]+)")
FAULT_RE = re.compile(r"^injected fault: rank \d+ SIGKILLs itself t=([\d.]+)")
SHA_RE = re.compile(r"^final weights sha256 ([0-9a-f]{64})")
ATTEMPT_RE = re.compile(r"attempt[-_](\d+)")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="crash runs per tool")
    p.add_argument("--tools", default=",".join(DEFAULT_TOOLS), help=f"comma list of {TOOLS}")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--crash-at-step", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--timeout", type=float, default=90.0, help="per-run limit, seconds")
    p.add_argument("--json", help="write raw per-run results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    return p.parse_args()


def command(
    tool: str, work: Path, args: argparse.Namespace, crash: bool, nproc: int = 2
) -> list[str]:
    job = [
        str(TRAIN),
        "--ckpt-dir",
        str(work / "ckpt"),
        "--steps",
        str(args.steps),
        "--ckpt-every",
        str(args.ckpt_every),
        "--step-time",
        str(args.step_time),
    ]
    if crash:
        job += ["--crash-at-step", str(args.crash_at_step), "--crash-rank", "1"]
    if tool.startswith("tg"):
        return [
            str(BIN / "trainguard"),
            "--home",
            str(work / "tg"),
            "run",
            "--quiet",
            *(["--no-preload"] if tool == "tg-cold" else []),
            "--nproc-per-node",
            str(nproc),
            "--",
            sys.executable,
            *job,
        ]
    return [
        str(BIN / ("ft_launcher" if tool == "ft_launcher" else "torchrun")),
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "3",
        "--log-dir",
        str(work / "logs"),
        "--redirects",
        "3",
        *job,
    ]


def log_files(tool: str, work: Path) -> list[tuple[int, Path]]:
    """(attempt, file) for every replica log: trainguard's jobs/<id>/attempt-<n>/worker-<i>.log,
    torchrun's (and ft_launcher's) <run>/attempt_<n>/<local_rank>/{stdout,stderr}.log."""
    base = work / "tg" / "jobs" if tool.startswith("tg") else work / "logs"
    out = []
    for f in sorted(base.rglob("*.log")):
        m = ATTEMPT_RE.search(str(f.relative_to(base)))
        out.append((int(m.group(1)) if m else 0, f))
    return out


def _parse(tool: str, work: Path) -> dict:
    steps: list[tuple[int, int, float]] = []  # (attempt, step, t)
    fault_t = sha = None
    attempts = set()
    for attempt, f in log_files(tool, work):
        attempts.add(attempt)
        for line in f.read_text(errors="replace").splitlines():
            if m := STEP_RE.match(line):
                steps.append((attempt, int(m.group(1)), float(m.group(3))))
            elif m := FAULT_RE.match(line):
                fault_t = float(m.group(1))
            elif m := SHA_RE.match(line):
                sha = m.group(1)
    first = [t for a, _, t in steps if a == 0]
    later = [(t, s) for a, s, t in steps if a > 0 and (fault_t is None or t > fault_t)]
    resumed_t, resumed_step = min(later) if later else (None, None)
    return {
        "first_step_t": min(first) if first else None,
        "fault_t": fault_t,
        "resumed_t": resumed_t,
        "resumed_step": resumed_step,
        "sha": sha,
        "attempts": len(attempts),
    }


def _tg_records(work: Path) -> list[dict]:
    home = ["--home", str(work / "tg")]
    tg = str(BIN / "trainguard")
    try:
        jobs = json.loads(
            subprocess.run(
                [tg, *home, "jobs", "--json"], capture_output=True, text=True, timeout=30
            ).stdout
        )
        recs = subprocess.run(
            [tg, *home, "records", jobs[0]["id"], "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return json.loads(recs)
    except (subprocess.SubprocessError, ValueError, IndexError, KeyError):
        return []


def launch(
    cmd: list[str], out_path: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[float, int | None, float]:
    """Run a launcher in its own session: (start time, exit code or None when it ran past
    `timeout`, wall seconds). Its whole group is killed after: workers never outlive it."""
    with open(out_path, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        wall = time.time() - t0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return t0, rc, wall


def run_once(tool: str, args: argparse.Namespace, crash: bool, tmp: Path, n: int) -> dict:
    work = tmp / f"{n:02d}-{tool}{'-crash' if crash else '-clean'}"
    work.mkdir()
    env = dict(os.environ)
    if tool == "torchrun-noshare":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = command(tool, work, args, crash)
    t0, rc, wall = launch(cmd, work / "launcher.out", args.timeout, env)
    timed_out = rc is None
    r = {
        "tool": tool,
        "crash": crash,
        "rc": rc,
        "timed_out": timed_out,
        "wall_s": wall,
        "launch_t": t0,
        **_parse(tool, work),
    }
    r["cold_start_s"] = r["first_step_t"] - t0 if r["first_step_t"] else None
    r["kill_to_step_s"] = r["resumed_t"] - r["fault_t"] if r["resumed_t"] and r["fault_t"] else None
    r["recovered"] = bool(
        crash
        and rc == 0
        and r["kill_to_step_s"] is not None
        and r["kill_to_step_s"] <= RECOVERY_LIMIT_S
    )
    r["records"] = _tg_records(work) if tool.startswith("tg") and crash else []
    if not r["sha"] or rc != 0:
        tail = (work / "launcher.out").read_text(errors="replace").splitlines()[-4:]
        r["launcher_tail"] = tail
    return r


def _stats(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    med = statistics.median(xs)
    s = f"median {med:7.3f} s  min-max {min(xs):.3f}-{max(xs):.3f}"
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        s += f"  IQR {q[0]:.3f}-{q[2]:.3f}"
    return s


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def report(results: list[dict], baseline: str | None, tools: list[str], n: int) -> None:
    print(f"\nbaseline (uninterrupted) sha256: {baseline}")
    meds: dict[str, dict[str, float | None]] = {}
    for tool in tools:
        rs = [r for r in results if r["tool"] == tool and r["crash"]]
        k2s = [r["kill_to_step_s"] for r in rs if r["recovered"]]
        cold = [r["cold_start_s"] for r in rs if r["cold_start_s"] is not None]
        cold += [
            r["cold_start_s"]
            for r in results
            if r["tool"] == tool and not r["crash"] and r["cold_start_s"] is not None
        ]
        same = sum(1 for r in rs if baseline and r["sha"] == baseline)
        meds[tool] = {"k2s": _median(k2s), "cold": _median(cold)}
        timeouts = sum(r["timed_out"] for r in rs)
        print(f"\n[{tool}]  runs {len(rs)}/{n}")
        print(f"  kill -> first step after recovery: {_stats(k2s)}   (recovered runs only)")
        print(f"  cold start -> first step:          {_stats(cold)}   (attempt 0, all runs)")
        print(
            f"  recovered within {RECOVERY_LIMIT_S:.0f} s: {sum(r['recovered'] for r in rs)}/"
            f"{len(rs)}   identical weights: {same}/{len(rs)}   timed out: {timeouts}/"
            f"{len(rs)}   exit codes: {[r['rc'] for r in rs]}"
        )
        recs = [rec for r in rs for rec in r["records"]]
        if recs:
            parts = []
            for k in PHASES:
                vals = [rec[k] for rec in recs if rec.get(k) is not None]
                parts.append(f"{k[:-3]} {statistics.median(vals):.0f}" if vals else f"{k[:-3]} -")
            print(
                f"  restart record phases (median ms over {len(recs)} records): " + ", ".join(parts)
            )
    for ours in (t for t in tools if t.startswith("tg")):
        for other in (t for t in tools if t in PEERS):
            for key, label in (("k2s", "kill -> first step"), ("cold", "cold start")):
                a, b = meds[ours][key], meds[other][key]
                ratio = f"{a / b:.2f}" if a is not None and b else "n/a"
                print(f"ratio {ours}/{other} of medians, {label}: {ratio}")
    peers = [m["k2s"] for t, m in meds.items() if t in PEERS and m["k2s"] is not None]
    if "tg" in meds and meds["tg"]["k2s"] is not None and peers:
        best = min(peers)
        print(
            f"ratio tg / the better peer's median, kill -> first step: "
            f"{meds['tg']['k2s'] / best:.3f} (target <= 0.2)"
        )


def main() -> int:
    args = _args()
    tools = chosen_tools(args.tools)
    results: list[dict] = []
    n = 0
    with scratch("tg-bench-", args.keep) as tmp:
        print(
            f"steps {args.steps}, crash at {args.crash_at_step}, ckpt every {args.ckpt_every}, "
            f"step time {args.step_time}, runs {args.runs}, timeout {args.timeout:.0f} s, "
            f"work dir {tmp}",
            flush=True,
        )
        for tool in tools:  # uninterrupted baselines, one per tool
            n += 1
            r = run_once(tool, args, False, tmp, n)
            results.append(r)
            print(
                f"clean  {tool:17} rc {r['rc']}  wall {r['wall_s']:6.2f} s  "
                f"cold {r['cold_start_s'] or float('nan'):.3f} s  sha {str(r['sha'])[:12]}",
                flush=True,
            )
        shas = {r["sha"] for r in results if r["sha"]}
        baseline = next(iter(shas)) if len(shas) == 1 else None
        if len(shas) > 1:
            print(f"WARNING: uninterrupted runs disagree: {shas}")
        for i in range(args.runs):
            for tool in tools:
                n += 1
                r = run_once(tool, args, True, tmp, n)
                results.append(r)
                k2s = r["kill_to_step_s"]
                print(
                    f"run {i + 1} {tool:17} rc {r['rc']}  wall {r['wall_s']:6.2f} s  "
                    f"attempts {r['attempts']}  kill->step "
                    f"{'-' if k2s is None else f'{k2s:.3f} s'}  resumed at "
                    f"{r['resumed_step']}  same weights {r['sha'] == baseline}"
                    + ("  TIMED OUT" if r["timed_out"] else ""),
                    flush=True,
                )
                if not r["recovered"] and r.get("launcher_tail"):
                    print(
                        "    launcher: " + " | ".join(x.strip()[:160] for x in r["launcher_tail"]),
                        flush=True,
                    )
        report(results, baseline, tools, args.runs)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"args": vars(args), "baseline_sha": baseline, "runs": results}, indent=2
                )
            )
            print(f"raw results: {args.json}")
    return 0


def chosen_tools(text: str, known: Sequence[str] = TOOLS) -> list[str]:
    """The --tools list, each one `known` (else exit with the choices)."""
    tools = [t.strip() for t in text.split(",") if t.strip()]
    if bad := [t for t in tools if t not in known]:
        sys.exit(f"unknown tool(s) {bad}; choose from {tuple(known)}")
    return tools


@contextlib.contextmanager
def scratch(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh work folder for the runs, removed at the end unless `keep` (--keep)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
