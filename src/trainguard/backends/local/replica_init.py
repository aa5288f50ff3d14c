"""Becoming the replica, in a child the warm-start zygote forked: what the interpreter would
have set up for the replica's program, applied after the fork (session, descriptors,
environment, signal handlers, thread counts, fresh random state, what torch binds late
(`import_order`), sys.argv and __main__),
then Python's own ending (threads, atexit). See `zygote` for the process that forks."""

from __future__ import annotations

import atexit
import builtins
import contextlib
import ctypes
import importlib
import os
import signal
import socket
import sys
import threading
import types
from pathlib import Path
from typing import Any

from trainguard.backends.local.import_order import bind_group_defaults_late
from trainguard.backends.local.python_cmd import PythonCommand, parse

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def become_replica(
    sock: socket.socket, wake_r: int, wake_w: int, req: dict[str, Any], fd: int
) -> None:
    """In the forked child: become the replica. Never returns."""
    code = 1
    try:
        _join(req.get("cgroup"))
        os.setsid()
        die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(devnull)
        os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it up
        _apply_thread_env()
        _reseed()
        bind_group_defaults_late()
        cmd = parse(req["argv"])
        assert isinstance(cmd, PythonCommand), cmd  # the master asks only for forkable ones
        sys.orig_argv = list(req["argv"])
        _run_as_python_would(cmd, req["cwd"])
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        code = _finalize_as_python_would(code)
        if code == 0:  # its work is done: what only a process's end writes out is kept
            _drop_the_programs_objects()
            _exit_as_a_process_would(code)
        # A failure (or an error's exit code): its restart waits on this exit, and the
        # ending above took 300 ms of it (a full collection of torch's heap, then torch's
        # and gloo's exit handlers), against 50 ms.
        os._exit(code)


def _join(procs_files: list[str] | None) -> None:
    """Enter the run's cgroups (its own, its memory one) before anything runs, so all it
    starts is inside too (`tracking`); the master moves it there again once it knows the pid."""
    for procs_file in procs_files or ():
        with contextlib.suppress(OSError), open(procs_file, "w") as fh:
            fh.write(str(os.getpid()))


def _exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(x)` gives: x, 0 for None, else 1 with x printed."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def _finalize_as_python_would(code: int) -> int:
    """What the interpreter does once `__main__` is done: wait for the threads that are not
    daemons, run the atexit handlers (the program's own and its libraries'), flush."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except SystemExit as exc:  # a sys.exit() in a handler or a thread's end decides it
        code = _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _exit_as_a_process_would(code: int) -> None:
    """C's `exit()`, as a cold interpreter ends: the exit handlers and static destructors
    of the libraries run (TensorFlow's file writers flush there: a TensorBoard writer left
    open lost its events under `os._exit`); Python's own finalization is done already."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        libc.exit.argtypes = [ctypes.c_int]
        libc.exit(code)
    os._exit(code)


def _drop_the_programs_objects() -> None:
    """What Python's own ending does next: the program's globals are dropped (`__main__`
    first, as `Py_FinalizeEx` does), so what only a finalizer writes out (a buffered file
    no one closed) reaches the disk, which `os._exit` would skip."""
    main = sys.modules.get("__main__")
    with contextlib.suppress(Exception):
        if main is not None:
            main.__dict__.clear()
        import gc

        gc.collect()


def _count(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _apply_thread_env() -> None:
    """Thread counts the replica's environment asks for, for libraries the zygote imported
    before it knew them (OpenMP reads OMP_NUM_THREADS when torch loads, OpenBLAS its own
    variables when numpy loads, not later)."""
    torch = sys.modules.get("torch")
    omp = _count("OMP_NUM_THREADS")
    if torch is not None and omp is not None:
        torch.set_num_threads(omp)
    if "numpy" in sys.modules:
        # The zygote ran OpenBLAS on one thread (see Zygote.start); a cold process would
        # have what these variables say, else one per CPU.
        blas = _count("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") or os.cpu_count() or 1
        with contextlib.suppress(Exception):  # threadpoolctl is optional (extra `torch`)
            importlib.import_module("threadpoolctl").threadpool_limits(blas, user_api="blas")


def _reseed() -> None:
    """What a fresh interpreter draws at random is drawn again: numpy's global generator
    and multiprocessing's authkey (`random` reseeds itself after a fork)."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        mp_process.current_process().authkey = os.urandom(32)


def _run_as_python_would(cmd: PythonCommand, cwd: str) -> None:
    """Run the replica's program with the sys.argv, sys.path[0] and __main__ the
    interpreter would have given it."""
    import runpy

    if cmd.unbuffered or os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(write_through=True)  # type: ignore[union-attr]
    else:  # a pipe: block-buffered, as a cold interpreter's would be
        sys.stdout.reconfigure(line_buffering=False)  # type: ignore[union-attr]
    sys.dont_write_bytecode = cmd.no_bytecode or bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    sys.argv = [cmd.argv0, *cmd.args]
    if cmd.mode == "script":
        script = str(Path(cwd, cmd.target))
        sys.argv[0] = cmd.target
        sys.path[0] = str(Path(script).parent)
        runpy.run_path(script, run_name="__main__")
    elif cmd.mode == "module":
        sys.path[0] = cwd  # -m puts the working directory first
        runpy.run_module(cmd.target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = ""  # -c puts the working directory first, as ''
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        exec(compile(cmd.target, "<string>", "exec"), main.__dict__)
