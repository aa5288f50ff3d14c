"""Open MPI launch pieces for `framework: mpi`: pure helpers, no trainguard imports.

trainguard starts one process, `mpirun`, and mpirun starts the ranks. These helpers build
its hostfile and argv, split its tagged output back into per-rank lines, read which rank
failed from its messages, and find the ranks' pids under it. Facts they rest on were
measured with Open MPI 4.1.4 (Debian 12) and mpi4py 4.1.2; /tmp/notes/mpi.md has more:

* each rank is a direct child of mpirun (no orted on one host), in its own process group;
* `--tag-output` tags every line *and every write*: a line written in pieces arrives as
  `[1,0]<stdout>:ab[1,1]<stdout>:x\\n[1,0]<stdout>:c\\n`, interleaved with other ranks;
* mpirun's own messages go to its stderr, untagged, and name the failed rank, but print
  `PID 0` (a 4.1 bug): pids come from `find_ranks`, not from the messages;
* a rank that raises must exit without MPI_Finalize, else it blocks there and the job
  hangs: `exit_on_error` wraps a Python command so that it does.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ALLOW_ROOT_ENV: dict[str, str] = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}
"""Add to mpirun's environment when running as root (CI): it refuses root otherwise.
Unlike `--allow-run-as-root`, the argv stays the same for root and non-root."""

LOOPBACK_MCA: tuple[str, ...] = (
    "--mca", "btl", "self,vader,tcp",
    "--mca", "btl_tcp_if_include", "lo",
    "--mca", "oob_tcp_if_include", "lo",
)  # fmt: skip
"""One host: shared memory between ranks, and no socket on any interface but loopback."""

RANK_ENV_NAMES: tuple[str, ...] = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")
"""Set by Open MPI 4 and 5 in every rank's environment before exec."""

MAX_LINE_BYTES = 1 << 20
"""A rank that never writes a newline still gets its text out, in pieces of this size."""


def hostfile_text(hosts: list[tuple[str, int]]) -> str:
    """The hostfile for `(host, slots)` pairs, e.g. `127.0.0.1 slots=2`.

    Slots, not cores, bound how many ranks mpirun places on a host, so with one slot per
    rank no `--oversubscribe` is needed even on a 2-core machine.
    """
    if not hosts:
        raise ValueError("an MPI job needs at least one host")
    lines = []
    for host, slots in hosts:
        if not host or any(c.isspace() for c in host) or host.startswith("#"):
            raise ValueError(f"bad host name: {host!r}")
        if slots < 1:
            raise ValueError(f"host {host} needs at least one slot, not {slots}")
        lines.append(f"{host} slots={slots}\n")
    return "".join(lines)


def mpirun_argv(
    mpirun: str,
    hostfile: Path,
    np: int,
    command: list[str],
    env_names: list[str],
    *,
    loopback: bool = True,
) -> list[str]:
    """The mpirun command line for Open MPI 4.x.

    `--tag-output` so rank lines can be told apart (`TagDemux`); `--bind-to none` since
    trainguard, not mpirun, places work on devices, and binding 2+ ranks per core would
    serialise them; `-x NAME` forwards variables to ranks on other hosts (local ranks
    inherit mpirun's whole environment anyway). `loopback` keeps all traffic on `lo`:
    right for one host, wrong for several.
    """
    if np < 1:
        raise ValueError(f"np must be at least 1, not {np}")
    if not command:
        raise ValueError("empty MPI command")
    argv = [mpirun, "--hostfile", str(hostfile), "-np", str(np)]
    argv += ["--bind-to", "none", "--tag-output"]
    if loopback:
        argv += LOOPBACK_MCA
    for name in env_names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"not an environment variable name: {name!r}")
        argv += ["-x", name]
    return argv + list(command)


_PYTHON = re.compile(r"python[0-9.]*")
_PY_OPTS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})


EXIT_ON_ERROR = """\
import os, runpy, sys, traceback
def end(code):
    for f in sys.stdout, sys.stderr:
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)
args = sys.argv[1:]
try:
    if args[0] == "-m":
        sys.argv[:] = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv[:] = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv[:] = args
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        runpy.run_path(args[0], run_name="__main__")
except SystemExit as e:
    if e.code is None or e.code == 0:
        raise
    if not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
    end(e.code if isinstance(e.code, int) else 1)
except BaseException:
    traceback.print_exc()
    end(1)
"""
"""Runs a rank's Python program; an uncaught exception ends the process at once with status 1
(os._exit: no MPI_Finalize, no MPI_Abort), after its traceback is flushed."""


def exit_on_error(command: list[str]) -> list[str]:
    """`python [opts] x.py ...` -> `python [opts] -c EXIT_ON_ERROR x.py ...` (also -m, -c).

    A rank that raises must not reach MPI_Finalize: it would block there while its peers
    wait in their next collective, and the job would hang. `python -m mpi4py` calls
    MPI_Abort instead, but with Open MPI 4.1.4 mpirun then lost the rank's traceback in
    7 runs of 20 and the message naming the rank in 5-11 of 20. A non-zero exit without
    MPI_Finalize gave both, 20 of 20: mpirun names the rank and its status, and kills the
    rest. Commands that are not `python ...`, or already `python -m mpi4py`, are kept.
    """
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return list(command)
    i = 1
    while i < len(command):
        arg = command[i]
        if arg in ("-m", "-c") or not arg.startswith("-"):
            if command[i : i + 2] == ["-m", "mpi4py"] or command[i:] in (["-m"], ["-c"]):
                return list(command)
            return [*command[:i], "-c", EXIT_ON_ERROR, *command[i:]]
        i += 2 if arg in _PY_OPTS_WITH_VALUE else 1
    return list(command)


_TAG = re.compile(rb"\[([^\[\]\s,]+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TAG_PREFIX = re.compile(rb"\[[^\[\]\s,]*(?:,\d*(?:\](?:<[a-z]*>?)?)?)?\Z")
_Key = tuple[int | None, bytes]


class TagDemux:
    """Splits mpirun `--tag-output` bytes into `(rank, line)`; rank None for mpirun's own.

    Feed it the chunks of one pipe as they are read, split anywhere. A tag opens a
    fragment that runs to the next newline or the next tag; fragments of one rank and
    stream are joined into lines, so a line the rank wrote in pieces comes out whole. Text
    after a newline that no tag opens is mpirun's. Limit: untagged text right after a
    fragment with no newline is taken as that fragment's (mpirun prints its messages on
    stderr, so reading mpirun's stdout and stderr apart avoids it). Open MPI 5 (PMIx)
    writes `[1,0]<stdout>: ` with a space: pass `space_after_tag=True` for it.
    """

    def __init__(self, *, space_after_tag: bool = False) -> None:
        self._space = space_after_tag
        self._buf = b""
        self._owner: _Key = (None, b"")
        self._partial: dict[_Key, bytearray] = {}

    def feed(self, chunk: bytes) -> list[tuple[int | None, str]]:
        """The lines completed by this chunk, in stream order."""
        self._buf += chunk
        out: list[tuple[int | None, str]] = []
        pos = 0
        buf = self._buf
        tag = _TAG.search(buf)  # searched again only once passed: lines between are cheap
        while pos < len(buf):
            nl = buf.find(b"\n", pos, tag.start() if tag else len(buf))
            if nl >= 0:
                self._add(buf[pos:nl], out)
                self._emit(self._owner, out)
                self._owner = (None, b"")
                pos = nl + 1
            elif tag is not None and not (self._space and tag.end() == len(buf)):
                self._add(buf[pos : tag.start()], out)
                self._owner = (int(tag.group(2)), tag.group(3))
                pos = tag.end()
                if self._space and buf[pos : pos + 1] == b" ":
                    pos += 1
                tag = _TAG.search(buf, pos)
            else:
                hold = self._held_back(buf, pos, tag)
                self._add(buf[pos:hold], out)
                pos = hold
                break
        self._buf = buf[pos:]
        return out

    def close(self) -> list[tuple[int | None, str]]:
        """At end of stream: the rest, and every unfinished line."""
        out: list[tuple[int | None, str]] = []
        self._add(self._buf, out)
        self._buf = b""
        for key in list(self._partial):
            if self._partial[key]:
                self._emit(key, out)
        return out

    def _held_back(self, buf: bytes, pos: int, tag: re.Match[bytes] | None) -> int:
        """Where the text safe to hand on ends: a tag may be arriving cut in two."""
        if tag is not None:  # whole, but the space after it may still come
            return tag.start()
        start = buf.rfind(b"[", pos)
        if start >= 0 and _TAG_PREFIX.match(buf, start):
            return start
        return len(buf)

    def _add(self, text: bytes, out: list[tuple[int | None, str]]) -> None:
        if not text:
            return
        line = self._partial.setdefault(self._owner, bytearray())
        line += text
        if len(line) >= MAX_LINE_BYTES:
            self._emit(self._owner, out)

    def _emit(self, key: _Key, out: list[tuple[int | None, str]]) -> None:
        line = self._partial.pop(key, bytearray())
        out.append((key[0], line.rstrip(b"\r").decode("utf-8", "replace")))


def demux(
    chunks: Iterable[bytes], *, space_after_tag: bool = False
) -> Iterator[tuple[int | None, str]]:
    """`TagDemux` over a whole stream: every `(rank, line)` in order."""
    d = TagDemux(space_after_tag=space_after_tag)
    for chunk in chunks:
        yield from d.feed(chunk)
    yield from d.close()


@dataclass(frozen=True)
class RankFailure:
    """The rank mpirun blamed for ending the job, as its message tells it."""

    rank: int
    kind: str  # "signal", "exit" (non-zero), "abort" (MPI_Abort), "no_finalize"
    pid: int | None = None  # None where mpirun printed 0 (Open MPI 4.1 always does)
    node: str | None = None
    signal: int | None = None
    exit_code: int | None = None  # the exit status, or MPI_Abort's errorcode
    message: str = ""

    @property
    def returncode(self) -> int | None:
        """As subprocess spells it (-9 for SIGKILL), for trainguard's exit classifier."""
        return -self.signal if self.signal is not None else self.exit_code


_WHO = (
    r"(?:\S+ )?(?:noticed that|has exited due to) process rank (?P<rank>\d+)"
    r" with PID (?P<pid>\d+) on node (?P<node>\S+)"
)
_SIGNAL = r" exited on signal (?P<sig>\d+)(?: \([^)]*\))?\.?"
_ABORT = (
    r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator \S+"
    r" with errorcode (?P<code>-?\d+)\.?"
)
_NONZERO = (
    r"(?:\S+ )?detected that one or more processes exited with non-zero status, thus causing the"
    r" job to be terminated\. The first process to do so was: Process name: \S*?,(?P<rank>\d+)\]+"
    r" Exit code: (?P<code>-?\d+)"
)
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("signal", re.compile(_WHO + _SIGNAL)),
    ("abort", re.compile(_ABORT)),
    ("exit", re.compile(_NONZERO)),
    ("no_finalize", re.compile(_WHO + r" exiting improperly\.")),
    ("abort", re.compile(_WHO + r' calling "abort"\.')),
)


def parse_rank_failure(text_lines: Iterable[str]) -> RankFailure | None:
    """The first failed rank that mpirun's messages name, or None.

    Feed it mpirun's own (untagged) lines. The wordings are Open MPI 4.1's, which
    Open MPI 5 (PRRTE) keeps; lines are joined first since older versions wrap them.
    """
    text = re.sub(r"\s+", " ", " ".join(text_lines))
    found = [(m.start(), kind, m) for kind, p in _FAILURES if (m := p.search(text))]
    if not found:
        return None
    _, kind, m = min(found, key=lambda f: f[0])
    g = m.groupdict()

    def num(name: str) -> int | None:
        return int(g[name]) if g.get(name) is not None else None

    return RankFailure(
        rank=int(g["rank"]),
        kind=kind,
        pid=num("pid") or None,  # 0: not known
        node=g.get("node"),
        signal=num("sig"),
        exit_code=num("code"),
        message=m[0],
    )


def _children(proc: Path) -> dict[int, list[int]]:
    """ppid -> child pids, from /proc/PID/stat (the comm field may hold ')' and spaces)."""
    kids: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # gone
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _rank_of(pid: int, proc: Path) -> int | None:
    try:
        environ = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None  # gone, or not ours to read
    env = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
    for name in RANK_ENV_NAMES:
        value = env.get(name.encode())
        if value is not None and value.isdigit():
            return int(value)
    return None


def find_ranks(launcher_pid: int, *, proc: Path = Path("/proc")) -> dict[int, int]:
    """rank -> pid of the ranks running under this mpirun, on this host.

    A rank is the highest descendant whose environment holds OMPI_COMM_WORLD_RANK (set
    before exec), so its own children (data loaders, a shell's python) are not taken for
    it. mpirun's messages can't tell: Open MPI 4.1 prints every pid as 0.
    """
    kids = _children(proc)
    ranks: dict[int, int] = {}
    todo = deque(kids.get(launcher_pid, []))
    while todo:
        pid = todo.popleft()
        rank = _rank_of(pid, proc)
        if rank is None:
            todo.extend(kids.get(pid, []))
        else:
            ranks.setdefault(rank, pid)
    return ranks
