"""Many tiny ranks in a real Slurm allocation: what supervising them costs the batch host,
under trainguard (each rank a step, `--no-node-agents`), trainguard with node agents (the
default: a step per node) and `srun torchrun` (a torchrun agent per node), interleaved
(issue 40).

The cluster is tests/clusters/slurmcluster.py: Debian's slurmctld, slurmd and munged on 3
hosts that share nothing (network namespaces on this machine); host 0 is both the batch
host and a node. The ranks import nothing: they print `up RANK`, then a line every 0.1 s
for `--hold` seconds, and exit 0. The numbers are about supervision, not training.

  ready        the command -> every rank's `up` line seen in its output
  procs, RSS   what runs on the batch host under the command (salloc's descendants: the
               master and its srun processes; the agents and torchrun run under slurmstepd,
               on the nodes, and are not counted), in steady state
  steps        the job's running Slurm steps (`squeue -s`), in steady state
  CPU          those processes' CPU, % of one core, over `--window` s of every rank
               printing 10 lines/s
  ctld         slurmctld's CPU seconds from the command to every rank up

    .venv/bin/python bench/slurm_scale.py --per-node 4,16,32 --runs 2

Needs root (network namespaces), Debian's slurm-wlm and munge (scripts/system_deps.sh).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_harness import PY, TRAINGUARD, SlurmCluster, Watch, srun_torchrun, started_cluster

NODES = 3
TICK = os.sysconf("SC_CLK_TCK")
READY_S = 120.0  # past it, a tool never had every rank up
UP = re.compile(r"up (\d+)")  # srun may join two ranks' lines: "up 1up 0"
RANK = """\
import os, sys, time
rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID")
print(f"up {rank}", flush=True)
end = time.time() + float(sys.argv[1])
i = 0
while time.time() < end:
    print(f"rank {rank} line {i}", flush=True)
    i += 1
    time.sleep(0.1)
"""


def _argv(tool: str, per_node: int, script: Path, hold: float, head: str) -> list[str]:
    program = [PY, str(script), f"{hold:g}"]
    if tool == "torchrun":
        srun = srun_torchrun(NODES, per_node, restarts=0, head=head, rdzv_id="scale")
        return ["salloc", f"-N{NODES}", "--no-kill", *srun, *program[1:]]
    run = [TRAINGUARD, "run", "--plain", "--job-name", "scale", "--nodes", str(NODES)]
    run += ["--nproc-per-node", str(per_node), "--no-preload"]
    run += ["--node-agents", "--"] if tool == "agents" else ["--no-node-agents", "--"]
    return ["salloc", f"-N{NODES}", "--no-kill", *run, *program]


def _tree(root: int) -> list[int]:
    """`root`'s descendants (not itself), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(m[1]) if m else 0
    return total / 1024


def _steps(cluster: SlurmCluster) -> int:
    res = cluster.run(["squeue", "-h", "-s", "-o", "%j"], timeout=30)
    return sum(1 for name in res.stdout.split() if name not in ("extern", "batch"))


def one(
    cluster: SlurmCluster, tool: str, per_node: int, hold: float, window: float
) -> dict[str, Any]:
    cluster.heal()
    folder = Path(tempfile.mkdtemp(dir=cluster.hosts.shared))
    script = folder / "rank.py"
    script.write_text(RANK)
    env = {**cluster.env, "TRAINGUARD_HOME": str(folder / "home"), "PYTHONUNBUFFERED": "1"}
    ctld = cluster.node(0).daemons["slurmctld"].pid
    ctld0 = _cpu_s([ctld])
    argv = _argv(tool, per_node, script, hold, cluster.hosts[0].ip)
    t0 = time.monotonic()
    proc = cluster.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder
    )
    watch = Watch(proc)
    want = NODES * per_node
    ready = None
    while time.monotonic() - t0 < READY_S:
        ended = proc.poll() is not None
        up = {m[1] for _, line in list(watch.lines) for m in UP.finditer(line)}
        if len(up) >= want:
            ready = time.monotonic() - t0
            break
        if ended:
            break
        time.sleep(0.05)
    ctld_s = _cpu_s([ctld]) - ctld0
    row: dict[str, Any] = {"ready": ready, "ctld": ctld_s}
    if ready is not None:
        time.sleep(1.0)  # steady state
        pids = _tree(proc.pid)
        row["procs"] = len(pids)
        row["rss"] = _rss_mib(pids)
        row["steps"] = _steps(cluster)
        kinds = {k: [p for p in pids if _comm(p) == k] for k in {_comm(p) for p in pids}}
        cpu0, w0 = {k: _cpu_s(v) for k, v in kinds.items()}, time.monotonic()
        time.sleep(window)
        took = {k: 100 * (_cpu_s(v) - cpu0[k]) / (time.monotonic() - w0) for k, v in kinds.items()}
        row["cpu"] = sum(took.values())
        row["cpu_by"] = {k: round(v, 1) for k, v in sorted(took.items())}
    try:
        proc.wait(timeout=hold + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    row["rc"] = proc.returncode
    if ready is None:  # in its own words
        print(*[line for _, line in watch.lines[-12:]], sep="\n   ", flush=True)
    cluster.run(["scancel", "--user=root"], timeout=30)
    return row


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-node", default="4,16,32", help="ranks per node, comma-separated")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--hold", type=float, default=20.0, help="seconds each rank prints")
    p.add_argument("--window", type=float, default=5.0, help="seconds of CPU measured")
    p.add_argument("--tools", default="trainguard,agents,torchrun")
    a = p.parse_args()
    tools = a.tools.split(",")
    sizes = [int(n) for n in a.per_node.split(",")]
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {(t, n): [] for t in tools for n in sizes}
    with started_cluster(NODES) as cluster:
        for i in range(a.runs):
            for n in sizes:
                for tool in tools:  # interleaved
                    r = one(cluster, tool, n, a.hold, a.window)
                    rows[(tool, n)].append(r)
                    print(f"run {i} {n:>3}/node {tool:<10} {r}", flush=True)
    print(f"\n{NODES} nodes, ranks printing 10 lines/s, medians of {a.runs} runs:")
    head = f"{'ranks':>5} {'tool':<10} {'ready s':>8} {'procs':>6} {'RSS MiB':>8} "
    print(head + f"{'steps':>6} {'CPU %':>6} {'ctld s':>7}")
    for n in sizes:
        for tool in tools:
            got = rows[(tool, n)]
            cells = [_med(got, k) for k in ("ready", "procs", "rss", "steps", "cpu", "ctld")]
            text = [
                "-" if v is None else f"{v:.2f}" if k in (0, 5) else f"{v:.1f}"
                for k, v in enumerate(cells)
            ]
            print(f"{n * NODES:>5} {tool:<10} " + " ".join(f"{c:>7}" for c in text))
        base = _med(rows.get(("torchrun", n), []), "ready")
        for tool in tools:
            mine = _med(rows[(tool, n)], "ready")
            if tool != "torchrun" and base and mine:
                print(f"      ready ratio {tool}/torchrun at {n * NODES} ranks: {mine / base:.2f}")


if __name__ == "__main__":
    main()
