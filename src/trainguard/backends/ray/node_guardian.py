"""The replica host's guardian, out of Ray's reach (issue 37).

When a Ray worker exits (ray.kill, its driver gone: the job's end), Ray SIGKILLs the
worker's child processes (`kill_child_processes_on_worker_exit`, on by default): the
guardian (`backends.guardian`) would die with the actor before its stdin's end of file
told it to end what the actor's runs left (their cgroups, their groups). So it starts
detached: a short-lived parent forks it and exits, and it is no child of the actor, yet
holds the actor's pipe; the actor's death, however it comes, is still its end of file.
"""

from __future__ import annotations

import secrets
import subprocess
import sys

from trainguard.backends.guardian import _SCRIPT, _STRAY_WAIT_S, TOKEN_ENV, Guardian

# argv[1:] is the guardian's own command line: fork it, and let this parent exit at once.
_DETACH = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


class NodeGuardian(Guardian):
    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        guardian = ["-I", "-S", "-c", _SCRIPT, TOKEN_ENV, self.token, str(_STRAY_WAIT_S)]
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _DETACH, *guardian],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own session, as the guardian's
            text=True,
        )
        self._proc.wait()  # the parent: gone once the guardian is forked
