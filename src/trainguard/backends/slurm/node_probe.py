"""What runs a replica's task on its Slurm node: the program as its child, and, only when
that child failed, the machine read there (`machine_probe.probe_exit`), told to the master
as `trainguard-machine: {json}` lines on stderr (`machine_lines`, read back by
`readings_of`, taken out of the exit's tail by `with_readings`). Started as
`python .../node_probe.py [--path P]... -- ARGV...` (`wrapped_argv`: through /bin/sh, so
a node without this installation runs the program bare). The master's environment
TRAINGUARD_SLURM_NODE_PROBE=0 turns it off (`SlurmBackend`).

Why a parent on the node, not a step the master starts after the failure: the kernel log
names the crashed process by pid, which only a process on that node knows, and once srun
has returned the allocation may be gone; and why not the master reading its own machine:
the task ran elsewhere.

Costs and the semantics kept (each checked on the real Slurm cluster):
- start: run by path, not `-m`, so no package is imported (the probe's imports come only
  after a failure): ~20 ms a rank, once; the probe ~0.1 s a failure, plus nvidia-smi's
  time where there is one (its limit: 10 s); srun waits for it, through a stop's grace;
- signals: the child stays in the wrapper's process group, and every proctrack plugin
  (linuxproc: the step's tree; cgroup: its cgroup; pgid: its group) signals all of the
  step's processes, so what srun or `scancel --signal` sends reaches the program directly.
  The wrapper takes those signals with `sigwaitinfo` and forwards one only when it came
  from someone else than slurmstepd (its parent), so none arrives twice;
- exit: the child's status, unchanged: its code, or its signal raised again on the
  wrapper (with no core file: the program's own, if any, is not overwritten);
- stacks: `step_stacks.find_replica` skips this wrapper and finds the program under it;
- a SIGKILL to the whole step kills the wrapper too: then nothing is read, as before;
- the marker lines stay in the replica's log file and console (only the tail is cleaned).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

TYPE_CHECKING = False  # not `typing`'s: its import would cost each rank's start ~10 ms
if TYPE_CHECKING:
    from collections.abc import Sequence

    from trainguard.backends.interface import ReplicaExited
    from trainguard.classify.readings import MachineReading

MARKER = "trainguard-machine: "
EXITED = "trainguard-exited: "
"""The wrapper's first word once its program failed, before it reads the node: a stop
that comes meanwhile finds a replica that ended on its own (`ended_on_its_own`)."""
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_WAITED = frozenset({*FORWARDED, signal.SIGCHLD})
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)  # as subprocess's restore_signals
_CHECKPOINT_ENV = "TRAINGUARD_CHECKPOINT_DIR"  # = storage.env.ENV_CHECKPOINT_DIR (run bare)
_CLIP = 1500  # of a reading's value and words: one marker line stays under MAX_LINE


_OR_BARE = (
    'if [ -x "$0" ] && [ -r "$1" ]; then exec "$0" "$@"; fi; '
    'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
)
"""A node without this Python or this file (not every cluster shares the master's
installation) runs the program bare, as before, rather than not at all."""


def wrapped_argv(
    argv: Sequence[str], paths: Sequence[str] = (), python: str = sys.executable
) -> list[str]:
    """`argv` run under this wrapper on a node, with the job's `paths` to read there."""
    opts = [a for p in paths for a in ("--path", p)]
    return ["/bin/sh", "-c", _OR_BARE, python, os.path.abspath(__file__), *opts, "--", *argv]


def machine_lines(readings: Sequence[MachineReading]) -> list[str]:
    """One marker line a reading, each bounded."""
    import json
    from dataclasses import asdict, replace

    out = []
    for r in readings:
        r = replace(r, value=r.value[:_CLIP], reading=r.reading[:_CLIP])
        row = {k: v for k, v in asdict(r).items() if v not in ("", None)}
        out.append(MARKER + json.dumps(row))
    return out


def ended_on_its_own(tail: Sequence[str]) -> int | None:
    """The exit status (as `Popen.returncode`) a wrapper said its program ended with (it
    may still be reading the node), or None."""
    for line in reversed(tail):
        text = line.strip()
        if text.startswith(EXITED) and text[len(EXITED) :].isdigit():
            return os.waitstatus_to_exitcode(int(text[len(EXITED) :]))
    return None


def readings_of(tail: Sequence[str]) -> tuple[tuple[MachineReading, ...], tuple[str, ...]]:
    """The readings a wrapper told in a log tail, and the tail without their lines."""
    from trainguard.classify.readings import from_json

    rows, rest = [], []
    for line in tail:
        text = line.strip()
        if text.startswith(MARKER):
            rows.append(text[len(MARKER) :])
        elif not text.startswith(EXITED):
            rest.append(line)
    return from_json("[" + ",".join(rows) + "]") if rows else (), tuple(rest)


def with_readings(ev: ReplicaExited) -> ReplicaExited:
    """The exit with what its node's wrapper told (its marker lines, out of its tail) as
    its machine readings, and the storage errors its tail shows."""
    from dataclasses import replace

    from trainguard.classify.machine_parse import tail_storage_readings

    found, tail = readings_of(ev.evidence.log_tail)
    if tail == ev.evidence.log_tail:
        return ev
    machine = (*ev.evidence.machine, *found, *tail_storage_readings(tail))
    return replace(ev, evidence=replace(ev.evidence, log_tail=tail, machine=machine))


def _counter() -> tuple[str, int, bool] | None:
    """(file, oom kills, whether it is the step's own cgroup) of this process's memory
    cgroup: v2 `memory.events` or v1 `memory.oom_control`; None where none is readable.
    (Not `local.oom`'s readers: read before the program starts, they would cost each
    rank's start their imports.)"""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()  # noqa: SIM115
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            path = f"/sys/fs/cgroup{rel.rstrip('/')}/memory.events"
        elif "memory" in controllers.split(","):
            path = f"/sys/fs/cgroup/memory{rel.rstrip('/')}/memory.oom_control"
        else:
            continue
        try:
            text = open(path).read()  # noqa: SIM115
        except OSError:
            continue
        kills = sum(
            int(v)
            for k, _, v in (ln.partition(" ") for ln in text.splitlines())
            if k in ("oom_kill", "oom_group_kill") and v.strip().isdigit()
        )
        return path, kills, "/step_" in rel  # Slurm's task/cgroup: one step, one replica
    return None


def _memory(before: tuple[str, int, bool] | None) -> MachineReading:
    from trainguard.classify.readings import Finding, MachineReading, Source

    after = _counter()
    if before is None or after is None or after[0] != before[0]:
        return MachineReading(
            Source.CGROUP, "no memory cgroup counter readable", "absent", False, Finding.ABSENT
        )
    path, kills, own = after
    value = f"{path}: oom_kill {before[1]} -> {kills}"
    if kills <= before[1]:
        return MachineReading(Source.CGROUP, value, "no OOM kill while it ran", True)
    whose = "its step's own cgroup" if own else "the cgroup it shares (its or another process's)"
    return MachineReading(
        Source.CGROUP,
        value,
        f"an OOM kill in {whose} while it ran",
        own,
        Finding.OOM_KILL,
        os.path.dirname(path),
    )


def _probe(pid: int, since_us: int, paths: Sequence[str], counter: object) -> None:
    """Read the machine about the failed child and print the marker lines (never raises:
    the exit status matters more than the readings)."""
    import json

    try:
        import asyncio

        from trainguard.backends.machine_probe import probe_exit

        memory = _memory(counter)  # type: ignore[arg-type]
        found = asyncio.run(probe_exit(pids={pid}, since_us=since_us, paths=paths, extra=(memory,)))
        text = "\n".join(machine_lines(found))
    except Exception as exc:  # said, never raised
        text = MARKER + json.dumps(
            {
                "source": "kmsg",
                "value": f"node probe failed: {exc}",
                "reading": "absent",
                "sure": False,
                "finding": "absent",
            }
        )
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode())


def _parse(argv: list[str]) -> tuple[list[str], list[str]]:
    paths: list[str] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--path" and i + 1 < len(argv):
            paths.append(argv[i + 1])
            i += 2
            continue
        raise SystemExit(f"node_probe: unknown argument {argv[i]!r}")
    return paths, argv[i + 1 :]


def _exit_like(status: int) -> None:
    """Leave with the child's wait status: its code, or its signal raised again."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process (none of the fatal ones)
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    paths, program = _parse(argv)
    if not program:
        raise SystemExit("node_probe: no program after --")
    paths += [p for p in (os.environ.get(_CHECKPOINT_ENV, ""),) if p and "://" not in p]
    counter = _counter()
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    since_us = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)  # kmsg's clock
    try:  # with the signals Python ignores or blocks back at their defaults
        pid = os.posix_spawnp(
            program[0], program, os.environ, setsigmask=(), setsigdef=_PYTHON_IGNORES
        )
    except OSError as exc:
        sys.stderr.write(f"trainguard: cannot start {program[0]!r}: {exc.strerror or exc}\n")
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    parent = os.getppid()
    while True:
        info = signal.sigwaitinfo(_WAITED)
        if info.si_signo != signal.SIGCHLD:
            if info.si_pid != parent:  # slurmstepd signals the whole step itself
                os.kill(pid, info.si_signo)
            continue
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
    if status != 0:
        with contextlib.suppress(OSError):
            os.write(2, f"{EXITED}{status}\n".encode())
        _probe(pid, since_us, paths, counter)
    _exit_like(status)


if __name__ == "__main__":
    sys.path[:1] = [p for p in sys.path[:1] if not p.endswith("slurm")]  # run by path
    main(sys.argv[1:])
