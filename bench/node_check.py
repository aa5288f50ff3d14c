"""The node check's cost, and what it finds, on hosts that share nothing
(tests/clusters/hosts.py).

Each host is a network namespace on a bridge; the check (trainguard.backends.node_check)
runs on 2 and on 3 of them at once, as the Slurm backend runs it (`--via slurm`: one
`srun` step a node, inside `salloc -N3` on the real cluster of
tests/clusters/slurmcluster.py) or entered directly (`--via hosts`: nsenter, no Slurm).
Printed: the median seconds of the whole check (process start included) over `--runs`,
then what it finds on 3 hosts when host 1's link is slowed (`tc qdisc ... netem delay
200ms` on its cable, or where the kernel has no netem, a 20 Mbit/s `tbf`) and when it is
cut (`ip link set ... down`).

    flock /tmp/tg-cluster.lock .venv/bin/python bench/node_check.py --via slurm --runs 5

Needs root (network namespaces), iproute2 (ip, tc); for --via slurm, Debian's slurm-wlm and
munge (scripts/system_deps.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "clusters"))

from hosts import Host, Hosts, hosts_on_a_bridge  # noqa: E402
from slurmcluster import SlurmCluster, require_slurm, sweep  # noqa: E402

from trainguard.backends.node_check.run import lines_of, run_check  # noqa: E402
from trainguard.policy.node_check import judge  # noqa: E402

# What runs inside the allocation (--via slurm): the backend's own check on the first N
# nodes, its verdict and seconds as one JSON line.
IN_ALLOCATION = """
import asyncio, json, sys, time
from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.node_check import check_allocation
async def main(n):
    alloc = await cluster.allocation()
    nodes = await cluster.nodes(alloc.nodes)
    t0 = time.monotonic()
    found, out = await check_allocation(alloc.job_id, nodes, alloc.nodes[:n], 2, "a bench")
    print(json.dumps({"s": time.monotonic() - t0, "note": found.note, "excluded": out}))
asyncio.run(main(int(sys.argv[1])))
"""


NETEM = ("netem", "delay", "200ms")
TBF = ("tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms")


@contextlib.contextmanager
def slowed(host: Host) -> Iterator[str]:
    """Every packet to `host` 200 ms late (netem on the bridge's end of its cable); where
    this kernel has no netem (no sch_netem module), its link limited to 20 Mbit/s (tbf)."""
    for qdisc in (NETEM, TBF):
        argv = ["tc", "qdisc", "add", "dev", host.link, "root", *qdisc]
        if subprocess.run(argv, capture_output=True).returncode == 0:
            break
    else:
        raise RuntimeError(f"tc can add neither netem nor tbf on {host.link}")
    try:
        yield " ".join(qdisc)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", host.link, "root"], check=False)


@contextlib.contextmanager
def cut(host: Host) -> Iterator[str]:
    host.cut()
    try:
        yield "ip link set down"
    finally:
        host.mend()


def check_on_hosts(hosts: Sequence[Host]) -> tuple[float, str]:
    """The check entered directly on each host: (seconds, verdict)."""

    def start(name: str, argv: Sequence[str], timeout_s: float) -> AsyncIterator[str]:
        host = next(h for h in hosts if h.hostname == name)
        return lines_of([*host.prefix(), *argv])

    async def main() -> tuple[float, str]:
        t0 = time.monotonic()
        reports = await run_check([(h.hostname, h.ip) for h in hosts], start)
        seconds = time.monotonic() - t0
        v = judge([h.hostname for h in hosts], reports)
        return seconds, json.dumps({"bad": dict(v.bad), "unclear": v.unclear})

    return asyncio.run(main())


def check_in_slurm(slurm: SlurmCluster, n: int) -> tuple[float, str]:
    argv = ["salloc", "-N3", "--no-kill", sys.executable, "-c", IN_ALLOCATION, str(n)]
    res = slurm.run(argv, timeout=120)
    lines = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"no answer from the allocation: {res.stderr[-2000:]}")
    found = json.loads(lines[-1])
    return float(found["s"]), f"{found['note']} | excluded: {found['excluded']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--via", choices=("hosts", "slurm"), default="slurm")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if args.via == "slurm":
        require_slurm()
        sweep()
    with hosts_on_a_bridge(3) as hosts:
        slurm = SlurmCluster(hosts) if args.via == "slurm" else None
        try:
            if slurm is not None:
                slurm.start()
            run(args, hosts, slurm)
        finally:
            if slurm is not None:
                slurm.stop()


def run(args: argparse.Namespace, hosts: Hosts, slurm: SlurmCluster | None) -> None:
    def check(n: int) -> tuple[float, str]:
        if slurm is not None:
            return check_in_slurm(slurm, n)
        return check_on_hosts(hosts.hosts[:n])

    for n in (2, 3):
        times = []
        for _ in range(args.runs):
            seconds, verdict = check(n)
            times.append(seconds)
        print(
            f"{args.via}: {n} hosts, healthy: median {statistics.median(times):.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}, runs {args.runs}); last: {verdict}",
            flush=True,
        )
    for name, fault in (("slowed", slowed), ("cut", cut)):
        with fault(hosts[1]) as how:
            seconds, verdict = check(3)
        name = f"{name} ({how})"
        print(f"{args.via}: 3 hosts, {hosts[1].hostname} {name}: {seconds:.2f} s: {verdict}")
        if slurm is not None and name == "cut":
            slurm.heal()


if __name__ == "__main__":
    main()
