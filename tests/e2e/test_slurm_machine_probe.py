"""The wrapper a Slurm task runs under (`slurm.node_probe`): the program's exit status
unchanged, signals delivered once, the machine read only at a failure and carried back
in marker lines that the backend takes out of the tail; the stacks still find the
program, not the wrapper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from trainguard.backends.interface import Launch, ReplicaExited
from trainguard.backends.slurm.node_probe import (
    EXITED,
    MARKER,
    ended_on_its_own,
    machine_lines,
    readings_of,
    with_readings,
    wrapped_argv,
)
from trainguard.backends.slurm.placement import srun_argv
from trainguard.backends.slurm.step_stacks import find_replica
from trainguard.classify.readings import Finding, MachineReading, Source

SEGFAULT = "import ctypes; ctypes.string_at(0)"
READINGS = (
    MachineReading(
        Source.KMSG,
        "python[7]: segfault at 0 ...",
        "a segfault",
        True,
        Finding.SEGFAULT,
        "libc.so.6",
        7,
    ),
    MachineReading(Source.GPU, "no nvidia-smi on this machine", "absent", False, Finding.ABSENT),
)


def test_an_oom_kill_counted_while_it_ran_is_sure_only_in_the_steps_own_cgroup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainguard.backends.slurm import node_probe

    for own in (True, False):
        monkeypatch.setattr(node_probe, "_counter", lambda own=own: ("/cg/memory.events", 1, own))
        r = node_probe._memory(("/cg/memory.events", 0, own))
        assert (r.finding, r.sure, r.value) == (
            Finding.OOM_KILL,
            own,
            "/cg/memory.events: oom_kill 0 -> 1",
        )
    assert node_probe._memory(("/cg/memory.events", 1, True)).finding is Finding.NOTHING
    monkeypatch.setattr(node_probe, "_counter", lambda: None)
    assert node_probe._memory(None).finding is Finding.ABSENT


def _launch(tmp_path: Path) -> Launch:
    return Launch(0, "worker-0", 0, 0, ("python", "t.py"), {}, "/work", tmp_path / "log")


def test_the_readings_go_through_the_log_and_out_of_its_tail() -> None:
    lines = machine_lines(READINGS)
    assert all(line.startswith(MARKER) and len(line) < 4096 for line in lines)
    found, tail = readings_of(("step 1", *lines, "srun: error: n1: task 0: Segmentation fault"))
    assert found == READINGS
    assert tail == ("step 1", "srun: error: n1: task 0: Segmentation fault")
    assert readings_of(("step 1",)) == ((), ("step 1",))
    long = MachineReading(Source.KMSG, "x" * 10_000, "y" * 10_000, True)
    assert all(len(line) < 4096 for line in machine_lines([long]))


def test_an_exit_carries_what_its_node_read(tmp_path: Path) -> None:
    tail = ("boom", *machine_lines(READINGS), "No space left on device")
    ev = ReplicaExited.of(_launch(tmp_path), 1, 0.0, -11, stop_requested=False, log_tail=tail)
    out = with_readings(ev)
    assert out.evidence.log_tail == ("boom", "No space left on device")
    assert out.evidence.machine[:2] == READINGS
    assert any(r.source == Source.TAIL for r in out.evidence.machine)  # the tail's ENOSPC
    bare = ReplicaExited.of(_launch(tmp_path), 1, 0.0, 1, stop_requested=False, log_tail=("boom",))
    assert with_readings(bare) == bare


def test_a_step_runs_its_program_under_the_wrapper(tmp_path: Path) -> None:
    argv = srun_argv(_launch(tmp_path), "n1", "42", task_env={"A": "1"}, probe=True)
    cut = argv.index("--", argv.index("env") + 2)
    assert argv[cut - 7 : cut - 2] == wrapped_argv(())[:5]
    assert argv[cut - 2 : cut] == ["--path", "/work"] and argv[cut + 1 :] == ["python", "t.py"]
    assert argv[-2:] == ["python", "t.py"] and "node_probe" not in " ".join(
        srun_argv(_launch(tmp_path), "n1", "42")
    )


def _wrapped(*program: str, **kw: object) -> subprocess.Popen[str]:
    proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
        wrapped_argv(program), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )
    return proc


@pytest.mark.slow
def test_the_exit_status_is_the_programs_and_a_success_reads_nothing(tmp_path: Path) -> None:
    ok = _wrapped(sys.executable, "-c", "print('fine')")
    out, err = ok.communicate(timeout=30)
    assert (ok.returncode, out, err) == (0, "fine\n", "")
    code = _wrapped(sys.executable, "-c", "import sys; sys.exit(3)")
    _, err = code.communicate(timeout=30)
    assert code.returncode == 3
    found, _ = readings_of(err.splitlines())
    assert {r.source for r in found} >= {Source.CGROUP, Source.KMSG, Source.GPU}


@pytest.mark.slow
def test_a_signal_death_is_the_programs_with_no_core_of_the_wrapper(tmp_path: Path) -> None:
    seg = _wrapped(sys.executable, "-c", SEGFAULT, cwd=tmp_path)
    _, err = seg.communicate(timeout=30)
    assert seg.returncode == -signal.SIGSEGV, err
    assert not list(tmp_path.glob("core*"))  # the wrapper dumped none
    found, rest = readings_of(err.splitlines())
    assert found and not any(MARKER in line for line in rest)
    killed = _wrapped(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)")
    killed.communicate(timeout=30)
    assert killed.returncode == -signal.SIGKILL
    bare = subprocess.run(
        wrapped_argv([sys.executable, "-c", "print('bare')"], ["/"], python="/no/python"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert (bare.returncode, bare.stdout) == (0, "bare\n"), bare.stderr  # no wrapper there
    missing = _wrapped("no-such-program-here")
    _, err = missing.communicate(timeout=30)
    assert missing.returncode == 127 and "no-such-program-here" in err


COUNTER = """
import signal, sys, time
seen = []
signal.signal(signal.SIGUSR1, lambda *_: seen.append(1) or print(len(seen), flush=True))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_signal_reaches_the_program_once_from_the_step_or_from_anyone() -> None:
    """Slurm signals every process of the step (here: the group, from the wrapper's
    parent): the program gets it itself, the wrapper does not send it again; a signal
    only the wrapper got (another sender) is forwarded."""
    proc = _wrapped(sys.executable, "-c", COUNTER, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    os.killpg(proc.pid, signal.SIGUSR1)  # from the parent, to all: as slurmstepd does
    assert proc.stdout.readline() == "1\n"
    subprocess.run(["kill", "-USR1", str(proc.pid)], check=True)  # the wrapper alone
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out == "2\n"  # forwarded once; the group's signal never twice
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.slow
def test_the_stacks_find_the_program_not_its_wrapper() -> None:
    env = {**os.environ, "TRAINGUARD_JOB_ID": "tg-wrap-test", "TRAINGUARD_REPLICA": "worker-7"}
    proc = _wrapped(
        sys.executable, "-c", "print('up', flush=True); import time; time.sleep(30)", env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        child = wait_for(
            lambda: next(
                iter(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()), None
            ),
            10,
            "the wrapper's child",
        )
        assert find_replica("tg-wrap-test", "worker-7") == int(child)
    finally:
        proc.kill()
        os.kill(int(child), signal.SIGKILL)
        proc.communicate(timeout=30)


def test_the_wrappers_exit_word_says_the_program_ended_and_leaves_the_tail() -> None:
    """Said before the node is read (seconds, with a slow nvidia-smi): a stop that comes
    meanwhile finds a replica that ended on its own; the log tail keeps the program's."""
    tail = (
        "step 1 loss 0.5",
        f"{EXITED}{139 << 8}",
        f"{MARKER}" + '{"source": "gpu", "value": "x", '
        '"reading": "absent", "sure": false, "finding": "absent"}',
    )
    assert ended_on_its_own(tail[:2]) == 139 and ended_on_its_own(tail[:1]) is None
    assert ended_on_its_own((f"{EXITED}11",)) == -11  # a wait status: SIGSEGV
    found, rest = readings_of(tail)
    assert rest == ("step 1 loss 0.5",) and len(found) == 1
