"""The Open MPI launch helpers, pure: hostfile and argv, the rank wrapper, the output
demultiplexer, mpirun's failure messages, finding the ranks (a real mpirun:
tests/e2e/test_mpi_mpirun.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from trainguard.backends.mpi.launch import (
    EXIT_ON_ERROR,
    RankFailure,
    TagDemux,
    demux,
    exit_on_error,
    find_ranks,
    hostfile_text,
    mpirun_argv,
    parse_rank_failure,
)

EXAMPLE = ROOT / "examples" / "mpi_allreduce.py"

# ---- hostfile and argv -------------------------------------------------------------


def test_hostfile_has_one_line_per_host_with_its_slots() -> None:
    assert hostfile_text([("127.0.0.1", 2)]) == "127.0.0.1 slots=2\n"
    assert hostfile_text([("a", 1), ("b", 4)]) == "a slots=1\nb slots=4\n"


@pytest.mark.parametrize("hosts", [[], [("", 1)], [("a b", 1)], [("#a", 1)], [("a", 0)]])
def test_hostfile_refuses_what_mpirun_would_misread(hosts: list[tuple[str, int]]) -> None:
    with pytest.raises(ValueError):
        hostfile_text(hosts)


def test_mpirun_argv_on_one_host() -> None:
    argv = mpirun_argv("mpirun", Path("/h"), 2, ["python", "x.py", "-n", "3"], ["A", "B_1"])
    assert argv == [
        "mpirun", "--hostfile", "/h", "-np", "2", "--bind-to", "none", "--tag-output",
        "--mca", "btl", "self,vader,tcp",
        "--mca", "btl_tcp_if_include", "lo",
        "--mca", "oob_tcp_if_include", "lo",
        "-x", "A", "-x", "B_1",
        "python", "x.py", "-n", "3",
    ]  # fmt: skip


def test_mpirun_argv_on_several_hosts_leaves_the_network_to_open_mpi() -> None:
    argv = mpirun_argv("/usr/bin/mpirun", Path("h"), 4, ["a.out"], [], loopback=False)
    assert argv == [
        "/usr/bin/mpirun", "--hostfile", "h", "-np", "4", "--bind-to", "none", "--tag-output",
        "a.out",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("np", "command", "names"), [(0, ["a"], []), (1, [], []), (1, ["a"], ["A=1"]), (1, ["a"], [""])]
)
def test_mpirun_argv_refuses_bad_input(np: int, command: list[str], names: list[str]) -> None:
    with pytest.raises(ValueError):
        mpirun_argv("mpirun", Path("h"), np, command, names)


W = EXIT_ON_ERROR


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "t.py", "-a"], ["python", "-c", W, "t.py", "-a"]),
        (["/v/bin/python3.11", "-u", "t.py"], ["/v/bin/python3.11", "-u", "-c", W, "t.py"]),
        (["python", "-W", "x", "-m", "p", "-v"], ["python", "-W", "x", "-c", W, "-m", "p", "-v"]),
        (["python", "-c", "pass"], ["python", "-c", W, "-c", "pass"]),
        (["python", "-m", "mpi4py", "t.py"], ["python", "-m", "mpi4py", "t.py"]),
        (["./a.out", "t.py"], ["./a.out", "t.py"]),
        (["bash", "run.sh"], ["bash", "run.sh"]),
        (["python", "-"], ["python", "-"]),
        (["python", "-m"], ["python", "-m"]),
        (["python"], ["python"]),
        ([], []),
    ],
)  # fmt: skip
def test_python_ranks_are_wrapped_to_exit_on_an_uncaught_exception(
    command: list[str], expected: list[str]
) -> None:
    assert exit_on_error(command) == expected


RANK_SCRIPT = """\
import sys
from helper import VALUE
print("argv", sys.argv[1:], VALUE, __name__, flush=True)
if sys.argv[1] == "raise":
    raise KeyError("lr")
if sys.argv[1] == "exit":
    sys.exit(sys.argv[2] if not sys.argv[2].isdigit() else int(sys.argv[2]))
"""


@pytest.mark.parametrize(
    ("args", "code", "err"),
    [
        (["ok"], 0, ""),
        (["raise"], 1, "KeyError: 'lr'"),
        (["exit", "0"], 0, ""),
        (["exit", "3"], 3, ""),
        (["exit", "bad config"], 1, "bad config"),
    ],
)
@pytest.mark.slow
def test_the_wrapper_runs_a_script_as_python_would_and_ends_at_once_on_error(
    tmp_path: Path, args: list[str], code: int, err: str
) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    marker = tmp_path / "finalized"
    atexit = f"import atexit; atexit.register(open, {str(marker)!r}, 'w'); "
    command = exit_on_error([sys.executable, str(tmp_path / "rank.py"), *args])
    env = {**os.environ, "PYTHONSTARTUP": ""}
    res = subprocess.run(
        [*command[:2], atexit + command[2], *command[3:]],
        capture_output=True, text=True, timeout=30, env=env, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == code, res.stderr
    assert res.stdout == f"argv {args} 42 __main__\n"
    assert err in res.stderr
    assert ("Traceback" in res.stderr) == (args[0] == "raise")
    assert marker.exists() == (code == 0)  # atexit (MPI_Finalize) runs only on success


@pytest.mark.slow
def test_the_wrapper_runs_modules_and_code_strings(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("import sys; print(__name__, sys.argv[1:]); 1 / 0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for target, out in ((["-m", "mod"], "__main__ ['a']\n"), (["-c", "print(2)"], "2\n")):
        command = exit_on_error([sys.executable, *target, "a"])
        res = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
        assert res.stdout == out
        assert res.returncode == (1 if target[0] == "-m" else 0), res.stderr
        assert ("ZeroDivisionError" in res.stderr) == (target[0] == "-m")


# ---- the demultiplexer -------------------------------------------------------------

# What Open MPI 4.1.4 wrote for two ranks that each wrote "aN\nbN\ncN", slept, then " tailN\n",
# "errN\n" on stderr and one print(): every write is tagged, even one inside a line.
TAGGED_STDOUT = (
    b"[1,0]<stdout>:a0\n[1,0]<stdout>:b0\n[1,0]<stdout>:c0[1,1]<stdout>:a1\n"
    b"[1,1]<stdout>:b1\n[1,1]<stdout>:c1[1,0]<stdout>: tail0\n"
    b"[1,0]<stdout>:isatty True False False\n[1,1]<stdout>: tail1\n"
    b"[1,1]<stdout>:isatty True False False\n"
)
TAGGED_STDOUT_LINES = [
    (0, "a0"), (0, "b0"), (1, "a1"), (1, "b1"), (0, "c0 tail0"),
    (0, "isatty True False False"), (1, "c1 tail1"), (1, "isatty True False False"),
]  # fmt: skip

# A Python traceback on a rank's unbuffered stderr, then mpirun's own message (verbatim).
TAGGED_STDERR = (
    b"[1,1]<stderr>:Traceback (most recent call last):\n"
    b'[1,1]<stderr>:  File "x.py", line 111, in main\n'
    b"[1,1]<stderr>:    [1,1]<stderr>:print(config['lr'])\n"
    b"[1,1]<stderr>:       [1,1]<stderr>: ~[1,1]<stderr>:~~~~~[1,1]<stderr>:^^\n"
    b"[1,1]<stderr>:KeyError: 'lr'\n"
    b"--------------------------------------------------------------------------\n"
    b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n"
    b"with errorcode 1.\n"
)


def all_splits(data: bytes) -> list[list[bytes]]:
    """The stream as one chunk, byte by byte, and cut in two at every point."""
    return [[data], [data[i : i + 1] for i in range(len(data))]] + [
        [data[:i], data[i:]] for i in range(1, len(data))
    ]


def test_demux_joins_each_ranks_pieces_into_whole_lines_however_the_pipe_splits_it() -> None:
    for chunks in all_splits(TAGGED_STDOUT):
        assert list(demux(chunks)) == TAGGED_STDOUT_LINES


def test_demux_sends_mpiruns_own_lines_to_none() -> None:
    for chunks in all_splits(TAGGED_STDERR):
        lines = list(demux(chunks))
        assert [t for r, t in lines if r == 1] == [
            "Traceback (most recent call last):",
            '  File "x.py", line 111, in main',
            "    print(config['lr'])",
            "        ~~~~~~^^",
            "KeyError: 'lr'",
        ]
        assert [t for r, t in lines if r is None] == [
            "-" * 74,
            "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
            "with errorcode 1.",
        ]


def test_feed_returns_lines_as_soon_as_they_are_complete() -> None:
    d = TagDemux()
    assert d.feed(b"[1,0]<stdout>:hal") == []
    assert d.feed(b"f\n[1,1]<std") == [(0, "half")]
    assert d.feed(b"out>:x") == []
    assert d.feed(b"\nmpirun says\n") == [(1, "x"), (None, "mpirun says")]
    assert d.close() == []


def test_close_flushes_unfinished_lines_of_every_rank() -> None:
    d = TagDemux()
    assert d.feed(b"[1,0]<stdout>:no newline[1,1]<stderr>:nor here") == []
    assert d.close() == [(0, "no newline"), (1, "nor here")]


def test_a_ranks_stdout_and_stderr_pieces_are_not_mixed() -> None:
    data = b"[1,0]<stdout>:out [1,0]<stderr>:err\n[1,0]<stdout>:put\n"
    assert list(demux([data])) == [(0, "err"), (0, "out put")]


def test_open_mpi_5_tags_have_a_space_and_may_name_the_namespace() -> None:
    data = b"[1,0]<stdout>: a\n[prterun-vm-42@1,12]<stderr>:  b\n"
    for chunks in all_splits(data):
        assert list(demux(chunks, space_after_tag=True)) == [(0, "a"), (12, " b")]


def test_text_that_only_looks_like_a_tag_is_kept() -> None:
    data = b"[1,0]<stdout>:list [1, 2] and [x]\n[not a tag\n[1,0]<stdout>:[1,\n"
    for chunks in all_splits(data):
        assert list(demux(chunks)) == [(0, "list [1, 2] and [x]"), (None, "[not a tag"), (0, "[1,")]


def test_utf8_split_across_chunks_and_crlf() -> None:
    data = "[1,0]<stdout>:héllo ✓\r\n".encode()
    for chunks in all_splits(data):
        assert list(demux(chunks)) == [(0, "héllo ✓")]


def test_a_line_without_end_comes_out_in_bounded_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trainguard.backends.mpi.launch.MAX_LINE_BYTES", 8)
    assert list(demux([b"[1,0]<stdout>:0123456789abc\n"])) == [(0, "0123456789abc"), (0, "")]
    d = TagDemux()
    assert d.feed(b"[1,0]<stdout>:0123") == []
    assert d.feed(b"456789") == [(0, "0123456789")]


# ---- mpirun's failure messages -----------------------------------------------------

DASHES = "-" * 74
SIGKILL_4_1 = f"""{DASHES}
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
{DASHES}
{DASHES}
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
{DASHES}
"""
ABORT_4_1 = f"""{DASHES}
MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
with errorcode 1.

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
You may or may not see output from other processes, depending on
exactly when Open MPI kills them.
{DASHES}
"""
NONZERO_4_1 = f"""{DASHES}
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
{DASHES}
{DASHES}
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[13464,1],1]
  Exit code:    3
{DASHES}
"""
NO_FINALIZE_4_1 = f"""{DASHES}
mpirun has exited due to process rank 1 with PID 0 on
node vm exiting improperly. There are three reasons this could occur:

1. this process did not call "init" before exiting, but others in
the job did. This can cause a job to hang indefinitely while it waits
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SIGKILL_4_1, RankFailure(1, "signal", None, "vm", 9, None)),
        (ABORT_4_1, RankFailure(1, "abort", exit_code=1)),
        (NONZERO_4_1, RankFailure(1, "exit", exit_code=3)),
        (NO_FINALIZE_4_1, RankFailure(1, "no_finalize", None, "vm")),
        # Open MPI 5 (PRRTE's help-prterun.txt): a real pid, with and without the name
        (
            "prterun noticed that process rank 3 with PID 4242 on node n7 exited on signal 11.",
            RankFailure(3, "signal", 4242, "n7", 11),
        ),
        (
            "mpirun noticed that process rank 0 with PID 17 on node n1 exited on signal 6 (Abort).",
            RankFailure(0, "signal", 17, "n1", 6),
        ),
        (
            "prterun detected that one or more processes exited with non-zero status, thus "
            "causing\nthe job to be terminated. The first process to do so was:\n\n"
            "   Process name: [prterun-n1-99@1,2]\n   Exit code:    7\n",
            RankFailure(2, "exit", exit_code=7),
        ),
        (
            'mpirun has exited due to process rank 5 with PID 31 on\nnode n2 calling "abort".',
            RankFailure(5, "abort", 31, "n2"),
        ),
        # older versions wrap the line
        (
            "mpirun noticed that process rank 1 with PID 23857 on node\n"
            "dhcp-119-202.caltech.edu exited on signal 11 (Segmentation fault).",
            RankFailure(1, "signal", 23857, "dhcp-119-202.caltech.edu", 11),
        ),
    ],
)  # fmt: skip
def test_parse_rank_failure(text: str, expected: RankFailure) -> None:
    got = parse_rank_failure(text.splitlines())
    assert got is not None
    assert got == RankFailure(**{**expected.__dict__, "message": got.message})
    assert got.message.startswith(("mpirun ", "prterun ", "MPI_ABORT "))


def test_parse_rank_failure_returncode_is_as_subprocess_spells_it() -> None:
    killed = parse_rank_failure(SIGKILL_4_1.splitlines())
    aborted = parse_rank_failure(ABORT_4_1.splitlines())
    assert killed is not None and killed.returncode == -9
    assert aborted is not None and aborted.returncode == 1


def test_parse_rank_failure_takes_the_first_failure_and_none_without_one() -> None:
    both = NONZERO_4_1 + SIGKILL_4_1
    assert parse_rank_failure(both.splitlines()) == parse_rank_failure(NONZERO_4_1.splitlines())
    assert parse_rank_failure(SIGKILL_4_1.splitlines()[:4]) is None  # "Primary job" only
    assert parse_rank_failure([]) is None


# ---- finding the ranks -------------------------------------------------------------


def fake_proc(root: Path, procs: dict[int, tuple[int, str, dict[str, str] | None]]) -> Path:
    """A /proc with pid -> (ppid, comm, environ or None for unreadable)."""
    for pid, (ppid, comm, env) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560\n")
        if env is not None:
            (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (root / "self").mkdir()
    return root


def test_find_ranks_takes_the_top_process_of_each_rank_under_this_launcher(tmp_path: Path) -> None:
    rank = "OMPI_COMM_WORLD_RANK"
    proc = fake_proc(
        tmp_path,
        {
            1: (0, "init", {}),
            100: (1, "mpirun", {"PATH": "/bin"}),
            101: (100, "python3 ) S 7", {rank: "0", "X": "a=b"}),  # a comm with ") "
            102: (100, "bash", {rank: "1"}),  # a shell that runs python
            103: (102, "python", {rank: "1"}),
            104: (101, "pt_data_worker", {rank: "0"}),  # a rank's own child
            105: (100, "helper", {}),
            106: (105, "python", {"PMIX_RANK": "2"}),  # below a helper; Open MPI 5 name
            107: (100, "gone", None),  # exited while we looked
            200: (1, "mpirun", {}),
            201: (200, "python", {rank: "3"}),  # another job's rank
        },
    )
    assert find_ranks(100, proc=proc) == {0: 101, 1: 102, 2: 106}
    assert find_ranks(200, proc=proc) == {3: 201}
    assert find_ranks(999, proc=proc) == {}
