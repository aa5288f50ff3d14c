"""`bench/tf_check.py mwms` and `mwms-kill`: MultiWorkerMirroredStrategy, clean and with a
worker killed, restarted with the job or alone (see bench/tf_check.py)."""

from __future__ import annotations

import argparse
import re
import signal
import time
from pathlib import Path

from tf_harness import Task, exit_time, free_ports, import_s, rel, steps_of, tf_config, wait_for

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
        res["import_s"] = [import_s(x) for x in texts]
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
        res["survivor_exit_after_kill_s"] = rel(exit_time(survivor), t_kill)
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
                events.append(f"{t.name} exited {rc} at {rel(exit_time(t), t0)}s")
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
