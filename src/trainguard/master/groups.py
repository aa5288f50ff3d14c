"""Replica groups restarted alone (torchft): stop the rest of the failed group, wait
until the Lighthouse has dropped it, start the whole group again; and the framework's
services, started and listening before any group."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from trainguard.backends.interface import SERVICE_ENV, Launch, ReplicaExited
from trainguard.backends.net import connect_error
from trainguard.classify.own_errors import is_own_resource_errno, own_resource_text
from trainguard.master.attempts import Attempts
from trainguard.master.events import GroupRejoin, MasterEvent
from trainguard.policy.actions import RestartGroup
from trainguard.policy.budgets import Failure
from trainguard.states import JobState, ReplicaState

SERVICE_READY_S = 60.0
"""How long the replicas wait for the services to listen before they start anyway (the
services' own exits, if that is why, decide what happens)."""


async def not_listening(endpoints: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """The endpoints that do not accept a connection now. A probe that failed for want of
    the master's own resources (EMFILE...) says nothing of the service: it raises, so the
    master records an internal error rather than blaming the group (issue 37)."""
    missing = []
    for host, port in endpoints:
        error = await connect_error(host, port)
        if error is None:
            continue
        code = error.errno if isinstance(error, OSError) else None
        if code is not None and is_own_resource_errno(code):
            what = own_resource_text(code)
            raise OSError(code, f"probing the service at {host}:{port}: {what}")
        missing.append((host, port))
    return missing


class Groups(Attempts):
    async def _start_services_first(self, launches: Sequence[Launch]) -> list[Launch]:
        """Start the framework's services and wait until they listen; the other launches."""
        services = [launch for launch in launches if SERVICE_ENV in launch.env]
        if not services:
            return list(launches)
        await self.backend.start(services)
        roster = self.launches.roster
        assert roster is not None  # built with the first launch
        found = [self.preset.ready_endpoint(roster, s.replica) for s in services]
        endpoints = [e for e in found if e is not None]
        t0 = self.clock()
        missing = await self._wait_listening(endpoints, {s.replica for s in services})
        if missing:
            shown = ", ".join(f"{h}:{p}" for h, p in missing)
            self.say(f"the services do not listen at {shown}: the replicas start anyway")
        else:
            names = ", ".join(s.replica for s in services)
            self.say(f"{names} listening after {self.clock() - t0:.2f} s")
        return [launch for launch in launches if SERVICE_ENV not in launch.env]

    async def _wait_listening(
        self, endpoints: list[tuple[str, int]], services: set[str]
    ) -> list[tuple[str, int]]:
        """Poll until every endpoint listens, a service exits, or SERVICE_READY_S pass;
        the events that arrive meanwhile are kept in order for the loop."""
        kept: list[MasterEvent] = []
        deadline = time.monotonic() + SERVICE_READY_S  # real time, whatever the job's clock
        missing = list(endpoints)
        try:
            while missing:
                missing = await not_listening(missing)
                while not self._queue.empty():
                    kept.append(self._queue.get_nowait())
                if not missing or time.monotonic() > deadline:
                    break
                if any(isinstance(e, ReplicaExited) and e.replica in services for e in kept):
                    break
                await asyncio.sleep(0.05)
        finally:
            while not self._queue.empty():
                kept.append(self._queue.get_nowait())
            for ev in kept:
                self._queue.put_nowait(ev)
        return missing

    async def _restart_group(self, decision: RestartGroup, failure: Failure, seen_s: float) -> None:
        """Stop the group's live members now; start them all once `after_s` has passed
        since the failure (a `GroupRejoin`). No other group is touched."""
        record_id = self.ledger.restart(decision, failure, seen_s)
        self._groups_down[decision.group] = record_id
        members = set(decision.replicas)
        self._watch_of(decision.group).disarm()  # stopped: its silence is no hang
        t0 = self.clock()
        live = [m for m in decision.replicas if not self.replicas[m].state.is_terminal]
        if live:
            await self.backend.stop(live, self.ft.stop_grace_period_s)
        await self._settle(only=members)
        for name in decision.replicas:
            rep = self.replicas[name]
            rep.restarts += 1
            self._move(rep, ReplicaState.STOPPED)
            rep.pid, rep.run_id = None, None
        t1 = self.clock()
        wait = max(0.0, decision.after_s - (t1 - failure.time_s))
        rejoin = GroupRejoin(self.attempt, decision.group, record_id)
        self._later(wait, lambda: self.post(rejoin))
        self.rec.restart_phases(record_id, stop_ms=(t1 - t0) * 1000, schedule_ms=wait * 1000)
        self.say(f"group {decision.group} stopped; it rejoins in {wait:.1f} s")

    async def _on_group_rejoin(self, ev: GroupRejoin) -> None:
        if ev.attempt != self.attempt or self._groups_down.get(ev.group) != ev.record_id:
            return  # a new attempt, or a later stop of the same group, supersedes it
        if self.state is not JobState.RUNNING:
            return
        del self._groups_down[ev.group]
        members = self.roles.groups[ev.group]
        for name in members:
            self._move(self.replicas[name], ReplicaState.STARTING)
        self._watch_of(ev.group).arm(self.attempt, self._ranks(members))  # start-up again
        t0 = self.clock()
        launches = await self._start_services_first(
            [self._launch(self.replicas[n]) for n in members]
        )
        await self.backend.start(launches)
        self._record_warm_start()
        self.rec.restart_phases(ev.record_id, start_ms=(self.clock() - t0) * 1000)
