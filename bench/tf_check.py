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
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import tf_harness
from tf_check_mwms import run_mwms_clean, run_mwms_kill
from tf_check_ps import run_ps


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
    tf_harness.RPC_LAYER = args.rpc_layer  # read by tf_config()
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
