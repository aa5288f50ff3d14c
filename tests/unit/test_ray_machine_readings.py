"""A Ray node's machine readings at a failure reach the master's exit (R-EVID-1), with a
fake host actor: what crosses the call is JSON, a stop asks for none, a node that does
not answer gives an absent reading (never a guess)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited
from trainguard.backends.ray.backend import RayBackend, _Run
from trainguard.backends.ray.exit_probe import ExitProbe, seen_here
from trainguard.classify.readings import Finding, MachineReading, Source, to_json
from trainguard.spec.engines import RayOptions

SEGFAULT = MachineReading(
    Source.KMSG,
    "python[42]: segfault at 0 ip 00007f in libc.so.6[7f+1000]",
    "a segfault at address 0",
    True,
    Finding.SEGFAULT,
    "libc.so.6",
    42,
)
NOTHING = MachineReading(Source.CGROUP, "memory.oom_control: oom_kill 0", "no OOM kill", True)


def _call(value: Any) -> Callable[..., Awaitable[Any]]:
    async def remote(*_args: Any) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value

    return remote


class _Method:
    def __init__(self, remote: Callable[..., Awaitable[Any]]) -> None:
        self.remote = remote
        self.calls = 0
        inner = remote

        async def counted(*args: Any) -> Any:
            self.calls += 1
            return await inner(*args)

        self.remote = counted


class _Actor:
    """A host actor that has seen its replica exit with `code`."""

    def __init__(self, code: int, machine: Any) -> None:
        self.read = _Method(_call((b"step 1 loss 0.5\n", code)))
        self.machine = _Method(_call(machine))


def _exit_of(tmp_path: Path, actor: _Actor, stopped: bool = False) -> ReplicaExited:
    backend = RayBackend({}, RayOptions())
    events: list[BackendEvent] = []
    backend.bind(events.append)
    launch = Launch(0, "w0", 0, 0, ("python",), {}, "/", tmp_path / "w0.log")
    node = {"ip": "10.0.0.2", "node_id": "a" * 40}
    run = _Run(launch, actor, node, None, backend._on_output)
    run.pid = 42
    run.stop_requested = stopped
    asyncio.run(backend._pump(run))
    (exit_,) = [e for e in events if isinstance(e, ReplicaExited)]
    return exit_


def test_a_failed_replicas_node_readings_come_back_in_its_exit(tmp_path: Path) -> None:
    actor = _Actor(-11, to_json((NOTHING, SEGFAULT)))
    ev = _exit_of(tmp_path, actor).evidence
    assert ev.machine == (NOTHING, SEGFAULT)
    assert ev.returncode == -11 and ev.log_tail == ("step 1 loss 0.5",)


def test_storage_errors_in_its_last_lines_join_the_nodes_readings(tmp_path: Path) -> None:
    class Full(_Actor):
        def __init__(self) -> None:
            super().__init__(1, to_json((NOTHING,)))
            self.read = _Method(_call((b"OSError: [Errno 28] No space left on device\n", 1)))

    ev = _exit_of(tmp_path, Full()).evidence
    assert ev.machine[0] == NOTHING
    assert [r.source for r in ev.machine[1:]] == [Source.TAIL]


def test_a_stop_or_a_clean_exit_asks_the_node_for_nothing(tmp_path: Path) -> None:
    stopped = _Actor(-15, to_json((SEGFAULT,)))
    assert _exit_of(tmp_path, stopped, stopped=True).evidence.machine == ()
    clean = _Actor(0, to_json((SEGFAULT,)))
    assert _exit_of(tmp_path, clean).evidence.machine == ()
    assert stopped.machine.calls == clean.machine.calls == 0


def test_a_stop_while_its_node_is_read_leaves_an_exit_its_own_and_waits_for_it(
    tmp_path: Path,
) -> None:
    """The replica died of its own bug; its peer's cascade made the master stop the rest
    while this node's readings were on their way: the exit is told before the stop returns,
    as a failure (not as stopped), and nothing is signalled."""
    backend = RayBackend({}, RayOptions())
    events: list[BackendEvent] = []
    backend.bind(events.append)
    reading = asyncio.Event()

    async def machine(*_args: Any) -> Any:
        await reading.wait()
        return to_json((NOTHING,))

    actor = _Actor(1, None)
    actor.machine = _Method(machine)
    signals: list[Any] = []

    async def signal(*args: Any) -> None:
        signals.append(args)

    actor.signal = _Method(signal)  # type: ignore[attr-defined]
    launch = Launch(0, "w0", 0, 0, ("python",), {}, "/", tmp_path / "w0.log")
    run = _Run(launch, actor, {"ip": "10.0.0.2", "node_id": "a" * 40}, None, backend._on_output)
    backend._runs["w0"] = run

    async def race() -> list[BackendEvent]:
        pump = asyncio.ensure_future(backend._pump(run))
        while actor.machine.calls == 0:
            await asyncio.sleep(0)
        asyncio.get_running_loop().call_later(0.05, reading.set)
        await backend.stop(["w0"], grace_s=5.0)
        told = list(events)
        await pump
        return told

    told = [e for e in asyncio.run(race()) if isinstance(e, ReplicaExited)]
    assert [e.evidence.stop_requested for e in told] == [False]
    assert told[0].evidence.returncode == 1 and told[0].evidence.machine == (NOTHING,)
    assert signals == []


def test_a_node_that_gives_no_readings_is_an_absent_kernel_log(tmp_path: Path) -> None:
    gone = _Actor(-9, RuntimeError("The actor died unexpectedly\nbefore finishing"))
    (r,) = _exit_of(tmp_path, gone).evidence.machine
    assert r.source == Source.KMSG and r.finding is Finding.ABSENT and not r.sure
    assert "node 10.0.0.2/aaaaaaaaaaaa: its readings did not come (RuntimeError" in r.value
    none = _Actor(-9, None)  # an older host (no probe begun): judged on the log alone
    assert _exit_of(tmp_path, none).evidence.machine == ()


def test_a_probe_not_begun_has_nothing_to_say() -> None:
    assert ExitProbe().result(0) is None


def test_the_node_reads_the_paths_it_sees_and_its_own_folder_for_the_rest(
    tmp_path: Path,
) -> None:
    here, there = str(tmp_path), "/nonexistent/master/logs"
    assert seen_here([here], "/tmp/own") == [here]
    assert seen_here([there, here], "/tmp/own") == [here, "/tmp/own"]
    assert seen_here([there], None) == []
    assert os.path.isdir(here)
