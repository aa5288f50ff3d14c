"""Soak: a fault every E seconds (SIGKILL and SIGSTOP in turn) for D seconds, the same
small model trained three ways, each next to a fault-free run of the same length:

  torchft    trainguard run --framework torchft --groups 3 (examples/torchft_train.py):
             a fault costs the victim's group; the others train on
  sync       trainguard run --nproc-per-node 3 (examples/ddp_train.py, the same model as
             plain DDP): every fault restarts the job from its last checkpoint
  torchrun   torchrun --standalone --nproc-per-node 3 --max-restarts 1000, same script:
             restarts on a death; a SIGSTOPped rank stalls its peers until gloo's 60 s
             timeout (torchrun has no hang detection)

Victims never include the observer (torchft: group 0; DDP: rank 0), whose step lines
(`step N ... t=`) measure progress. Per tool, from the replicas' own output:

  throughput kept   committed steps by time D, faulty / fault-free
  healthy restarts  processes restarted that the fault did not hit (trainguard's restart
                    records for torchft; (world-1) per job restart for the DDP tools)
  steps lost/fault  torchft: the observer's steps that did not commit; DDP: steps
                    trained again after each restart (last step before it - resume step)

    python bench/torchft_soak.py                          # 10 minutes, a fault every 30 s
    python bench/torchft_soak.py --duration 120 --tools torchft,sync
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FT = ROOT / "examples" / "torchft_train.py"
DDP = ROOT / "examples" / "ddp_train.py"
WORLD = 3
_STEP = re.compile(r"step (\d+) .*?t=(\d+\.\d+)")
_FT_OBSERVER = re.compile(r"\[worker-0\]: step (\d+) group 0 rank 0 .*t=(\d+\.\d+)")
_DDP_OBSERVER = re.compile(r"step (\d+) loss \S+ rank 0 t=(\d+\.\d+)")


@dataclass
class Result:
    tool: str
    faults: list[str] = field(default_factory=list)
    steps_clean: int = 0
    steps_faulty: int = 0
    healthy_restarts: int = 0
    lost_per_fault: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def kept(self) -> float:
        return self.steps_faulty / self.steps_clean if self.steps_clean else 0.0


def _command(tool: str, home: Path, hang_s: float) -> list[str]:
    tg = [sys.executable, "-m", "trainguard", "run"]
    ddp = [str(DDP), "--steps", "1000000", "--step-time", "0.03", "--ckpt-every", "10"]
    if tool == "torchft":
        return [
            *tg,
            "--framework",
            "torchft",
            "--groups",
            str(WORLD),
            "--job-hang-interval",
            str(hang_s),
            "--",
            sys.executable,
            str(FT),
            "--steps",
            "1000000",
            "--step-time",
            "0.03",
        ]
    if tool == "sync":
        return [
            *tg,
            "--nproc-per-node",
            str(WORLD),
            "--job-hang-interval",
            str(hang_s),
            "--max-restarts",
            "1000",
            "--max-uncertain-restarts",
            "1000",
            "--enable-repeat-detection",
            "false",
            "--max-transient-restarts",
            "1000",
            "--max-num-of-same-error",
            "1000",
            "--",
            sys.executable,
            *ddp,
            "--ckpt-dir",
            str(home / "ck"),
        ]
    return [
        str(BIN / "torchrun"),
        "--standalone",
        f"--nproc-per-node={WORLD}",
        "--max-restarts=1000",
        *ddp,
        "--ckpt-dir",
        str(home / "ck"),
    ]


def _victim_pid(tool: str, home: Path, env: dict[str, str], name: str, tag: str) -> int | None:
    """The pid of the victim now: a trainguard replica by name, a torchrun rank by RANK."""
    if tool != "torchrun":
        res = subprocess.run(
            [sys.executable, "-m", "trainguard", "jobs", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        jobs = json.loads(res.stdout or "[]")
        if not jobs:
            return None
        res = subprocess.run(
            [sys.executable, "-m", "trainguard", "status", jobs[0]["id"], "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for rep in json.loads(res.stdout or "{}").get("replicas", []):
            if rep["name"] == name and rep["state"] == "RUNNING":
                return int(rep["pid"])
        return None
    rank = name.rsplit("-", 1)[1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            environ = proc.joinpath("environ").read_bytes().split(b"\0")
            ours = f"BENCH_TAG={tag}".encode() in environ and f"RANK={rank}".encode() in environ
            if ours and b"ddp_train.py" in proc.joinpath("cmdline").read_bytes():
                return int(proc.name)
    return None


def _one(
    tool: str, duration: float, every: float, hang_s: float, faulty: bool, out: Path
) -> tuple[list[tuple[int, float]], list[str], Path, list[tuple[float, str]]]:
    home = Path(tempfile.mkdtemp(prefix=f"soak-{tool}-", dir=out))
    tag = home.name
    env = {
        **os.environ,
        "TRAINGUARD_HOME": str(home / "tg"),
        "BENCH_TAG": tag,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }
    log = (home / "out.log").open("w")
    t0 = time.time()
    proc = subprocess.Popen(
        _command(tool, home, hang_s),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=home,
        start_new_session=True,
    )
    faults: list[str] = []
    hits: list[tuple[float, str]] = []  # (when, replica) of each fault sent
    kinds = ("SIGKILL", "SIGSTOP")
    k = 0
    victims = ("worker-1", "worker-2")
    try:
        while time.time() - t0 < duration:
            next_at = t0 + every * (k + 1)
            time.sleep(max(0.0, min(next_at, t0 + duration) - time.time()))
            if not faulty or time.time() - t0 >= duration:
                continue
            name, kind = victims[k % 2], kinds[k % 2]
            k += 1
            pid = _victim_pid(tool, home, env, name, tag)
            if pid is None:
                faults.append(f"{time.time() - t0:.0f}s {kind} {name}: not running, skipped")
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, getattr(signal, kind))
            hits.append((time.time(), name))
            faults.append(f"{time.time() - t0:.0f}s {kind} {name} (pid {pid})")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    pattern = _FT_OBSERVER if tool == "torchft" else _DDP_OBSERVER
    steps = [
        (int(m.group(1)), float(m.group(2)))
        for line in (home / "out.log").read_text(errors="replace").splitlines()
        if (m := pattern.search(line))
    ]
    return [(s, t) for s, t in steps if t - t0 <= duration], faults, home, hits


def _max_step(steps: list[tuple[int, float]]) -> int:
    return max((s for s, _ in steps), default=0)


def _restarts_of(steps: list[tuple[int, float]]) -> list[int]:
    """Steps trained again after each restart (the step sequence went back)."""
    lost = []
    for (a, _), (b, _) in itertools.pairwise(steps):
        if b <= a:
            lost.append(a - b + 1)
    return lost


def _torchft_healthy(home: Path, hits: list[tuple[float, str]], notes: list[str]) -> int:
    """Processes restarted that no fault hit: a group restart whose replica was not just
    hit (a healthy group taken for hung: its rank and its store), and every process but
    the victim for a restart of the whole job; each restart is listed in `notes`."""
    env = {**os.environ, "TRAINGUARD_HOME": str(home / "tg")}
    jobs = json.loads(_trainguard(env, "jobs", "--json") or "[]")
    if not jobs:
        return 0
    healthy = 0
    for r in json.loads(_trainguard(env, "records", jobs[0]["id"], "--json") or "[]"):
        decision, at = str(r["decision"]), float(r["at_s"])
        hit = any(name == r["replica"] and 0 <= at - t <= 20 for t, name in hits)
        notes.append(f"restart of {r['replica']} ({'hit' if hit else 'NOT hit'}): {decision[:60]}")
        if decision.startswith("RestartJob"):
            healthy += 2 * WORLD - 1
        elif decision.startswith("RestartGroup") and not hit:
            healthy += 2
    return healthy


def _trainguard(env: dict[str, str], *args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True
    )
    return res.stdout


def run(tool: str, duration: float, every: float, hang_s: float, out: Path) -> Result:
    r = Result(tool)
    clean, _, _, _ = _one(tool, duration, every, hang_s, False, out)
    steps, r.faults, home, hits = _one(tool, duration, every, hang_s, True, out)
    r.steps_clean, r.steps_faulty = _max_step(clean), _max_step(steps)
    done = [f for f in r.faults if "skipped" not in f]
    lost = _restarts_of(steps)
    if tool == "torchft":
        r.healthy_restarts = _torchft_healthy(home, hits, r.notes)
        r.lost_per_fault = len(lost) / max(1, len(done))  # each: one uncommitted step
        if any(n > 1 for n in lost):
            r.notes.append(f"the observer went back {max(lost)} steps once: a job restart")
    else:
        r.healthy_restarts = (WORLD - 1) * len(lost)
        r.lost_per_fault = sum(lost) / max(1, len(done))
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds per run")
    p.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    p.add_argument("--hang-interval", type=float, default=5.0, help="trainguard's, seconds")
    p.add_argument("--tools", default="torchft,sync,torchrun")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="torchft-soak-"))
    results = []
    for tool in args.tools.split(","):
        r = run(tool, args.duration, args.every, args.hang_interval, out)
        results.append(r)
        print(
            f"{tool:9} kept {r.kept:6.1%}  steps {r.steps_faulty}/{r.steps_clean}  "
            f"healthy restarts {r.healthy_restarts:3}  steps lost/fault "
            f"{r.lost_per_fault:5.1f}  faults {len(r.faults)}",
            flush=True,
        )
        for line in [*r.faults, *r.notes]:
            print(f"          {line}")
    print(f"(runs of {args.duration:g} s, a fault every {args.every:g} s; logs in {out})")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "kept": r.kept} for r in results], indent=2))


if __name__ == "__main__":
    main()
