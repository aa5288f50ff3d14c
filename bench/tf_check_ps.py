"""`bench/tf_check.py ps`: ParameterServerStrategy with a task killed and restarted (see
bench/tf_check.py)."""

from __future__ import annotations

import argparse
import itertools
import re
import signal
import time
from pathlib import Path

from tf_harness import Task, exit_time, free_ports, import_s, rel, steps_of, tf_config, wait_for

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
                    t.name: {"rc": t.poll(), "exit_after_kill_s": rel(exit_time(t), t_kill)}
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
        res["import_s"] = import_s(text)
        cluster_up = chief.first_seen(r"chief: cluster up")
        res["chief_cluster_up_s"] = rel(cluster_up, chief.started)
        if steps:
            res["first_step_s"] = round(steps[0][1] - chief.started, 2)
        if t_kill and whole_job:
            m = re.search(r"resumed from step (\d+)", text)
            res["resumed_from_step"] = int(m.group(1)) if m else None
            res["restart_to_first_step_s"] = (
                rel(steps[0][1], t_restart) if steps and t_restart else None
            )
        if t_kill and not whole_job:
            after = [t for _, t in steps if t > t_kill]
            res["first_step_after_kill_s"] = round(after[0] - t_kill, 3) if after else None
            res["steps_after_kill"] = len(after)
            ts = [t for _, t in steps]
            res["max_step_gap_s"] = round(max(b - a for a, b in itertools.pairwise(ts)), 3)
            res["coordinator_saw_failure_s"] = rel(chief.first_seen(r"failed with"), t_kill)
            res["coordinator_recovery_started_s"] = rel(
                chief.first_seen(r"Cluster now being recovered"), t_kill
            )
            res["coordinator_recovered_s"] = rel(
                chief.first_seen(r"Cluster successfully recovered"), t_kill
            )
            if t_restart:
                res["restart_after_kill_s"] = round(t_restart - t_kill, 2)
                res["restarted_worker_serving_s"] = rel(victim.first_seen(r"serving on"), t_kill)
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
