"""Replica groups restarted alone (torchft): stop the rest of the failed group, wait
until the Lighthouse has dropped it, start the whole group again; and the framework's
services, started and listening before any group."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from trainguard.backends.interface import SERVICE_ENV, Launch, ReplicaExited
from trainguard.backends.net import connect_error
from trainguard.classify.own_errors import is_own_resource_errno, own_resource_text
from trainguard.frameworks.base import Preset
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.hangs.watch import HangWatch
from trainguard.master.actions import Actions
from trainguard.master.events import GroupRejoin, MasterEvent, ReplicaSlot
from trainguard.master.launch import LaunchBuilder
from trainguard.master.state import MasterState
from trainguard.policy.actions import RestartGroup
from trainguard.policy.budgets import Failure
from trainguard.policy.decisions import RolePolicy
from trainguard.records.recorder import Recorder
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


def watch_of(hangs: GroupedHangWatch, group: int | None) -> HangWatch:
    """The hang watch of a replica group (torchft), or the job's (None)."""
    return hangs if group is None else hangs.group(group)


class Groups:
    """The framework's services and its replica groups; `launch` builds a replica's next
    run (the attempts handler's)."""

    def __init__(
        self,
        job: MasterState,
        act: Actions,
        *,
        roles: RolePolicy,
        preset: Preset,
        launches: LaunchBuilder,
        hangs: GroupedHangWatch,
        rec: Recorder,
        launch: Callable[[ReplicaSlot], Launch],
    ) -> None:
        self.job, self.act = job, act
        self.roles, self.preset, self.launches = roles, preset, launches
        self.hangs, self.rec = hangs, rec
        self.launch = launch

    async def start_services_first(self, launches: Sequence[Launch]) -> list[Launch]:
        """Start the framework's services and wait until they listen; the other launches."""
        services = [launch for launch in launches if SERVICE_ENV in launch.env]
        if not services:
            return list(launches)
        await self.act.start(services, warm_notes=False)  # noted with the others' start
        roster = self.launches.roster
        assert roster is not None  # built with the first launch
        found = [self.preset.ready_endpoint(roster, s.replica) for s in services]
        endpoints = [e for e in found if e is not None]
        t0 = self.act.now()
        missing = await self._wait_listening(endpoints, {s.replica for s in services})
        if missing:
            shown = ", ".join(f"{h}:{p}" for h, p in missing)
            self.act.say(f"the services do not listen at {shown}: the replicas start anyway")
        else:
            names = ", ".join(s.replica for s in services)
            self.act.say(f"{names} listening after {self.act.now() - t0:.2f} s")
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
                kept += self.act.take_queued()
                if not missing or time.monotonic() > deadline:
                    break
                if any(isinstance(e, ReplicaExited) and e.replica in services for e in kept):
                    break
                await asyncio.sleep(0.05)
        finally:
            kept += self.act.take_queued()
            for ev in kept:
                self.act.post(ev)
        return missing

    async def restart_group(self, decision: RestartGroup, failure: Failure, record_id: int) -> None:
        """Stop the group's live members now; start them all once `after_s` has passed
        since the failure (a `GroupRejoin`). No other group is touched."""
        job, act = self.job, self.act
        job.groups_down[decision.group] = record_id
        members = set(decision.replicas)
        watch_of(self.hangs, decision.group).disarm()  # stopped: its silence is no hang
        t0 = act.now()
        live = [m for m in decision.replicas if not job.replicas[m].state.is_terminal]
        if live:
            await act.stop(live)
        await act.settle(only=members)
        for name in decision.replicas:
            rep = job.replicas[name]
            rep.restarts += 1
            act.move(rep, ReplicaState.STOPPED)
            rep.pid, rep.run_id = None, None
        t1 = act.now()
        wait = max(0.0, decision.after_s - (t1 - failure.time_s))
        act.schedule(wait, GroupRejoin(job.attempt, decision.group, record_id))
        self.rec.restart_phases(record_id, stop_ms=(t1 - t0) * 1000, schedule_ms=wait * 1000)
        act.say(f"group {decision.group} stopped; it rejoins in {wait:.1f} s")

    async def on_group_rejoin(self, ev: GroupRejoin) -> None:
        job = self.job
        if ev.attempt != job.attempt or job.groups_down.get(ev.group) != ev.record_id:
            return  # a new attempt, or a later stop of the same group, supersedes it
        if job.phase is not JobState.RUNNING:
            return
        del job.groups_down[ev.group]
        members = self.roles.groups[ev.group]
        for name in members:
            self.act.move(job.replicas[name], ReplicaState.STARTING)
        watch_of(self.hangs, ev.group).arm(job.attempt, job.ranks(members))  # start-up again
        t0 = self.act.now()
        launches = await self.start_services_first([self.launch(job.replicas[n]) for n in members])
        await self.act.start(launches)
        self.rec.restart_phases(ev.record_id, start_ms=(self.act.now() - t0) * 1000)
