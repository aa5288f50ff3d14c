"""Errors of the master's own machine (issue 37): an errno that says this process ran out of
something (file descriptors, processes, memory) when it tried to start a replica or probe a
node. It is never the job's fault nor a node's: such a spawn is an internal error, and
such a probe could not run (neither alive nor lost)."""

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
