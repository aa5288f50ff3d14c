"""Standalone check that real TensorFlow behaves as the `tensorflow` preset expects.

No trainguard here: this script builds TF_CONFIG by hand (127.0.0.1, free ports), starts
the tasks of examples/tf_ps.py or examples/tf_mwms.py with subprocess, injects faults
and checks the outcome. Scenarios:

  ps          1 chief + 2 workers + 1 ps (+ --evaluator): SIGKILL --kill-task (worker1)
              at chief step --kill-at-step. A worker is restarted alone --restart-delay s
              later with the same TF_CONFIG; for ps0 or chief the others are watched for
              --survivor-wait s, then the whole job is restarted and resumes from its
              checkpoint. The chief must exit 0 having reported every step; ps and
              workers run with --exit-when-done. --no-kill: a clean run. --no-restart: the
              worker never comes back. --chief-first S: the others start S s after the
              chief. --verbose: the chief logs TensorFlow's INFO lines (needed for the
              coordinator_* recovery times).
  mwms        2 workers, clean run; both exit 0 and the chief prints the weights digest.
  mwms-kill   a clean run for reference, then a run where --kill-task (worker1) is
              SIGKILLed at step --kill-at-step; the survivor is watched for
              --survivor-wait s (does it fail by itself?), then killed, and both are
              restarted from the checkpoint (a sync restart). Both must exit 0 and the
              final weights must equal the clean run's. --lone-restart: instead, every
              worker that ends non-zero is restarted alone (what an async policy does).

    .venv/bin/python bench/tf_check.py ps --runs 3 --verbose --json /tmp/tf_ps.json
    .venv/bin/python bench/tf_check.py ps --kill-task ps0 --survivor-wait 15
    .venv/bin/python bench/tf_check.py mwms-kill --runs 2
    .venv/bin/python bench/tf_check.py mwms-kill --lone-restart --survivor-wait 120

Timestamps come from the tasks' own `t=` fields and from this script's clock (same host).
Exit status: 0 when every run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
STEP_RE = re.compile(r"^step (\d+) loss ([0-9.naninf]+)(?: task (\S+))? t=([0-9.]+)", re.M)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


RPC_LAYER = "grpc"  # --rpc-layer; "" leaves the key out (TensorFlow then uses grpc too)


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    conf: dict = {"cluster": cluster, "task": {"type": task_type, "index": index}}
    if RPC_LAYER:
        conf["rpc_layer"] = RPC_LAYER
    return json.dumps(conf)


class Task:
    def __init__(self, name: str, script: str, conf: str, args: list[str], logdir: Path):
        self.name, self.script, self.conf, self.args = name, script, conf, args
        self.logdir = logdir
        self.attempt = 0
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.log = logdir / f"{name}.0.log"
        self.lines: list[tuple[float, str]] = []

    def start(self) -> None:
        self.log = self.logdir / f"{self.name}.{self.attempt}.log"
        env = dict(
            os.environ,
            TF_CONFIG=self.conf,
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONUNBUFFERED="1",
            TRAINGUARD_RESTART_COUNT=str(self.attempt),
        )
        env.pop("TRAINGUARD_CHECKPOINT_DIR", None)
        self.proc = subprocess.Popen(
            [PY, str(ROOT / "examples" / self.script), *self.args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines = []  # (time this script read the line, line): every line gets a time
        self.reader = threading.Thread(
            target=self._read, args=(self.proc, self.lines, self.log), daemon=True
        )
        self.reader.start()
        self.started = time.time()
        self.attempt += 1

    @staticmethod
    def _read(proc: subprocess.Popen, lines: list, log: Path) -> None:
        assert proc.stdout is not None
        with open(log, "w") as out:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append((time.time(), line))
                out.write(line + "\n")
                out.flush()
        proc.wait()
        Task._ended[id(proc)] = time.time()

    _ended: ClassVar[dict[int, float]] = {}

    @property
    def ended(self) -> float | None:
        return Task._ended.get(id(self.proc))

    def poll(self) -> int | None:
        """The exit status of the current attempt (None: running, or never started)."""
        return self.proc.poll() if self.proc else None

    def text(self) -> str:
        return "\n".join(ln for _, ln in list(self.lines))

    def first_seen(self, pattern: str) -> float | None:
        """When this script first read a line of this attempt matching the pattern."""
        for t, ln in list(self.lines):
            if re.search(pattern, ln):
                return t
        return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait()
        if self.proc:
            self.reader.join(timeout=5)

    def cpu_s(self) -> float | None:
        """The process's user+system CPU seconds (None once it is gone)."""
        if not self.proc:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None


def steps_of(text: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(4))) for m in STEP_RE.finditer(text)]


def wait_for(pred, timeout: float, poll: float = 0.05) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(poll)
    return False


def first_t(text: str, pattern: str) -> float | None:
    m = re.search(r"(?:" + pattern + r").*? t=([0-9.]+)", text)
    return float(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------
# ParameterServerStrategy


def run_ps(args: argparse.Namespace, run: int, logdir: Path) -> dict:
    ports = free_ports(4 + (1 if args.evaluator else 0))
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
        "ps": [f"127.0.0.1:{ports[3]}"],
    }
    ckpt = logdir / "ckpt"
    common = [
        "--steps",
        str(args.steps),
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        str(args.ckpt_every),
    ]
    serve = [*common, "--exit-when-done"]
    tasks = {
        "ps0": Task("ps0", "tf_ps.py", tf_config(cluster, "ps", 0), serve, logdir),
        "worker0": Task("worker0", "tf_ps.py", tf_config(cluster, "worker", 0), serve, logdir),
        "worker1": Task("worker1", "tf_ps.py", tf_config(cluster, "worker", 1), serve, logdir),
        "chief": Task(
            "chief",
            "tf_ps.py",
            tf_config(cluster, "chief", 0),
            common + ["--step-time", str(args.step_time)] + (["--verbose"] if args.verbose else []),
            logdir,
        ),
    }
    if args.evaluator:
        tasks["evaluator"] = Task(
            "evaluator",
            "tf_ps.py",
            tf_config(cluster, "evaluator", 0),
            [*common, "--eval-idle-timeout", "60"],
            logdir,
        )
    t0 = time.time()
    if args.chief_first:
        # the chief starts alone; does it wait for the others to come up?
        tasks["chief"].start()
        time.sleep(args.chief_first)
    for t in tasks.values():
        if t.proc is None:
            t.start()
    chief = tasks["chief"]
    victim = tasks[args.kill_task]
    whole_job = args.kill_task in ("ps0", "chief")
    res: dict = {
        "scenario": "ps",
        "run": run,
        "kill_task": None if args.no_kill else args.kill_task,
        "ok": False,
    }
    t_kill = t_restart = None
    cpu_at_restart = cpu_last = None
    first_attempt_text = ""
    deadline = t0 + args.timeout
    try:
        if not args.no_kill:
            hit = wait_for(
                lambda: (
                    any(s >= args.kill_at_step for s, _ in steps_of(chief.text()))
                    or chief.poll() is not None
                ),
                deadline - time.time(),
            )
            if not hit or chief.poll() is not None:
                res["error"] = "chief never reached the kill step"
                return res
            victim.kill(signal.SIGKILL)
            t_kill = time.time()
            if whole_job:
                # what do the others do by themselves? then restart the whole job
                others = [t for t in tasks.values() if t is not victim]
                wait_for(lambda: all(t.poll() is not None for t in others), args.survivor_wait)
                res["others_after_kill"] = {
                    t.name: {"rc": t.poll(), "exit_after_kill_s": _rel(_exit_time(t), t_kill)}
                    for t in others
                }
                first_attempt_text = chief.text()
                if victim is not chief:
                    res["chief_tail_after_kill"] = [
                        ln[:300] for ln in chief.text().splitlines() if not ln.startswith("step ")
                    ][-5:]
                for t in others:
                    t.kill(signal.SIGKILL)
                if not args.no_restart:
                    time.sleep(args.restart_delay)
                    for t in tasks.values():
                        t.start()
                    t_restart = time.time()
            elif not args.no_restart:
                time.sleep(args.restart_delay)
                victim.start()
                t_restart = time.time()
        while chief.poll() is None and time.time() < deadline:
            c = victim.cpu_s()
            if c is not None and t_restart and not whole_job:
                cpu_last = c
                if cpu_at_restart is None and "serving on" in victim.text():
                    cpu_at_restart = c
            time.sleep(0.1)
        if chief.poll() is None:
            res["error"] = f"chief still running after --timeout {args.timeout}s"
            res["others_rc"] = {n: t.poll() for n, t in tasks.items() if n != "chief"}
            return res
        t_end = time.time()
        res["chief_rc"] = chief.poll()
        text = chief.text()
        steps = steps_of(text)
        done = {s for s, _ in steps} | {s for s, _ in steps_of(first_attempt_text)}
        res["steps_reported"] = len(done)
        res["all_steps"] = done == set(range(1, args.steps + 1))
        res["final_digest"] = "final weights sha256" in text
        res["wall_s"] = round(t_end - t0, 2)
        res["import_s"] = _import_s(text)
        cluster_up = chief.first_seen(r"chief: cluster up")
        res["chief_cluster_up_s"] = _rel(cluster_up, chief.started)
        if steps:
            res["first_step_s"] = round(steps[0][1] - chief.started, 2)
        if t_kill and whole_job:
            m = re.search(r"resumed from step (\d+)", text)
            res["resumed_from_step"] = int(m.group(1)) if m else None
            res["restart_to_first_step_s"] = (
                _rel(steps[0][1], t_restart) if steps and t_restart else None
            )
        if t_kill and not whole_job:
            after = [t for _, t in steps if t > t_kill]
            res["first_step_after_kill_s"] = round(after[0] - t_kill, 3) if after else None
            res["steps_after_kill"] = len(after)
            ts = [t for _, t in steps]
            res["max_step_gap_s"] = round(max(b - a for a, b in itertools.pairwise(ts)), 3)
            res["coordinator_saw_failure_s"] = _rel(chief.first_seen(r"failed with"), t_kill)
            res["coordinator_recovery_started_s"] = _rel(
                chief.first_seen(r"Cluster now being recovered"), t_kill
            )
            res["coordinator_recovered_s"] = _rel(
                chief.first_seen(r"Cluster successfully recovered"), t_kill
            )
            if t_restart:
                res["restart_after_kill_s"] = round(t_restart - t_kill, 2)
                res["restarted_worker_serving_s"] = _rel(victim.first_seen(r"serving on"), t_kill)
                if cpu_at_restart is not None and cpu_last is not None:
                    res["restarted_worker_cpu_s_while_chief_ran"] = round(
                        cpu_last - cpu_at_restart, 2
                    )
            lines = [
                ln
                for ln in text.splitlines()
                if re.search(r"(?i)fail|recover|unavailable|error", ln)
            ]
            res["chief_fault_lines"] = [ln[:200] for ln in lines[:6]]
        # do ps/workers (--exit-when-done) and the evaluator leave by themselves?
        rest = [t for n, t in tasks.items() if n != "chief"]
        wait_for(lambda: all(t.poll() is not None for t in rest), 20)
        res["others_exit"] = {t.name: t.poll() for t in rest}
        res["others_exit_after_chief_s"] = round(time.time() - t_end, 2)
        if args.evaluator:
            res["evaluator_lines"] = len(re.findall(r"^eval step", tasks["evaluator"].text(), re.M))
        res["ok"] = res["chief_rc"] == 0 and res["all_steps"] and res["final_digest"]
        return res
    finally:
        for t in tasks.values():
            t.kill()


def _rel(t: float | None, base: float | None) -> float | None:
    return round(t - base, 3) if t and base else None


def _exit_time(t: Task) -> float | None:
    """About when the task's process ended (its reader saw the end of its output)."""
    if t.poll() is None:
        return None
    t.reader.join(timeout=5)
    return t.ended


def _import_s(text: str) -> float | None:
    m = re.search(r"imported in ([0-9.]+)s", text)
    return float(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------
# MultiWorkerMirroredStrategy


def _mwms_tasks(args: argparse.Namespace, logdir: Path, ckpt: Path, out: Path) -> list[Task]:
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    common = [
        "--steps",
        str(args.steps),
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        str(args.ckpt_every),
        "--out",
        str(out),
        "--step-time",
        str(args.step_time),
    ]
    return [
        Task(f"worker{i}", "tf_mwms.py", tf_config(cluster, "worker", i), common, logdir)
        for i in range(2)
    ]


def _digest(text: str) -> str | None:
    m = re.search(r"final weights sha256 ([0-9a-f]+)", text)
    return m.group(1) if m else None


def run_mwms_clean(args: argparse.Namespace, run: int, logdir: Path) -> dict:
    logdir.mkdir(parents=True, exist_ok=True)
    tasks = _mwms_tasks(args, logdir, logdir / "ckpt", logdir / "final.npz")
    t0 = time.time()
    for t in tasks:
        t.start()
    try:
        wait_for(lambda: all(t.poll() is not None for t in tasks), args.timeout)
        res = {"scenario": "mwms", "run": run, "wall_s": round(time.time() - t0, 2)}
        res["rcs"] = [t.poll() for t in tasks]
        texts = [t.text() for t in tasks]
        res["steps"] = [len(steps_of(x)) for x in texts]
        res["import_s"] = [_import_s(x) for x in texts]
        first = steps_of(texts[0])
        res["first_step_s"] = round(first[0][1] - t0, 2) if first else None
        res["step_ms"] = (
            round(1000 * (first[-1][1] - first[0][1]) / max(1, len(first) - 1), 2)
            if first
            else None
        )
        res["digest"] = _digest(texts[0])
        res["ok"] = (
            res["rcs"] == [0, 0] and res["steps"] == [args.steps] * 2 and bool(res["digest"])
        )
        return res
    finally:
        for t in tasks:
            t.kill()


def run_mwms_kill(args: argparse.Namespace, run: int, logdir: Path) -> dict:
    ref = run_mwms_clean(args, run, logdir / "clean")
    res: dict = {"scenario": "mwms-kill", "run": run, "clean": ref, "ok": False}
    if not ref["ok"]:
        res["error"] = "the clean reference run failed"
        return res
    kdir = logdir / "kill"
    kdir.mkdir()
    tasks = _mwms_tasks(args, kdir, kdir / "ckpt", kdir / "final.npz")
    if args.kill_task not in ("worker0", "worker1"):
        res["error"] = "mwms-kill: --kill-task is worker0 or worker1"
        return res
    victim = tasks[int(args.kill_task[-1])]
    survivor = tasks[1 - int(args.kill_task[-1])]
    res["kill_task"] = args.kill_task
    t0 = time.time()
    for t in tasks:
        t.start()
    try:
        if not wait_for(
            lambda: any(s >= args.kill_at_step for s, _ in steps_of(victim.text())), args.timeout
        ):
            res["error"] = f"{victim.name} never reached the kill step"
            return res
        victim.kill(signal.SIGKILL)
        t_kill = time.time()
        last_before = max(s for s, _ in steps_of(survivor.text()))
        if args.lone_restart:
            # async-style handling, as if the job had no sync restart: every task that
            # ends non-zero (or is killed) is restarted alone, at most 3 times each
            res["lone_restart"] = _lone_restarts(args, tasks, victim, t_kill)
            res["ok"] = res["lone_restart"]["both_exit_0"]
            return res
        # what does the survivor do alone?
        wait_for(lambda: survivor.poll() is not None, args.survivor_wait)
        res["survivor_rc"] = survivor.poll()
        res["survivor_exit_after_kill_s"] = _rel(_exit_time(survivor), t_kill)
        tail = [
            ln for ln in survivor.text().splitlines() if ln.strip() and not ln.startswith("step ")
        ]
        res["survivor_tail"] = [ln[:300] for ln in tail[-6:]]
        res["survivor_last_step"] = max(s for s, _ in steps_of(survivor.text()))
        res["step_at_kill"] = last_before
        survivor.kill(signal.SIGKILL)  # the sync restart: the whole job goes
        t_restart = time.time()
        for t in tasks:
            t.start()
        wait_for(lambda: all(t.poll() is not None for t in tasks), args.timeout)
        t_end = time.time()
        texts = [t.text() for t in tasks]
        res["rcs_after_restart"] = [t.poll() for t in tasks]
        m = re.search(r"resumed from step (\d+)", texts[0])
        res["resumed_from_step"] = int(m.group(1)) if m else None
        after = steps_of(texts[0])
        res["restart_to_first_step_s"] = round(after[0][1] - t_restart, 2) if after else None
        res["restart_to_end_s"] = round(t_end - t_restart, 2)
        res["wall_s"] = round(t_end - t0, 2)
        res["digest"] = _digest(texts[0])
        res["same_weights_as_clean"] = res["digest"] == ref["digest"]
        res["ok"] = (
            res["rcs_after_restart"] == [0, 0]
            and res["same_weights_as_clean"]
            and after[-1][0] == args.steps
            if after
            else False
        )
        return res
    finally:
        for t in tasks:
            t.kill()


def _lone_restarts(args: argparse.Namespace, tasks: list[Task], victim: Task, t0: float) -> dict:
    events = [f"{victim.name} SIGKILLed at 0.0s"]
    restarts = {t.name: 0 for t in tasks}
    pending = {victim.name: time.time() + args.restart_delay}
    deadline = time.time() + args.survivor_wait
    while time.time() < deadline:
        for t in tasks:
            rc = t.poll()
            if t.name in pending:
                if time.time() >= pending[t.name]:
                    del pending[t.name]
                    t.start()
                    restarts[t.name] += 1
                    events.append(f"{t.name} restarted alone at {time.time() - t0:.1f}s")
            elif rc is not None and rc != 0 and restarts[t.name] < 3:
                events.append(f"{t.name} exited {rc} at {_rel(_exit_time(t), t0)}s")
                pending[t.name] = time.time() + args.restart_delay
        if not pending and all(t.poll() == 0 for t in tasks):
            break
        time.sleep(0.1)
    out = {
        "events": events,
        "rcs": [t.poll() for t in tasks],
        "steps_last_attempt": [len(steps_of(t.text())) for t in tasks],
        "tails": {t.name: [ln[:200] for ln in t.text().splitlines()[-2:]] for t in tasks},
    }
    out["both_exit_0"] = out["rcs"] == [0, 0]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["ps", "mwms", "mwms-kill"])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--steps", type=int)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--kill-at-step", type=int)
    p.add_argument("--restart-delay", type=float, default=1.0)
    p.add_argument("--step-time", type=float, default=0.02, help="pacing (s per step)")
    p.add_argument("--survivor-wait", type=float, default=30.0)
    p.add_argument("--no-kill", action="store_true")
    p.add_argument(
        "--kill-task",
        default="worker1",
        choices=["worker0", "worker1", "ps0", "chief"],
        help="ps: which task to SIGKILL; ps0/chief restart the whole job",
    )
    p.add_argument("--no-restart", action="store_true")
    p.add_argument(
        "--lone-restart",
        action="store_true",
        help="mwms-kill: restart each failed worker alone (async style) instead of the job",
    )
    p.add_argument("--evaluator", action="store_true")
    p.add_argument(
        "--chief-first", type=float, default=0.0, help="ps: start the others this much later"
    )
    p.add_argument("--verbose", action="store_true", help="ps: chief logs TF's INFO lines")
    p.add_argument("--rpc-layer", default="grpc", help='TF_CONFIG "rpc_layer"; "" for none')
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--keep", action="store_true", help="keep the logs' directory")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    global RPC_LAYER
    RPC_LAYER = args.rpc_layer
    if args.steps is None:
        args.steps = 600 if args.scenario == "ps" else 100
    if args.kill_at_step is None:
        args.kill_at_step = 100 if args.scenario == "ps" else 50

    base = Path(tempfile.mkdtemp(prefix=f"tf_check-{args.scenario}-"))
    print(f"logs under {base}", flush=True)
    fn = {"ps": run_ps, "mwms": run_mwms_clean, "mwms-kill": run_mwms_kill}[args.scenario]
    results = []
    for run in range(args.runs):
        logdir = base / f"run{run}"
        logdir.mkdir()
        res = fn(args, run, logdir)
        results.append(res)
        print(json.dumps(res, indent=1), flush=True)
    oks = sum(bool(r.get("ok")) for r in results)
    walls = [r["wall_s"] for r in results if "wall_s" in r]
    print(
        f"{args.scenario}: {oks}/{len(results)} runs ok"
        + (f"; wall median {statistics.median(walls):.1f}s" if walls else ""),
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.keep and oks == len(results):
        shutil.rmtree(base, ignore_errors=True)
    return 0 if oks == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
