"""The node agent (issue 40), for real: an agent process on this machine, the master's
side (`AgentBackend`) in the test, real replicas. Welcome and refusal, a replica's start,
output and exit as the master sees them, a stop and a signal as orders, a killed agent
found lost by its silence (with its replicas gone), and a master that goes away taking
the agent's replicas along."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainguard.backends.agent import backend as agent_backend
from trainguard.backends.agent.backend import AgentBackend
from trainguard.backends.agent.protocol import TOKEN_ENV
from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited, ReplicaStarted

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class World:
    def __init__(self, tmp: Path, backend: AgentBackend) -> None:
        self.tmp, self.backend = tmp, backend
        self.seen: list[BackendEvent] = []
        backend.bind(self.seen.append)
        self.agents: list[asyncio.subprocess.Process] = []
        self.address = ("", 0)

    async def agent(
        self, node: str, token: str = "tok", job: str = "job-1", cli: bool = False
    ) -> Any:
        """An agent as a backend starts it (its module), or as a person would (the CLI)."""
        host, port = self.address
        if cli:
            argv = [str(Path(sys.executable).with_name("trainguard")), "agent"]
            argv += [f"{host}:{port}", job, "--node", node]
        else:
            argv = [sys.executable, "-m", "trainguard.backends.agent.node"]
            argv += [f"{host}:{port}", job, node]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env={**os.environ, TOKEN_ENV: token},
            stderr=asyncio.subprocess.PIPE,
        )
        self.agents.append(proc)
        return proc

    def launch(self, replica: str, rank: int, code: str) -> Launch:
        argv = (sys.executable, "-c", code)
        log = self.tmp / f"{replica}.log"
        return Launch(0, replica, rank, 0, argv, dict(os.environ), str(self.tmp), log)

    async def until(self, found: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (got := found()):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} in {timeout_s} s: {self.seen}")
            await asyncio.sleep(0.05)
        return got

    async def sleeping(self, *replicas: str) -> tuple[Any, list[int]]:
        """An agent on n1 running `replicas` (each asleep once it printed a line), and their
        pids."""
        agent = await self.agent("n1")
        await self.backend.wait_for_agents(1, 30)
        sleep = "import time; print('up', flush=True); time.sleep(60)"
        await self.backend.start([self.launch(r, i, sleep) for i, r in enumerate(replicas)])
        pids = []
        for r in replicas:
            await self.until(lambda: self.backend.log_tail(r), 30, f"{r}'s first line")  # noqa: B023
            pid = self.pid_of(r)
            assert pid is not None
            pids.append(pid)
        return agent, pids

    def exit_of(self, replica: str) -> ReplicaExited | None:
        return next(
            (e for e in self.seen if isinstance(e, ReplicaExited) and e.replica == replica), None
        )

    def pid_of(self, replica: str) -> int | None:
        return next(
            (e.pid for e in self.seen if isinstance(e, ReplicaStarted) and e.replica == replica),
            None,
        )


def _run(
    tmp_path: Path,
    scenario: Callable[[World], Awaitable[None]],
    preload: tuple[str, ...] = (),
    keep_logs: bool = False,
) -> None:
    async def main() -> None:
        w = World(tmp_path, AgentBackend("job-1", "tok", preload=preload, keep_logs=keep_logs))
        w.address = await w.backend.listen()
        try:
            await scenario(w)
        finally:
            await w.backend.close()
            for proc in w.agents:
                if proc.returncode is None:
                    try:
                        await asyncio.wait_for(proc.wait(), 15)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()

    asyncio.run(main())


def test_an_agent_runs_its_nodes_replicas_and_tells_the_master(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        await w.agent("n1")
        await w.agent("n2")
        joined = await w.backend.wait_for_agents(2, 30)
        assert sorted(joined) == ["n1", "n2"]
        code = "import sys; print('step 1'); print('step 2', flush=True); sys.exit(3)"
        await w.backend.start([w.launch("worker-0", 0, code), w.launch("worker-1", 1, code)])
        for replica, node in (("worker-0", joined[0]), ("worker-1", joined[1])):
            ev = await w.until(lambda: w.exit_of(replica), 30, f"exit of {replica}")  # noqa: B023
            assert ev.evidence.returncode == 3 and not ev.evidence.stop_requested
            assert ev.evidence.log_tail[-2:] == ("step 1", "step 2")
            started = [e for e in w.seen if isinstance(e, ReplicaStarted) and e.replica == replica]
            assert [e.node for e in started] == [node]  # round-robin by rank, as they joined
        assert w.backend.log_tail("worker-1")[-1] == "step 2"
        assert w.backend.last_output_s() > 0

    _run(tmp_path, scenario)


def test_where_nodes_do_not_see_the_masters_files_the_master_keeps_the_logs(
    tmp_path: Path,
) -> None:
    """`keep_logs` (Ray): the log at the master's path is the master's copy of what the
    agent sent; the agent's own copy is in the node's temporary folder, not the same file."""
    log = tmp_path / "attempt-0" / "worker-0.log"
    node_copy = Path(tempfile.gettempdir(), "trainguard-agent", "job-1", "attempt-0", log.name)
    node_copy.unlink(missing_ok=True)

    async def scenario(w: World) -> None:
        await w.agent("n1")
        await w.backend.wait_for_agents(1, 30)
        code = "print('one'); print('two', flush=True)"
        launch = replace(w.launch("worker-0", 0, code), log_path=log)
        await w.backend.start([launch])
        await w.until(lambda: w.exit_of("worker-0"), 30, "the exit")

    _run(tmp_path, scenario, keep_logs=True)
    assert log.read_text() == "one\ntwo\n"
    assert node_copy.read_text() == "one\ntwo\n"


def test_an_agent_forks_its_replicas_from_a_warm_zygote_the_master_asked_for(
    tmp_path: Path,
) -> None:
    async def scenario(w: World) -> None:
        await w.agent("n1")
        await w.backend.wait_for_agents(1, 30)
        code = "import sys, json; print(json.dumps(sorted(sys.modules)[:1]), flush=True)"
        await w.backend.start([w.launch("worker-0", 0, code)])
        ev = await w.until(lambda: w.exit_of("worker-0"), 30, "worker-0's exit")
        assert ev.evidence.returncode == 0
        notes = await w.until(lambda: list(w.backend.warm_start_notes), 10, "a warm start note")
        assert notes[0].startswith("node n1: warm start: json imported once in"), notes
        assert not any("starts cold" in n for n in notes), notes  # forked

    _run(tmp_path, scenario, preload=("json",))


def test_a_spares_agent_warms_its_zygote_before_any_rank_is_placed_there(
    tmp_path: Path,
) -> None:
    """Two agents, ranks placed on n1 only: n2 (a spare) is told to warm for such ranks, so
    the restart that moves them there after a node loss forks warm; a launch placed on a
    node with no agent exits at once as lost there."""

    async def scenario(w: World) -> None:
        await w.agent("n1")
        await w.agent("n2")
        assert await w.backend.wait_for_nodes(["n1", "n2"], 30) == {"n1", "n2"}
        assert await w.backend.wait_for_nodes(["n1", "n3"], 0.2) == {"n1"}  # n3 has none
        first = w.launch("worker-0", 0, "print('up', flush=True)")
        await w.backend.start_on([first], {"worker-0": "n1"})
        notes = await w.until(
            lambda: [n for n in w.backend.warm_start_notes if n.startswith("node n2: warm")],
            30,
            "n2's warm start note",
        )
        assert "json imported once" in notes[0], notes
        assert not any(isinstance(e, ReplicaStarted) and e.node == "n2" for e in w.seen)
        moved = w.launch("worker-1", 1, "print('up', flush=True)")
        await w.backend.start_on([moved], {"worker-1": "n3"})
        ev = await w.until(lambda: w.exit_of("worker-1"), 5, "worker-1's exit")
        assert ev.evidence.node_lost == "node n3: it has no agent", ev

    _run(tmp_path, scenario, preload=("json",))


def test_stop_and_signal_are_orders_the_agent_answers(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        await w.sleeping("worker-0", "worker-1")
        assert await w.backend.signal("worker-1", signal.SIGKILL)
        killed = await w.until(lambda: w.exit_of("worker-1"), 30, "worker-1's death")
        assert killed.evidence.returncode == -signal.SIGKILL
        assert not await w.backend.signal("worker-1", signal.SIGKILL)  # not running
        await w.backend.stop(["worker-0"], grace_s=5)
        stopped = w.exit_of("worker-0")  # told before the stop returns
        assert stopped is not None and stopped.evidence.stop_requested
        assert stopped.evidence.log_tail == ("up",)  # the master's own: the agent sent none

    _run(tmp_path, scenario)


def test_an_order_that_fails_is_answered_and_a_start_that_fails_ends_the_agent(
    tmp_path: Path,
) -> None:
    async def scenario(w: World) -> None:
        agent, _ = await w.sleeping("worker-0")
        assert not await w.backend.signal("worker-0", 9999)  # no such signal: answered no
        assert w.backend.live() == ["n1"] and w.exit_of("worker-0") is None
        broken = {"type": "start", "launches": [{"replica": "worker-1"}], "env": {}}
        w.backend._links["n1"].say(broken)
        lost = await w.until(lambda: w.exit_of("worker-0"), 30, "worker-0 lost with its agent")
        assert lost.evidence.node_lost is not None
        _, err = await asyncio.wait_for(agent.communicate(), 30)
        assert "start failed: ProtocolError: a launch without a valid" in err.decode()
        assert any("start failed" in n for n in w.backend.warm_start_notes)

    _run(tmp_path, scenario)


def test_stacks_are_taken_by_the_agent_where_the_replica_runs(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        await w.agent("n1")
        await w.backend.wait_for_agents(1, 30)
        code = (
            "import time\n"
            "def stuck_in_here():\n"
            "    print('up', flush=True)\n"
            "    time.sleep(60)\n"
            "stuck_in_here()\n"
        )
        await w.backend.start([w.launch("worker-0", 0, code)])
        await w.until(lambda: w.backend.log_tail("worker-0"), 30, "worker-0's first line")
        pid = w.pid_of("worker-0")
        assert pid is not None
        (stacks,) = await w.backend.dump_stacks([("worker-0", 0, pid)], 20, {})
        assert stacks.ok, stacks.error
        assert (stacks.replica, stacks.pid) == ("worker-0", pid)
        names = [f.name for t in stacks.threads for f in t.frames]
        assert "stuck_in_here" in names, names
        (none,) = await w.backend.dump_stacks([("worker-9", 9, 1)], 5, {})  # no such replica
        assert (none.ok, none.error) == (False, "no stacks: not running")

    _run(tmp_path, scenario)


def test_an_agent_of_another_job_or_token_is_refused_in_one_line(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        for agent, why in (
            (await w.agent("n1", token="guess"), "wrong token for this job"),
            (await w.agent("n1", job="job-2", cli=True), "agent for job 'job-2'"),
        ):
            _, err = await asyncio.wait_for(agent.communicate(), 30)
            assert agent.returncode == 2
            line = err.decode().strip()
            assert line.startswith("trainguard agent: the master refused this agent: "), line
            assert why in line and "\n" not in line
        assert len(w.backend.refused) == 2
        assert w.backend.live() == []

    _run(tmp_path, scenario)


def test_a_killed_agent_is_a_lost_node_within_its_heartbeat_bound(tmp_path: Path) -> None:
    """Its replica sleeps: nothing but the agent's silence says the node is gone."""

    async def scenario(w: World) -> None:
        agent, (pid,) = await w.sleeping("worker-0")
        assert _alive(pid)
        agent.kill()
        killed = time.monotonic()
        ev = await w.until(lambda: w.exit_of("worker-0"), 30, "worker-0 lost")
        found_s = time.monotonic() - killed
        print(f"agent killed -> node lost in {found_s:.2f} s")
        assert ev.evidence.node_lost is not None and "n1" in ev.evidence.node_lost
        assert found_s <= agent_backend.AGENT_SILENT_S + 5  # its bound, with a busy machine's slack
        assert w.backend.hung_up("n1")  # its connection ended: not silent
        await w.until(lambda: not _alive(pid), 15, "the replica gone with its agent")

    _run(tmp_path, scenario)


def test_a_whole_machine_stalled_for_4_s_loses_no_node(tmp_path: Path) -> None:
    """Master and agent both stalled past the silence bound (a paused VM, a machine out of
    CPU): the time the master was not looking counts against no agent."""

    async def scenario(w: World) -> None:
        agent, (pid,) = await w.sleeping("worker-0")
        agent.send_signal(signal.SIGSTOP)
        time.sleep(4.0)  # the master's whole loop, blocked meanwhile
        agent.send_signal(signal.SIGCONT)
        await asyncio.sleep(1.5)  # the watch looks again, the agent beats again
        assert w.backend.live() == ["n1"], w.seen
        assert w.exit_of("worker-0") is None and _alive(pid)

    _run(tmp_path, scenario)


def test_a_frozen_agent_is_a_lost_node_by_its_silence(tmp_path: Path) -> None:
    """SIGSTOP: its connection stays open (as a host cut off the network or hung would),
    only the missing heartbeats tell; its replica keeps sleeping meanwhile."""

    async def scenario(w: World) -> None:
        agent, _ = await w.sleeping("worker-0")
        agent.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            ev = await w.until(lambda: w.exit_of("worker-0"), 30, "worker-0 lost")
            found_s = time.monotonic() - frozen
        finally:
            agent.kill()  # its guardian then ends the replica
        print(f"agent frozen -> node lost in {found_s:.2f} s")
        assert ev.evidence.node_lost is not None and "silent" in ev.evidence.node_lost
        assert not w.backend.hung_up("n1")
        assert agent_backend.AGENT_SILENT_S <= found_s <= agent_backend.AGENT_SILENT_S + 5

    _run(tmp_path, scenario)


def test_a_master_that_goes_away_takes_the_agents_replicas_along(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        agent, (pid,) = await w.sleeping("worker-0")
        for link in w.backend._links.values():
            link.writer.transport.abort()  # the master's end, gone without a word
        _, err = await asyncio.wait_for(agent.communicate(), 30)
        assert agent.returncode == 0, err
        assert "ended: the master closed the connection" in err.decode()
        assert not _alive(pid)

    _run(tmp_path, scenario)
