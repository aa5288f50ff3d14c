"""The node agent's process (issue 40): `python -m trainguard.backends.agent.node MASTER
JOB NODE` (the job's token in $TRAINGUARD_AGENT_TOKEN). It says hello, and once welcome
runs its node's replicas through the local backend (warm forks, logs on the node, exits
with their evidence; its guardian takes them along if the agent is killed) and sends
their events to the master, with a heartbeat.

What it never does: block a replica. The local backend reads the replicas' output on
its own; what the agent sends waits in a bounded outbox, and output past its bound is
dropped (and counted, in a line the master sees) while starts and exits always go. A
master that stays silent past `MASTER_SILENT_S`, or whose connection ends, makes the
agent stop its replicas and exit: no orphans."""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.backends.agent import protocol as wire
from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited, ReplicaOutput
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.storage_check import storage_problem
from trainguard.classify.classes import ExitEvidence
from trainguard.storage.env import ENV_CHECKPOINT_DIR, ENV_FAULTHANDLER_FILE, ENV_STORAGE_CHECK

BEAT_S = 0.5
"""How often each side says it is alive."""
MASTER_SILENT_S = 5.0
"""A master silent this long is gone: the agent stops its replicas and exits."""
OUTBOX_BYTES = 8 << 20
"""Output waiting for a slow master, past which new output is dropped (and counted)."""
STOP_GRACE_S = 5.0
OUTPUT_BATCH_S = 0.05
"""Output that comes within this long goes in one message (a line per message cost the
master a read, a JSON decode and a wake-up each)."""


class Agent:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        preload: Sequence[str] = (),
    ) -> None:
        self._reader, self._writer = reader, writer
        self._backend = LocalBackend(preload=preload, own_machine=True)
        self._outbox: collections.deque[dict[str, Any]] = collections.deque()
        self._queued = 0  # bytes of output in the outbox and the batch
        self._batch: list[ReplicaOutput] = []  # output not yet in the outbox
        self._dropped = 0  # output segments dropped since the last that went
        self._ready = asyncio.Event()
        self._heard_s = time.monotonic()
        self._noted = 0  # warm start notes sent
        self._fatal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[None]] = set()
        self._storage_seen: set[tuple[str, str]] = set()  # (storage, marker) read back here

    def _on_event(self, ev: BackendEvent) -> None:
        """From the local backend, never blocking: output past the bound is dropped."""
        if isinstance(ev, ReplicaOutput):
            if self._queued + _size(ev.segments) > OUTBOX_BYTES:
                self._dropped += len(ev.segments)
                return
            if self._dropped:
                note = f"trainguard agent: {self._dropped} lines dropped (the master is slow)"
                ev = ReplicaOutput(
                    ev.attempt, ev.replica, ev.restart, (note, *ev.segments), ev.time_s
                )
                self._dropped = 0
            self._queued += _size(ev.segments)  # what `_send` takes off, note included
            self._batch.append(ev)
            if len(self._batch) == 1:
                asyncio.get_running_loop().call_later(OUTPUT_BATCH_S, self._flush_batch)
            return
        self._flush_batch()  # a replica's output goes before its exit
        if isinstance(ev, ReplicaExited) and ev.evidence.stop_requested:
            # The master has its output already: 200 lines each of a thousand stopped
            # ranks would be 0.2 M lines to decode between a failure and the restart.
            ev = replace(ev, evidence=replace(ev.evidence, log_tail=()))
        self._outbox.append(wire.event_message(ev))
        self._ready.set()

    def _flush_batch(self) -> None:
        if self._batch:
            self._outbox.append(wire.output_message(self._batch))
            self._batch = []
            self._ready.set()

    async def _send(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                msg = self._outbox.popleft()
                if msg["type"] == "output":
                    self._queued -= sum(_size(item[3]) for item in msg["items"])
                self._writer.write(wire.encode(msg))
                await self._writer.drain()

    def _say_notes(self) -> None:
        """The warm start's new notes (its zygote imports in the background: each beat
        looks again)."""
        notes = self._backend.warm_start_notes
        for text in notes[self._noted :]:
            self._outbox.append({"type": "note", "text": text})
        self._noted = len(notes)

    async def _beat(self) -> None:
        """A stall of this loop counts against no master (its beats wait unread)."""
        looked_s = time.monotonic()
        while True:
            await asyncio.sleep(BEAT_S)
            now = time.monotonic()
            stalled = now - looked_s - BEAT_S
            looked_s = now
            if stalled > BEAT_S:
                self._heard_s += stalled
            elif now - self._heard_s > MASTER_SILENT_S:
                raise ConnectionError(f"the master was silent for {MASTER_SILENT_S:.0f} s")
            self._say_notes()
            self._outbox.append({"type": "beat", "time_s": time.time()})
            self._ready.set()

    async def _seeing_storage(self, launches: list[Launch]) -> list[Launch]:
        """The launches this node sees the checkpoint storage of (the master's marker, read
        back once per storage); each other one exits at once, with why (`storage_check`):
        a replica here would find no checkpoint and start again from step 0."""
        out = []
        for la in launches:
            key = (la.env.get(ENV_CHECKPOINT_DIR, ""), la.env.get(ENV_STORAGE_CHECK, ""))
            if key not in self._storage_seen:
                problem = await asyncio.to_thread(storage_problem, la.env)
                if problem is not None:
                    ev = ExitEvidence(la.replica, None, spawn_error=problem)
                    self._on_event(
                        ReplicaExited(la.attempt, la.replica, la.restart, None, ev, time.time())
                    )
                    continue
                self._storage_seen.add(key)
            out.append(la)
        return out

    async def _obey(self, msg: dict[str, Any]) -> bool:
        """One order of the master; False once it says close. An order that fails is
        answered so (its `error`); a start that fails ends the agent, so the master finds
        its node lost rather than waiting on replicas that will never start."""
        try:
            return await self._carry_out(msg)
        except Exception as exc:
            why = f"{msg['type']} failed: {type(exc).__name__}: {exc}"
            if "id" in msg:
                self._outbox.append({"type": "done", "id": msg["id"], "ok": False, "error": why})
                self._ready.set()
                return True
            if not self._fatal.done():
                self._fatal.set_exception(RuntimeError(why))
            return False

    async def _carry_out(self, msg: dict[str, Any]) -> bool:
        kind = msg["type"]
        if kind == "start":
            launches = [_on_this_node(la) for la in wire.launches_of(msg)]
            await self._backend.start(await self._seeing_storage(launches))
            self._say_notes()
        elif kind == "warm":
            await self._backend.warm(wire.launches_of(msg))
            self._say_notes()
        elif kind == "stop":
            await self._backend.stop(list(msg["replicas"]), float(msg["grace_s"]))
            self._outbox.append({"type": "done", "id": msg["id"], "ok": True})
        elif kind == "signal":
            ok = await self._backend.signal(str(msg["replica"]), int(msg["signum"]))
            self._outbox.append({"type": "done", "id": msg["id"], "ok": ok})
        elif kind == "stacks":  # taken here, where the pids are this node's
            targets = [(str(r), int(rank), int(pid)) for r, rank, pid in msg["targets"]]
            files = {str(r): _here(Path(p)) for r, p in msg["faulthandler_files"].items()}
            stacks = await self._backend.dump_stacks(targets, float(msg["timeout_s"]), files)
            self._outbox.append(
                {"type": "done", "id": msg["id"], "stacks": [s.to_dict() for s in stacks]}
            )
        elif kind == "close":
            return False
        self._ready.set()
        return True

    async def _listen(self) -> None:
        while True:
            line = await self._reader.readline()
            if not line:
                raise ConnectionError("the master closed the connection")
            self._heard_s = time.monotonic()
            msg = wire.decode(line, wire.MASTER_SAYS)
            if msg["type"] == "beat":
                continue
            task = asyncio.ensure_future(self._obey(msg))  # a stop must not hold the beats
            if msg["type"] == "close":
                await task
                return
            self._keep(task)

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> str:
        """Until the master says close or goes away; what ended it."""
        self._backend.bind(self._on_event)
        jobs: list[asyncio.Future[None]] = [
            asyncio.ensure_future(c) for c in (self._listen(), self._send(), self._beat())
        ]
        jobs.append(self._fatal)
        try:
            done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
            exc = next(iter(done)).exception()
            if self._fatal in done and exc is not None:  # told, as the last word
                self._writer.write(wire.encode({"type": "note", "text": str(exc)}))
            return "the master said close" if exc is None else str(exc)
        finally:
            for job in jobs:
                job.cancel()
            await self._backend.close()  # every replica still running is stopped
            self._writer.close()


def _size(segments: Sequence[str]) -> int:
    return sum(len(s) for s in segments)


async def serve(master: str, job: str, node: str, token: str) -> int:
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit():
        print(
            f"trainguard agent: the master's address is HOST:PORT, got {master!r}", file=sys.stderr
        )
        return 2
    try:
        reader, writer = await asyncio.open_connection(host, int(port), limit=wire.MAX_LINE)
    except OSError as exc:
        print(f"trainguard agent: cannot reach the master at {master}: {exc}", file=sys.stderr)
        return 1
    writer.write(wire.encode(wire.hello(job, node, token, os.getpid())))
    first = wire.decode(await reader.readline(), wire.MASTER_SAYS)
    if first["type"] == "refuse":
        print(f"trainguard agent: the master refused this agent: {first['why']}", file=sys.stderr)
        return 2
    why = await Agent(reader, writer, [str(m) for m in first["preload"]]).run()
    print(f"trainguard agent on {node}: ended: {why}", file=sys.stderr)
    return 0


def _here(path: Path) -> Path:
    """A relative path is one the master does not see on this node (it keeps the log
    itself): the node's own file goes under this node's temporary folder."""
    return path if path.is_absolute() else Path(tempfile.gettempdir()) / path


def _on_this_node(launch: Launch) -> Launch:
    """The launch with its node files (log, stack dumps) where this node keeps them."""
    if launch.log_path.is_absolute():
        return launch
    env = dict(launch.env)
    if stacks := env.get(ENV_FAULTHANDLER_FILE):
        env[ENV_FAULTHANDLER_FILE] = str(_here(Path(stacks)))
    return replace(launch, log_path=_here(launch.log_path), env=env)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m trainguard.backends.agent.node MASTER JOB NODE", file=sys.stderr)
        return 2
    token = os.environ.get(wire.TOKEN_ENV)
    if not token:
        print(f"trainguard agent: no token: set {wire.TOKEN_ENV}", file=sys.stderr)
        return 2
    try:
        master, job, node = argv
        return asyncio.run(serve(master, job, node, token))
    except wire.ProtocolError as exc:
        print(f"trainguard agent: the master broke the protocol: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
