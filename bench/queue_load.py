"""Queue load (R-RUN-2, R-REC-3): many short jobs through `trainguard server`'s quota.

A real server process with a quota of `--slots` cpus takes `--jobs` one-replica jobs,
submitted as fast as the API answers. The mix is designed so each job's final state is
known in advance:

    ok      sleeps --sleep s and exits 0                       -> SUCCEEDED
    bug     sleeps, then raises KeyError (a bug: no retry)     -> FAILED
    cancel  priority -5, cancelled by this script while queued -> CANCELLED
    expire  priority -10, max_wait_s 1, behind the deep queue  -> EXPIRED

While the queue drains, `--pollers` threads read the API back to back (the job list,
one job, the queue, /metrics) and time every request. At the end it checks that every
job is in its expected state, none is missing from the list, and that the number of
jobs holding the quota at once (from the transitions: admission to PENDING until the
job leaves the holding states) reached `--slots` and never went over. It prints a
table and exits 1 if a check failed.

    python bench/queue_load.py --jobs 200 --slots 8 --sleep 0.5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.states import JobState

HOLDING = frozenset({"PENDING", "RUNNING", "RESTARTING", "CANCELLING"})
"""The states in which a job holds its share of the quota (as in service.py)."""

TERMINAL = frozenset(s.value for s in JobState if s.is_terminal)

EXPECTED = {
    "ok": JobState.SUCCEEDED.value,
    "bug": JobState.FAILED.value,
    "cancel": JobState.CANCELLED.value,
    "expire": JobState.EXPIRED.value,
}
SHARES = {"bug": 0.05, "cancel": 0.03, "expire": 0.03}
"""The part of the jobs of each special kind; the rest are `ok`."""

NEVER_ADMITTED = frozenset({"cancel", "expire"})
HTTP_TIMEOUT_S = 30.0


# ------------------------------------------------------------------ the job mix


def job_mix(jobs: int, slots: int) -> list[str]:
    """The kind of each job, by submission order: deterministic, specials spread out.

    The first 2 x slots jobs are all `ok`, so that cancelled and expiring jobs always
    have a full quota and a queue ahead of them.
    """
    counts = {kind: max(1, round(jobs * share)) for kind, share in SHARES.items()}
    special = [k for i in range(max(counts.values())) for k in SHARES if i < counts[k]]
    lead = min(2 * slots, jobs - len(special))
    if lead < slots:
        raise SystemExit(f"--jobs {jobs}: too few for {slots} slots and {len(special)} specials")
    kinds = ["ok"] * jobs
    step = (jobs - lead) / len(special)
    for n, kind in enumerate(special):
        kinds[lead + int(n * step)] = kind
    return kinds


def job_spec(index: int, kind: str, sleep_s: float) -> dict[str, Any]:
    code = f"import time; time.sleep({sleep_s})"
    if kind == "bug":
        code += "; raise KeyError('queue-load bug')"
    queue: dict[str, Any] = {"priority": 0, "max_wait_s": None}
    if kind == "cancel":
        queue = {"priority": -5, "max_wait_s": None}
    elif kind == "expire":
        queue = {"priority": -10, "max_wait_s": 1}
    return {
        "name": f"load-{index:04d}-{kind}",
        "worker_pools": [{"replicas": 1, "command": [sys.executable, "-c", code]}],
        "queue": queue,
    }


# ------------------------------------------------------------------ HTTP, timed


@dataclass
class Timings:
    """Latencies (s) and errors per endpoint label; shared by threads."""

    lat: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, label: str, seconds: float, error: str | None) -> None:
        with self.lock:
            self.lat[label].append(seconds)
            if error is not None:
                self.errors.append(f"{label}: {error}")


class Api:
    """The server's HTTP API over urllib, one new connection a request (as the CLI does)."""

    def __init__(self, url: str, timings: Timings, token: str) -> None:
        self.url = url.rstrip("/")
        self.timings = timings
        self.token = token

    def raw(self, method: str, path: str, label: str, body: Any = None) -> bytes | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        error: str | None = None
        out: bytes | None = None
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                out = resp.read()
        except urllib.error.HTTPError as exc:
            error = f"{method} {path}: HTTP {exc.code} {exc.read()[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            error = f"{method} {path}: {exc}"
        self.timings.add(label, time.perf_counter() - t0, error)
        return out

    def json(self, method: str, path: str, label: str, body: Any = None) -> Any:
        out = self.raw(method, path, label, body)
        return None if out is None else json.loads(out)


def poll(api: Api, ids: list[str], stop: threading.Event, list_limit: int, seed: int) -> None:
    """Read the API back to back until `stop`: the job list, one job, the queue, metrics."""
    rng = random.Random(seed)
    while not stop.is_set():
        api.raw("GET", f"/api/jobs?limit={list_limit}", "GET /api/jobs")
        if ids:
            api.raw("GET", f"/api/jobs/{rng.choice(ids)}", "GET /api/jobs/{id}")
        api.raw("GET", "/api/queue", "GET /api/queue")
        api.raw("GET", "/metrics", "GET /metrics")


# ------------------------------------------------------------------ the server


class Server:
    """`python -m trainguard server` in its own session; server.json tells its url."""

    def __init__(self, home: Path, slots: int) -> None:
        self.home = home
        self.log = open(home / "server.out", "wb")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "trainguard", "--home", str(home), "server"]
        self.proc = subprocess.Popen(
            [*argv, "--port", "0", "--cpus", str(slots)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        info = home / "server.json"
        deadline = time.monotonic() + 60
        while not info.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not start; see {home / 'server.out'}")
            time.sleep(0.05)
        data = json.loads(info.read_text())
        self.url: str = data["url"]
        self.pid: int = data["pid"]
        self.token = (home / "server.token").read_text().strip()  # made at its first start

    def usage(self) -> tuple[float, int]:
        """The server process's CPU time (user + system, s) and peak RSS (bytes)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name
        ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15
        cpu_s = ticks / os.sysconf("SC_CLK_TCK")
        hwm_kb = 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm_kb = int(line.split()[1])
        return cpu_s, hwm_kb * 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def masters_of(home: Path) -> list[int]:
    """Pids of the job masters started for this home (they outlive the server)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"_master" in argv and str(home).encode() in argv:
            pids.append(int(entry.name))
    return pids


# ------------------------------------------------------------------ checks


def peak_holding(histories: dict[str, list[dict[str, Any]]]) -> tuple[int, float]:
    """The most jobs holding the quota at once, and for how long (s) that many did."""
    edges: list[tuple[float, int]] = []
    for transitions in histories.values():
        for t in transitions:
            was, now = t["from_state"] in HOLDING, t["to_state"] in HOLDING
            if now and not was:
                edges.append((t["at_s"], +1))
            elif was and not now:
                edges.append((t["at_s"], -1))
    edges.sort()  # at equal times a release (-1) comes before an admission (+1)
    time_at: defaultdict[int, float] = defaultdict(float)
    held, since = 0, edges[0][0] if edges else 0.0
    for at_s, delta in edges:
        time_at[held] += at_s - since
        held, since = held + delta, at_s
    time_at[held] += 0.0  # a level still held at the end counts too
    peak = max(time_at, default=0)
    return peak, time_at[peak]


def phases(histories: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per admitted job (s): admission -> RUNNING, RUNNING -> end, and the whole hold."""
    out: dict[str, list[float]] = defaultdict(list)
    for transitions in histories.values():
        at = {t["to_state"]: t["at_s"] for t in transitions}
        end = next((t["at_s"] for t in transitions if t["to_state"] in TERMINAL), None)
        if "PENDING" not in at or end is None:
            continue
        out["hold"].append(end - at["PENDING"])
        if "RUNNING" in at:
            out["start"].append(at["RUNNING"] - at["PENDING"])
            out["run"].append(end - at["RUNNING"])
    return out


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 over every value (inclusive method: p99 of n < 100 interpolates)."""
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), q[98]


def metrics_by_state(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        if line.startswith('trainguard_jobs{state="'):
            name, value = line.split()
            out[name.split('"')[1]] = int(float(value))
    return out


# ------------------------------------------------------------------ the run


@dataclass
class Job:
    index: int
    kind: str
    id: str = ""


def wait_drained(api: Api, ids: set[str], list_limit: int, timeout_s: float) -> bool:
    """Wait until no job of ours is listed in a live state (a lost one: see verify)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = api.json("GET", f"/api/jobs?limit={list_limit}", "drain watch")
        if listed and not any(j["id"] in ids and j["state"] not in TERMINAL for j in listed):
            return True
        time.sleep(0.25)
    return False


def run(args: argparse.Namespace, home: Path) -> int:
    kinds = job_mix(args.jobs, args.slots)
    jobs = [Job(i, k) for i, k in enumerate(kinds)]
    list_limit = min(10000, max(1000, 2 * args.jobs))
    timings = Timings()
    failures: list[str] = []
    server = Server(home, args.slots)
    api = Api(server.url, timings, server.token)
    print(f"server pid {server.pid} at {server.url}; home {home}", flush=True)
    ids: list[str] = []
    stop = threading.Event()
    pollers = [
        threading.Thread(target=poll, args=(api, ids, stop, list_limit, n), daemon=True)
        for n in range(args.pollers)
    ]
    try:
        for t in pollers:
            t.start()
        t0 = time.time()
        for job in jobs:
            body = {"spec": job_spec(job.index, job.kind, args.sleep), "cwd": str(home)}
            answer = api.json("POST", "/api/jobs", "POST /api/jobs", body)
            if answer is None:
                failures.append(f"job {job.index} ({job.kind}): submit failed")
                continue
            job.id = answer["id"]
            ids.append(job.id)
        submit_s = time.time() - t0
        for job in jobs:
            if job.kind == "cancel" and job.id:
                api.json("POST", f"/api/jobs/{job.id}/cancel", "POST /api/jobs/{id}/cancel", {})
        print(f"submitted {len(ids)} jobs in {submit_s:.2f} s; draining...", flush=True)
        drained = wait_drained(api, set(ids), list_limit, args.timeout)
        stop.set()
        for t in pollers:
            t.join()
        if not drained:
            failures.append(f"the queue did not drain within {args.timeout:g} s")
        usage = server.usage()
        failures += verify(api, jobs, args, list_limit, usage)
    finally:
        stop.set()
        cleanup(api, server, ids, list_limit)
    log = (home / "server.out").read_text(errors="replace").splitlines()
    bad = [line for line in log if "error" in line.lower() or "Traceback" in line]
    for line in bad[:20]:
        print(f"  server log: {line}")
    if bad:
        failures.append(f"the server logged {len(bad)} error line(s)")
    for e in timings.errors[:20]:
        print(f"  API error: {e}")
    if timings.errors:
        failures.append(f"{len(timings.errors)} API requests failed")
    for f in failures:
        print(f"FAIL: {f}")
    print("OK: every check passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def verify(
    api: Api,
    jobs: list[Job],
    args: argparse.Namespace,
    list_limit: int,
    usage: tuple[float, int],
) -> list[str]:
    failures: list[str] = []
    listed = {j["id"]: j for j in api.json("GET", f"/api/jobs?limit={list_limit}", "final") or []}
    lost = [j for j in jobs if j.id and j.id not in listed]
    if lost:
        failures.append(f"{len(lost)} submitted job(s) missing from GET /api/jobs: {lost[:5]}")
    histories: dict[str, list[dict[str, Any]]] = {}
    mismatches = 0
    for job in jobs:
        if not job.id:
            continue
        status = api.json("GET", f"/api/jobs/{job.id}", "final") or {}
        hist = api.json("GET", f"/api/jobs/{job.id}/history", "GET /api/jobs/{id}/history")
        transitions = (hist or {}).get("transitions", [])
        histories[job.id] = transitions
        want, got = EXPECTED[job.kind], status.get("state")
        path = " -> ".join(t["to_state"] for t in transitions)
        problem = None
        if got != want:
            problem = f"is {got}, expected {want}"
        elif job.kind in NEVER_ADMITTED and any(t["to_state"] == "PENDING" for t in transitions):
            problem = "was admitted, expected it to end while queued"
        elif job.kind in ("ok", "bug") and status.get("attempts") != 1:
            problem = f"ran {status.get('attempts')} attempts, expected 1"
        if problem is not None:
            mismatches += 1
            print(f"  mismatch: job {job.index} {job.id} ({job.kind}) {problem}: {path}")
    if mismatches:
        failures.append(f"{mismatches} job(s) not in their expected state")
    metric_states = metrics_by_state((api.raw("GET", "/metrics", "final") or b"").decode())
    want_counts = Counter(EXPECTED[j.kind] for j in jobs if j.id)
    for state, n in want_counts.items():
        if metric_states.get(state, 0) < n:
            failures.append(f"/metrics: trainguard_jobs{{state={state}}} < {n}")
    peak, at_peak_s = peak_holding(histories)
    if peak > args.slots:
        failures.append(f"{peak} jobs held the quota at once; the quota fits {args.slots}")
    if peak < args.slots:
        failures.append(f"at most {peak} jobs held the quota at once; never reached {args.slots}")
    report(api.timings, jobs, histories, args, peak, at_peak_s, usage)
    return failures


def report(
    timings: Timings,
    jobs: list[Job],
    histories: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
    peak: int,
    at_peak_s: float,
    usage: tuple[float, int],
) -> None:
    starts = [t["at_s"] for h in histories.values() for t in h if t["to_state"] == "QUEUED"]
    ends = [t["at_s"] for h in histories.values() for t in h if t["to_state"] in TERMINAL]
    drain_s = max(ends) - min(starts) if starts and ends else float("nan")
    by_kind = Counter(j.kind for j in jobs)
    mix = ", ".join(f"{by_kind[k]} {k}" for k in EXPECTED)
    cpu_s, hwm_b = usage
    ph = phases(histories)
    use = sum(ph["hold"]) / (args.slots * drain_s) if drain_s > 0 else float("nan")
    mid = {k: percentiles(v)[0] if v else float("nan") for k, v in ph.items()}
    rows = [
        ("jobs / slots", f"{len(jobs)} / {args.slots}  ({mix}; sleep {args.sleep:g} s)"),
        ("pollers", f"{args.pollers} threads, back to back"),
        ("drain time", f"{drain_s:.2f} s  (first submit -> last terminal state)"),
        ("throughput", f"{len(jobs) / drain_s:.2f} jobs/s"),
        ("peak holding quota", f"{peak} jobs ({at_peak_s:.1f} s at that level)"),
        ("quota use", f"{use:.0%} of slots x drain time held by jobs"),
        (
            "per admitted job",
            f"p50 admitted -> RUNNING {mid.get('start', 0):.2f} s, "
            f"RUNNING -> end {mid.get('run', 0):.2f} s, held {mid.get('hold', 0):.2f} s",
        ),
        ("server CPU time", f"{cpu_s:.2f} s  (utime + stime)"),
        ("server peak RSS", f"{hwm_b / 2**20:.1f} MiB  (VmHWM)"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    labels = ["POST /api/jobs", "POST /api/jobs/{id}/cancel"]
    labels += ["GET /api/jobs", "GET /api/jobs/{id}", "GET /api/queue", "GET /metrics"]
    labels += ["GET /api/jobs/{id}/history"]
    print(f"{'endpoint':<28} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label in labels:
        values = timings.lat.get(label)
        if not values:
            continue
        p50, p99 = percentiles(values)
        line = f"{label:<28} {len(values):>6} {p50 * 1e3:>8.1f} {p99 * 1e3:>8.1f}"
        print(f"{line} {max(values) * 1e3:>8.1f}")
    print("(history is read once per job after the drain; the other reads ran during it)")
    print()


def cleanup(api: Api, server: Server, ids: list[str], list_limit: int) -> None:
    """Cancel what is left, stop the server, and wait a little for the masters to end."""
    if server.proc.poll() is None:
        listed = api.json("GET", f"/api/jobs?limit={list_limit}", "cleanup") or []
        left = [j["id"] for j in listed if j["id"] in set(ids) and j["state"] not in TERMINAL]
        for job_id in left:
            api.json("POST", f"/api/jobs/{job_id}/cancel", "cleanup", {})
        if left:
            print(f"cancelled {len(left)} job(s) left running or queued")
    server.stop()
    deadline = time.monotonic() + 30
    while (pids := masters_of(server.home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:  # masters of this home only, found by their --home argument
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--jobs", type=int, default=200, help="jobs to submit (default 200)")
    p.add_argument("--slots", type=int, default=8, help="quota cpus: jobs at once (default 8)")
    p.add_argument("--sleep", type=float, default=0.5, help="each replica's sleep, s")
    p.add_argument("--pollers", type=int, default=2, help="threads reading the API (default 2)")
    p.add_argument("--home", type=Path, default=None, help="state home (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    p.add_argument("--timeout", type=float, default=900, help="give up draining after, s")
    args = p.parse_args(argv)
    if args.jobs < 10 or args.slots < 1 or args.sleep < 0 or args.pollers < 0:
        p.error("need --jobs >= 10, --slots >= 1, --sleep >= 0, --pollers >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    temp = args.home is None
    home = Path(tempfile.mkdtemp(prefix="tg-queue-load-")) if temp else args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, home)
    finally:
        if temp and not args.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"state kept in {home}")


if __name__ == "__main__":
    sys.exit(main())
