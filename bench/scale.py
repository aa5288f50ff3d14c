"""Scale (R-RUN-1): the master's overhead under heavy logs, and restarts of many replicas.

Two measurements of one `trainguard run` process (the embedded master), each in a fresh
state directory:

    overhead  N replicas each print RATE ~100-byte lines/s for SECONDS, then exit 0 with a
              marker `DONE lines=K ...`. The master's CPU time (utime + stime) and memory
              (VmRSS, VmHWM) are sampled from /proc every 0.5 s. Checks: the job SUCCEEDED,
              every replica's exit is recorded (N SUCCEEDED runs), and every log file holds
              exactly the K numbered lines its replica says it printed (no gap, no
              duplicate), plus the marker. Reports the rate achieved (lines in the logs per
              second of the output window), how long replicas were blocked writing to the
              master's pipe, and how late the master recorded each exit.

    restart   N sleeping replicas (tests/bins/child.py `*:pidfile:P *:forever`). Times
              `run` -> all N RUNNING in the store and -> all N replica programs executing
              (their pid files), then SIGKILLs K replicas at once (never rank 0). Sync mode
              must make exactly one job restart (attempt 1 with all N running again); async
              mode K RestartReplica records and no new attempt. The job is then cancelled
              (SIGINT to the master: CANCELLED), and the cancel is timed too.

    spawn     N replicas that cost nothing to start (`sleep`, exec'd through a link in the
              temporary folder): times `run` -> first and -> all N exec'd (children of the
              master that are `sleep` by now), i.e. the master's own cost per spawn, which
              `restart` hides behind N Python start-ups on a machine with few cores; the
              master's thread count with N running; then the cancel.

    python bench/scale.py overhead --replicas 64 --rate 1000 --seconds 20
    python bench/scale.py restart --replicas 256 --kill 10 --mode async
    python bench/scale.py spawn --replicas 256 --runs 3

With `--runs R` every figure is the median of R runs. Exit status 1 if a check failed.
Every process started is stopped at the end (the master, then any leftover replica found
by its command line, which names this run's temporary folder).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scale_overhead import cmd_overhead
from scale_restart import cmd_restart
from scale_spawn import cmd_spawn

# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead", help="master CPU and memory under heavy replica output")
    o.add_argument("--replicas", type=int, default=64)
    o.add_argument("--rate", type=float, default=1000, help="lines per second per replica")
    o.add_argument("--seconds", type=float, default=20)
    o.add_argument("--batch-ms", type=float, default=20, help="one write per replica per tick")
    o.add_argument("--timeout", type=float, default=120, help="beyond --seconds")
    r = sub.add_parser("restart", help="start many sleeping replicas, kill some at once")
    r.add_argument("--replicas", type=int, default=256)
    r.add_argument("--kill", type=int, default=10)
    r.add_argument("--mode", choices=("sync", "async"), default="sync")
    r.add_argument("--timeout", type=float, default=180, help="for each wait")
    r.add_argument("--settle", type=float, default=2.0, help="wait before counting records")
    s = sub.add_parser("spawn", help="the master's own cost per spawn: replicas that exec sleep")
    s.add_argument("--replicas", type=int, default=256)
    for sp in (o, r, s):
        sp.add_argument("--runs", type=int, default=1)
        sp.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = p.parse_args(argv)
    commands = {"overhead": cmd_overhead, "restart": cmd_restart, "spawn": cmd_spawn}
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
