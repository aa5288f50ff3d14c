"""A Slurm node dies under a 2-node DDP job: trainguard (a step per rank, and with node agents)
against `srun torchrun --max-restarts`.

Both run on the same real 3-node Slurm cluster (tests/clusters/slurmcluster.py: slurmctld,
slurmd and munged on hosts that share nothing), in an allocation of 3 nodes (`salloc -N3
--no-kill`), the same example (examples/ddp_train.py, checkpoint every 10 steps), and the
same fault at step 30: the machine of rank 1 dies (`--fault kill`: every process of its
host killed, slurmd, slurmstepd, the rank: their connections close) or is cut off the
network (`--fault cut`: its processes run on, no connection closes). Three tools,
interleaved: `trainguard` (each rank a step, `--no-node-agents`), `agents` (node agents,
the default: a step per node, forking its ranks) and `torchrun`. Measured from the fault:

  detected     trainguard: its restart record; torchrun: the first line of the failure in
               the job's output (torchrun's agent, or srun)
  step again   the first training step any rank prints after the kill

    .venv/bin/python bench/slurm_node_loss.py --runs 3 --fault cut

Needs root (network namespaces), Debian's slurm-wlm and munge (scripts/system_deps.sh).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from slurm_harness import (
    PY,
    ROOT,
    STEP,
    TRAINGUARD,
    SlurmCluster,
    Watch,
    srun_torchrun,
    started_cluster,
)

EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
KILL_AT = 30
FAILURE = re.compile(
    r"ChildFailedError|Worker group FAILED|failed \(exitcode|Node failure|"
    r"Connection closed by peer|CANCELLED AT|Restarting worker",
    re.IGNORECASE,
)


def _args(folder: Path) -> list[str]:
    return [
        EXAMPLE,
        "--steps",
        "200",
        "--step-time",
        "0.05",
        "--ckpt-every",
        "10",
        "--ckpt-dir",
        str(folder / "ckpt"),
    ]


def _trainguard(folder: Path, agents: bool) -> list[str]:
    run = [TRAINGUARD, "run", "--plain", "--job-name", "bench", "--nodes", "2"]
    run += ["--node-agents", "--"] if agents else ["--no-node-agents", "--"]
    return ["salloc", "-N3", "--no-kill", *run, PY, *_args(folder)]


def _torchrun(folder: Path, head: str) -> list[str]:
    srun = srun_torchrun(2, 1, restarts=3, head=head, rdzv_id="bench")
    return ["salloc", "-N3", "--no-kill", *srun, *_args(folder)]


def one(cluster: SlurmCluster, tool: str, wait_s: float, fault: str) -> dict[str, float | None]:
    cluster.heal()
    folder = Path(tempfile.mkdtemp(dir=cluster.hosts.shared))
    env = {**cluster.env, "TRAINGUARD_HOME": str(folder / "home"), "PYTHONUNBUFFERED": "1"}
    if tool == "torchrun":
        argv = _torchrun(folder, cluster.hosts[0].ip)
    else:
        argv = _trainguard(folder, agents=tool == "agents")
    proc = cluster.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder
    )
    watch = Watch(proc)
    deadline = time.time() + 120
    while watch.max_step() < KILL_AT and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    killed = time.time()
    if fault == "cut":
        cluster.cut(1)
    else:
        cluster.kill(1)
    end = killed + wait_s
    again = None
    while time.time() < end and proc.poll() is None:
        again = next(
            (t for t, line in list(watch.lines) if t > killed + 0.3 and STEP.search(line)), None
        )
        if again is not None:
            break
        time.sleep(0.1)
    detected = watch.first_after(killed, FAILURE)
    if tool != "torchrun":
        detected = _record_s(folder) or detected
    try:
        proc.wait(timeout=60)  # trainguard's job finishes; torchrun's may hang
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    cluster.run(["scancel", "--user=root"], timeout=30)  # the allocation, if left
    time.sleep(1)
    cluster.heal()
    if tool == "torchrun":  # how it ended, in its own words
        last = [line for _, line in watch.lines if FAILURE.search(line) or "srun:" in line]
        print("   torchrun's last failure lines:", *last[-4:], sep="\n     ", flush=True)
    return {
        "detected": None if detected is None else detected - killed,
        "again": None if again is None else again - killed,
    }


def _record_s(folder: Path) -> float | None:
    import sqlite3

    db = folder / "home" / "trainguard.db"
    if not db.exists():
        return None
    con = sqlite3.connect(db)
    try:
        row = con.execute("select min(at_s) from restart_records").fetchone()
    finally:
        con.close()
    return None if row is None or row[0] is None else float(row[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--wait", type=float, default=90.0, help="seconds to wait for a step again")
    p.add_argument("--fault", choices=("kill", "cut"), default="kill")
    p.add_argument("--tools", default="trainguard,agents,torchrun")
    a = p.parse_args()
    results: dict[str, list[dict[str, float | None]]] = {t: [] for t in a.tools.split(",")}
    with started_cluster(3) as cluster:
        for i in range(a.runs):
            for tool in results:  # interleaved
                r = one(cluster, tool, a.wait, a.fault)
                results[tool].append(r)
                print(f"run {i} {tool:<10} {r}", flush=True)
    print(f"\nnode {a.fault} at step {KILL_AT} of a 2-node job (3-node allocation), {a.runs} runs:")
    med: dict[str, float | None] = {}
    for tool, rows in results.items():
        det = [r["detected"] for r in rows if r["detected"] is not None]
        ok = [r["again"] for r in rows if r["again"] is not None]
        med[tool] = statistics.median(ok) if ok else None
        det_s = f"{statistics.median(det):.1f} s" if det else "never"
        again_s = f"{statistics.median(ok):.1f} s" if ok else f"never (within {a.wait:g} s)"
        print(
            f"  {tool:<10} detected {det_s:>8} (median)   step again {again_s} "
            f"(median; {len(ok)}/{len(rows)} runs trained again)"
        )
    tr = med.get("torchrun")
    for tool in ("trainguard", "agents"):
        tg = med.get(tool)
        if tg is not None and tr is not None:
            print(f"  ratio {tool}/torchrun (step again): {tg / tr:.3f}")
        elif tg is not None and "torchrun" in med:
            print(f"  torchrun did not train again within {a.wait:g} s in any run")


if __name__ == "__main__":
    main()
