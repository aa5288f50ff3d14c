"""A tiny watchdog process: when the master dies, even by SIGKILL, no replica survives it.

The master writes `+PGID` / `-PGID` lines on the guardian's stdin as replica process
groups come and go. When stdin reaches EOF (the master is gone, whatever the cause),
the guardian SIGKILLs every group still listed. Unlike PR_SET_PDEATHSIG, this reaches
the whole group, not only the direct child, and it needs no code in the child between
fork and exec (a `preexec_fn` would make CPython fork() the whole master instead of
vfork(): see `LocalBackend._spawn`).

The window between a fork and the `+PGID` line. A replica started with
`subprocess` (vfork + exec) exists before the master knows its pid, so a master killed
in between could leave it behind, unlisted. That window is covered too:

- Before each such spawn the master writes `?`, and after it `=PID` (the spawn made
  PID: watch its group) or `.` (it made nothing). The guardian counts the spawns that
  are announced but not answered.
- Each replica started this way carries `TRAINGUARD_GUARDIAN=<token>` in its
  environment, the token being this guardian's own (random, never shown elsewhere).
- At EOF, if some spawn was never answered, the master died in the window. The
  guardian then also SIGKILLs the process group of every process (of its user) whose
  environment, as exec'd (/proc/PID/environ), holds the token, and looks again, less and
  less often, for `_STRAY_WAIT_S`: a child caught between vfork and exec still shows the
  master's environment, but it execs (or dies) within moments. Only replicas and what
  they started carry the token, and a replica's descendants can only join groups of
  its own session, so no other process is touched.

So whatever instant the master dies at, every replica it started is either listed, or
unanswered and found by its token.

What a replica started outside its group (a new session, a double fork) is not in any
listed group. Where the backend tracks runs by cgroup it sends `CFOLDER` (the folder of
the job's run cgroups): at EOF the guardian kills every process in it and removes it.
Where it cannot (the subreaper fallback, `local.tracking`), it sends `T`: at EOF the
guardian also looks for the token, as after an unanswered spawn.

Replicas the preload zygote forks show the zygote's environment in /proc, without the
token (the programs they exec carry it): they are listed (`+PGID`) as soon as their pid is
known, and until then they die with the zygote (PR_SET_PDEATHSIG), which dies with the
master.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys

TOKEN_ENV = "TRAINGUARD_GUARDIAN"
"""The environment variable that marks a replica as started under one guardian."""

_STRAY_WAIT_S = 3.0

_SCRIPT = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
needle = b"\0" + sys.argv[1].encode() + b"=" + sys.argv[2].encode() + b"\0"
wait_s = float(sys.argv[3])
groups = set()
folders = []
unanswered = 0
by_token = False
for line in sys.stdin:
    line = line.rstrip("\n")
    if line.startswith("C"):
        folders.append(line[1:])
    elif line in ("T", "t"):
        by_token = line == "T"
    elif line.startswith("+"):
        groups.add(int(line[1:]))
    elif line.startswith("-"):
        groups.discard(int(line[1:]))
    elif line == "?":
        unanswered += 1
    elif line.startswith("="):
        unanswered = max(0, unanswered - 1)
        groups.add(int(line[1:]))
    elif line == ".":
        unanswered = max(0, unanswered - 1)
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass


def cgroup_procs(folder):
    found = []
    for top, _, files in os.walk(folder):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(top, "cgroup.procs")) as fh:
                    found += [int(x) for x in fh.read().split()]
            except (OSError, ValueError):
                pass
    return found


def end_cgroups(folder):
    # Kill everything in the job's run cgroups (v2: at once), then remove them.
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(os.path.join(folder, "cgroup.kill"), "w") as fh:
                fh.write("1")
        except OSError:
            pass
        pids = cgroup_procs(folder)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    for top, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):
        try:
            os.rmdir(top)
        except OSError:
            pass


for folder in folders:
    if os.path.isdir(folder):
        end_cgroups(folder)


def strays():
    # The process groups of this user's processes whose environment holds the token.
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/" + entry + "/environ", "rb") as fh:
                env = b"\0" + fh.read()
            if needle in env:
                found.add(os.getpgid(int(entry)))
        except OSError:
            continue
    return found


if unanswered > 0 or by_token:  # a replica, or what it orphaned, known by its token only
    killed = set(groups)
    deadline = time.monotonic() + wait_s
    pause = 0.005
    while True:
        for g in strays() - killed:
            killed.add(g)
            try:
                os.killpg(g, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(2 * pause, 0.5)
"""


# argv[1:] is the guardian's own command line: fork it, and let this parent exit at once.
_DETACH = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


class Guardian:
    def __init__(self, detach: bool = False) -> None:
        """`detach`: no child of this process, yet holding its pipe. Ray SIGKILLs an
        exiting actor's children (`kill_child_processes_on_worker_exit`, on by default),
        which would take the replica host's guardian with it before its stdin's end of
        file told it to end what the runs left; a short-lived parent forks it and exits,
        and the actor's death, however it comes, is still its end of file."""
        self.token = secrets.token_hex(16)
        own = ["-I", "-S", "-c", _SCRIPT, TOKEN_ENV, self.token, str(_STRAY_WAIT_S)]
        argv = ["-I", "-S", "-c", _DETACH, *own] if detach else own
        self._proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl+C in the terminal must not reach it
            text=True,
        )
        if detach:
            self._proc.wait()  # the parent: gone once the guardian is forked

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def sweep_cgroups(self, folder: str) -> None:
        """When the master dies, kill every process in the cgroups under `folder`."""
        self._send(f"C{folder}")

    def sweep_token(self, on: bool = True) -> None:
        """When the master dies, kill every process that carries the token (`on=False`:
        no longer, before a clean close that has ended them itself)."""
        self._send("T" if on else "t")

    def spawning(self) -> None:
        """A replica carrying `TOKEN_ENV=token` is about to be started: answer with
        `spawned` once its pid is known (or it failed), whatever happens in between."""
        self._send("?")

    def spawned(self, pgid: int | None) -> None:
        """Answer an announced spawn: it made the group `pgid` (now watched), or nothing."""
        self._send("." if pgid is None else f"={pgid}")

    def close(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
