"""Errors of the master's own machine (issue 37): an errno that says this process ran out of
something (file descriptors, processes, memory) when it tried to start a replica or probe a
node. It is never the job's fault nor a node's: such a spawn is an internal error, and
such a probe could not run (neither alive nor lost). Likewise the death of the master's own
warm-start process (the zygote), which takes the replicas it forked along."""

from __future__ import annotations

import errno
import os

OWN_RESOURCE_ERRNOS: frozenset[int] = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOBUFS}
)
"""Out of descriptors (the process's, the system's), of processes (fork), of memory."""


def is_own_resource_errno(code: int | None) -> bool:
    return code is not None and code in OWN_RESOURCE_ERRNOS


_WHAT_RAN_OUT = {
    errno.EMFILE: "the master's open files (raise its hard limit: ulimit -Hn)",
    errno.ENFILE: "the system's open files (fs.file-max)",
    errno.EAGAIN: "processes or memory to start one (ulimit -u)",
    errno.ENOMEM: "memory",
    errno.ENOBUFS: "buffer memory",
}


def own_resource_text(code: int) -> str:
    """The errno and what ran out, in words: "EMFILE (Too many open files): out of the
    master's open files (raise its hard limit: ulimit -Hn)"."""
    name = errno.errorcode.get(code, str(code))
    what = _WHAT_RAN_OUT.get(code)
    return f"{name} ({os.strerror(code)})" + (f": out of {what}" if what else "")


ZYGOTE_DIED = "trainguard: the preload process (the zygote that forked this replica) was "
"""How the local backend's note on a forked replica's end begins when its warm-start
process died (the replica dies with it: PR_SET_PDEATHSIG): a line for the person reading
the log tail; the classifier reads `ExitEvidence.zygote_died`, which no replica can
print."""


def zygote_death_note(how: str) -> str:
    """The note for a replica whose zygote died `how` ("killed by SIGKILL", "exited with 1")."""
    return f"{ZYGOTE_DIED}{how}; the replica died with it"
