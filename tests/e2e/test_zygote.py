"""Warm start: replicas forked from a zygote behave as replicas started the ordinary way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TG, alive, child, read_pid, wait_for
from warm import cold_and_warm

from trainguard.backends.local.python_cmd import PythonCommand, parse
from trainguard.backends.local.zygote import expand
from trainguard.records.store import Store


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            [sys.executable, "train.py", "--lr", "1"],
            PythonCommand("script", "train.py", ("--lr", "1")),
        ),
        (["python", "train.py"], PythonCommand("script", "train.py", ())),
        (
            ["python3", "-u", "-B", "t.py", "-x"],
            PythonCommand("script", "t.py", ("-x",), True, True),
        ),
        (["python", "-uB", "--", "t.py"], PythonCommand("script", "t.py", (), True, True)),
        ([sys.executable, "-m", "pkg.train", "a"], PythonCommand("module", "pkg.train", ("a",))),
        (["python", "-mpkg", "a"], PythonCommand("module", "pkg", ("a",))),
        (["python", "-u", "-c", "print(1)", "x"], PythonCommand("code", "print(1)", ("x",), True)),
        (["python", "t.py", "-m", "x"], PythonCommand("script", "t.py", ("-m", "x"))),
        (["bash", "run.sh"], "'bash' is not the interpreter trainguard runs on"),
        (["/usr/bin/env"], "'/usr/bin/env' is not the interpreter trainguard runs on"),
        (["python", "-O", "t.py"], "interpreter flag -O changes the interpreter itself"),
        (["python", "-X", "dev", "t.py"], "interpreter flag -X changes the interpreter itself"),
        (["python", "-m"], "-m without its argument"),
        (["python"], "no script: an interactive interpreter"),
        (["python", "-"], "a script read from stdin"),
    ],
)
def test_what_a_command_asks_python_to_run(argv: list[str], expected: object) -> None:
    got = parse(argv)
    if isinstance(expected, str):
        assert isinstance(got, str) and got.startswith(expected), got
    else:
        assert got == expected


def test_another_virtual_environment_is_another_interpreter(tmp_path: Path) -> None:
    """A venv's python links to the same binary, yet imports other packages: it starts cold."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    other = tmp_path / "venv" / "bin" / "python"
    other.symlink_to(os.path.realpath(sys.executable))
    assert isinstance(parse([str(other), "t.py"]), str)
    assert isinstance(parse(["python", "t.py"], search_path=str(other.parent)), str)
    assert isinstance(parse(["python", "t.py"], search_path=str(tmp_path)), str)  # none there
    assert parse(["python", "t.py"], search_path=os.path.dirname(sys.executable)) == (
        PythonCommand("script", "t.py", ())
    )


def test_preload_names_expand() -> None:
    assert expand(["torch", "json"])[:2] == ["torch", "torch.distributed"]
    assert expand(["json", "json"]) == ["json"]
    assert expand(["torch", "json"], distributed=False) == ["torch", "json"]


PROBE = """
import faulthandler, json, multiprocessing, os, resource, signal, sys
main = sys.modules["__main__"]
umask = os.umask(0o022)
os.umask(umask)
seen = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "main_file": os.path.basename(getattr(main, "__file__", "") or ""),
    "cwd": os.getcwd(),
    "env": os.environ.get("RANK"),
    "umask": umask,
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "signals": {s.name: str(signal.getsignal(s)) for s in (
        signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGUSR1,
        signal.SIGUSR2, signal.SIGHUP)},
    "stdin": (sys.stdin.isatty(), os.read(0, 1)),
    "faulthandler": faulthandler.is_enabled(),
    "start_method": multiprocessing.get_start_method(),
    "session_leader": os.getsid(0) == os.getpid(),
}
print("PROBE " + json.dumps(seen, default=repr), flush=True)
"""


@pytest.mark.parametrize("how", ["script", "module", "code"])
@pytest.mark.slow
def test_a_forked_replica_sees_what_a_cold_one_sees(tg: TG, tmp_path: Path, how: str) -> None:
    """The same program cold and forked: sys.argv, sys.path[0], __main__, cwd, env, umask,
    rlimits, signal dispositions, stdin, faulthandler, multiprocessing start method."""
    (tmp_path / "probe.py").write_text(PROBE)
    program = {
        "script": [str(tmp_path / "probe.py"), "a", "-b"],
        "module": ["-m", "probe", "a", "-b"],
        "code": ["-c", PROBE, "a", "-b"],
    }[how]
    tg.env["PYTHONPATH"] = str(tmp_path)  # -m finds probe.py; the same for both runs
    argv = ("--", sys.executable, *program)
    note = "warm start: json imported once"
    flags = ("--preload", "json")
    cold, warm = cold_and_warm(tg, *argv, prefix="PROBE ", warm_flags=flags, warm_note=note)
    seen = [json.loads(x[0][0].removeprefix("PROBE ")) for x in (cold, warm)]
    assert seen[0] == seen[1]
    assert seen[0]["argv"][1:] == ["a", "-b"] and seen[0]["name"] == "__main__"


@pytest.mark.slow
def test_a_command_the_zygote_cannot_run_starts_cold_and_says_why(tg: TG) -> None:
    res = tg("run", "--preload", "json", "--", sys.executable, "-O", "-c", "print('ok')")
    assert res.returncode == 0, res.stderr
    assert "worker-0 starts cold: interpreter flag -O changes the interpreter itself" in res.stderr


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


@pytest.mark.slow
def test_forked_replicas_print_exit_restart_and_get_their_own_env(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    res = tg(
        "run",
        "--quiet",
        "--preload",
        "json",
        "--nproc-per-node",
        "2",
        "--",
        *child(
            f"*:pidfile:{pids}",
            "*:env:RANK",
            "*:print:cwd={rank}",
            "1@0:signal:SIGKILL",
            "0:sleep:1.5",  # the primary ends the job: let rank 1 finish first
            "*:print:done {attempt}",
        ),
    )
    assert res.returncode == 0, res.stderr
    assert "warm start: json imported once" in res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1)
    (rec,) = tg.json("records", job["id"])
    assert rec["replica"] == "worker-1" and rec["error_code"] == "137"  # the signal, as usual
    log1 = Path(job["replicas"][1]["log_path"]).read_text()
    assert "RANK=1" in log1 and "done 1" in log1


def _two_forked_forever(tg: TG, pids: Path, *first: str) -> subprocess.Popen[str]:
    """A job of two replicas forked from a zygote that write `pids`.<rank> and run forever."""
    flags = ("run", "--quiet", "--preload", "json", "--nproc-per-node", "2", "--")
    return tg.start(*flags, *child(*first, f"*:pidfile:{pids}", "*:forever"))


def _replicas_and_zygote(master: int, pids: Path) -> tuple[list[int], int]:
    files = [Path(f"{pids}.{r}") for r in range(2)]
    replicas = wait_for(lambda: all(map(read_pid, files)) and list(map(read_pid, files)), 60)
    zygote = _ppid(replicas[0])
    assert zygote != master and _ppid(zygote) == master  # forked by the zygote
    return replicas, zygote


@pytest.mark.slow
def test_a_killed_master_takes_the_zygote_and_its_replicas_along(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    proc = _two_forked_forever(tg, pids, f"*:spawn-child:{pids}")
    try:
        replicas, zygote = _replicas_and_zygote(proc.pid, pids)
        grandchildren = [int(Path(f"{pids}.{r}.child").read_text()) for r in range(2)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # also when the test fails: no master left behind
        proc.wait()
    everything = [*replicas, *grandchildren, zygote]
    wait_for(lambda: not any(alive(p) for p in everything), 15, "nothing left")


@pytest.mark.slow
def test_a_killed_zygote_restarts_the_job_and_sigterm_still_stops_the_master(
    tg: TG, tmp_path: Path
) -> None:
    """The zygote's death is an event (issue 37): the replicas it forked died with it and
    are reported exited with that evidence, the policy judges the attempt as any other
    failure, and SIGTERM still stops the master."""
    pids = tmp_path / "pid"
    proc = _two_forked_forever(tg, pids)
    try:
        first, zygote = _replicas_and_zygote(proc.pid, pids)
        os.kill(zygote, signal.SIGKILL)

        # Its replicas died with it; the master hears it at once (not after the hang
        # interval) and the policy restarts the job: new replicas, started cold.
        def restarted() -> list[int] | None:
            now = [read_pid(Path(f"{pids}.{r}")) or 0 for r in range(2)]
            return now if all(n and n != old for n, old in zip(now, first, strict=True)) else None

        again = wait_for(restarted, 30, "the restarted replicas")
        assert not any(alive(p) for p in first)
        assert all(_ppid(p) == proc.pid for p in again)  # no zygote now: started cold
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("CANCELLED", 2), job
    (rec,) = tg.json("records", job["id"])
    assert (rec["error_code"], rec["decision"].split(":")[0]) == ("INTERNAL", "RestartJob"), rec
    assert "max_internal_restarts 1/" in rec["decision"], rec  # the master's own process
    assert "the preload process (the zygote that forked" in rec["error_message"], rec
    # the evidence, kept with each forked run's end: which process died, and how
    note = "the preload process (the zygote that forked this replica) was killed by SIGKILL"
    ends = [r for r in Store(tg.home).runs_of(job["id"], 0)]
    assert len(ends) == 2 and all(note in (r.tail or "") for r in ends), ends
    assert not any(alive(p) for p in again)


ENDING = """
import atexit, sys, threading, time
out = open(sys.argv[1], "a")
def late():
    time.sleep(0.3)
    out.write("thread done\\n"); out.flush()
threading.Thread(target=late).start()  # not a daemon: Python waits for it
atexit.register(lambda: (out.write("atexit\\n"), out.flush()))
"""


@pytest.mark.slow
def test_a_forked_replica_ends_as_python_does(tg: TG, tmp_path: Path) -> None:
    """Threads that are not daemons are waited for, then the atexit handlers run."""
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    seen = []
    for warm in (False, True):
        marks = tmp_path / f"marks-{warm}"
        flags = ("--preload", "json") if warm else ("--no-preload",)
        res = tg("run", "--quiet", *flags, "--", sys.executable, str(script), str(marks))
        assert res.returncode == 0, res.stderr
        assert ("warm start: json" in res.stderr) == warm, res.stderr
        seen.append(marks.read_text().splitlines())
    assert seen[0] == seen[1] == ["thread done", "atexit"]


ENV_PROBE = """
import os, numpy, torch
from threadpoolctl import threadpool_info
blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
print("ENV", os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(),
      torch.get_num_threads(), blas, os.environ.get("RANK"), flush=True)
"""


LEFT_OPEN = """\
import ctypes, os
import torch  # what makes trainguard fork it warm (preload: auto)
rank = os.environ["RANK"]
kept = open(f"py-{rank}.txt", "w")  # closed by no one: Python's ending writes it out
kept.write("python data\\n")
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
fp = libc.fopen(f"c-{rank}.txt".encode(), b"w")  # C's stdio: flushed by C's exit()
libc.fputs(b"c data\\n", fp)
print("wrote", rank, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--no-preload",)], ids=["warm", "cold"])
def test_what_only_the_end_of_a_process_writes_out_reaches_the_disk(
    tg: TG, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """A file the program never closed, and C's buffered writes (where TensorFlow's file
    writers keep a TensorBoard writer's last events), are written at a forked replica's end
    as at a cold one's: before the fix a warm replica ended with os._exit and lost both."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "left_open.py").write_text(LEFT_OPEN)
    argv = ("run", "--quiet", "--success-policy", "all", "--nproc-per-node", "2", *flags)
    res = subprocess.run(
        [*tg.argv(*argv), str(work / "left_open.py")],
        env=tg.env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    assert ("warm start: torch" in res.stderr) == (not flags), res.stderr
    for rank in (0, 1):
        assert (work / f"py-{rank}.txt").read_text() == "python data\n"
        assert (work / f"c-{rank}.txt").read_text() == "c data\n"


@pytest.mark.slow
@pytest.mark.parametrize("omp", ["1", "2", None])
def test_a_forked_replica_gets_the_thread_counts_and_devices_its_env_asks_for(
    tg: TG, omp: str | None
) -> None:
    """OMP_NUM_THREADS (torch, OpenBLAS) is read when torch loads, in the zygote: applied
    after the fork; CUDA_VISIBLE_DEVICES is read at CUDA's first use, after it."""
    pytest.importorskip("threadpoolctl")
    tg.env.pop("OMP_NUM_THREADS", None)  # the zygote imports torch without it
    env = ("--env", "CUDA_VISIBLE_DEVICES=3") + (("--env", f"OMP_NUM_THREADS={omp}") if omp else ())
    argv = ("--nproc-per-node", "2", *env, "--", sys.executable, "-c", ENV_PROBE)
    cold, warm = cold_and_warm(tg, *argv, prefix="ENV ")
    assert cold == warm
    assert cold[1][0].startswith("ENV 3 0 ") and cold[1][0].endswith(" 1")
    if omp:
        assert cold[0][0] == f"ENV 3 0 {omp} [{omp}] 0"


@pytest.mark.slow
def test_a_preload_that_starts_a_thread_is_refused_and_the_job_runs_cold(
    tg: TG, tmp_path: Path
) -> None:
    (tmp_path / "thready.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    tg.env["PYTHONPATH"] = str(tmp_path)
    res = tg("run", "--preload", "thready", "--", sys.executable, "-c", "print('ran')")
    assert res.returncode == 0, res.stderr
    why = (
        "warm start off: importing thready left 2 threads alive: forking from it would not be safe"
    )
    assert why in res.stderr
    job = tg.only_job()
    assert "ran" in Path(job["replicas"][0]["log_path"]).read_text()
    assert f"- start        {why}" in tg("explain", job["id"]).stdout  # recorded, not only said


def test_a_zygote_holding_a_device_context_would_be_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from trainguard.backends.local import zygote

    fake = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert zygote._accelerator_in_use() == "CUDA"
    fake.cuda.is_initialized = lambda: False
    assert zygote._accelerator_in_use() is None


LOADER = """
import multiprocessing, sys, torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    how = sys.argv[1]
    if how == "spawn":
        multiprocessing.set_start_method("spawn")  # workers re-import __main__ from its file
    data = TensorDataset(torch.arange(16, dtype=torch.float32))
    seen = [b[0].tolist() for b in DataLoader(data, batch_size=4, num_workers=2)]
    print("LOADER", how, multiprocessing.get_start_method(), seen, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_dataloader_with_workers_runs_the_same_cold_and_warm(
    tg: TG, tmp_path: Path, how: str
) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    argv = ("--", sys.executable, str(script), how)
    cold, warm = cold_and_warm(tg, *argv, prefix="LOADER")
    assert cold == warm and len(cold[0]) == 1
    assert cold[0][0].startswith(f"LOADER {how} {how} [[0.0, 1.0, 2.0, 3.0]")
