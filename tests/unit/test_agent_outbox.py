"""The agent's outbox (issue 40): output comes in batches, bounded; starts and exits always
go, each after the output that came before it. No process, no network: the agent's
streams are a socket pair nobody reads."""

from __future__ import annotations

import asyncio
import socket

from trainguard.backends.agent import node
from trainguard.backends.agent.node import Agent
from trainguard.backends.interface import ReplicaExited, ReplicaOutput, ReplicaStarted
from trainguard.classify.classes import ExitEvidence


async def _agent(theirs: list[socket.socket]) -> Agent:
    mine, other = socket.socketpair()
    theirs.append(other)
    reader, writer = await asyncio.open_connection(sock=mine)
    return Agent(reader, writer)


def test_output_is_batched_bounded_and_goes_before_the_exit_after_it() -> None:
    async def main() -> None:
        theirs: list[socket.socket] = []
        agent = await _agent(theirs)
        agent._on_event(ReplicaStarted(0, "w0", 0, 7, 1.0))
        big = "x" * (5 << 19)  # 2.5 MiB
        for i in range(4):  # 10 MiB offered: the fourth line is past the 8 MiB bound
            agent._on_event(ReplicaOutput(0, "w0", 0, (f"{i}{big}",), 2.0 + i))
        agent._on_event(ReplicaOutput(0, "w1", 0, ("small",), 7.0))
        assert [m["type"] for m in agent._outbox] == ["started"]  # the rest waits a batch
        await asyncio.sleep(node.OUTPUT_BATCH_S * 3)
        _started, batch = agent._outbox
        replicas = [item[1] for item in batch["items"]]
        assert replicas == ["w0", "w0", "w0", "w1"], replicas  # one line dropped
        assert batch["items"][-1][3] == [
            "trainguard agent: 1 lines dropped (the master is slow)",
            "small",
        ]
        sizes = sum(len(s) for item in batch["items"] for s in item[3])
        assert agent._queued == sizes
        agent._on_event(ReplicaOutput(0, "w1", 0, ("last words",), 8.0))
        agent._on_event(ReplicaExited(0, "w1", 0, 8, ExitEvidence("w1", 1), 8.1))
        kinds = [m["type"] for m in list(agent._outbox)[2:]]
        assert kinds == ["output", "exited"], kinds  # at once, its output first
        agent._writer.close()
        await agent._writer.wait_closed()
        theirs[0].close()

    asyncio.run(main())


def test_a_stopped_replicas_tail_is_not_sent_and_a_failed_ones_is() -> None:
    """The master has a stopped replica's output already; a failed one's tail is the
    agent's own, whole (output may have been dropped on the way)."""

    async def main() -> None:
        theirs: list[socket.socket] = []
        agent = await _agent(theirs)
        tail = ("line",) * 200
        agent._on_event(ReplicaExited(0, "w0", 0, 7, ExitEvidence("w0", 1, log_tail=tail), 1.0))
        stopped = ExitEvidence("w1", -15, log_tail=tail, stop_requested=True)
        agent._on_event(ReplicaExited(0, "w1", 0, 8, stopped, 1.0))
        failed, was_stopped = agent._outbox
        assert len(failed["evidence"]["log_tail"]) == 200
        assert len(was_stopped["evidence"]["log_tail"]) == 0
        agent._writer.close()
        await agent._writer.wait_closed()
        theirs[0].close()

    asyncio.run(main())
