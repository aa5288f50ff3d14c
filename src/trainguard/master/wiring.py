"""The master's parts put together: the job's state, the actions over the backend, the
collaborators (watches, inbox, keepers, ledgers, the SDK channel) and the handlers that
receive the state and the actions. `loop.Master` runs what `wire` returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.backends.interface import Backend
from trainguard.frameworks import preset
from trainguard.frameworks.base import Preset
from trainguard.frameworks.replica_plan import plan_replicas, primary_replica
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.master.actions import MasterActions
from trainguard.master.attempts import Attempts
from trainguard.master.events import MasterEvent, Outcome, ReplicaSlot
from trainguard.master.exits import Exits
from trainguard.master.failures import Failures
from trainguard.master.faults import Faults
from trainguard.master.groups import Groups
from trainguard.master.hang_response import HangResponse
from trainguard.master.inbox import Inbox
from trainguard.master.inject import FaultInjector
from trainguard.master.journal import Journal
from trainguard.master.keeper import CheckpointKeeper
from trainguard.master.launch import LaunchBuilder
from trainguard.master.ledger import Ledger
from trainguard.master.node_ledger import NodeLedger
from trainguard.master.output_progress import OutputProgress
from trainguard.master.sdk_channel import SdkServer
from trainguard.master.snapshot_keeper import SnapshotKeeper
from trainguard.master.state import MasterState
from trainguard.policy.decisions import RolePolicy
from trainguard.policy.gpus import GpuPool
from trainguard.records.recorder import NODE, Recorder
from trainguard.spec.injection import parse_injection
from trainguard.spec.models import ExecutionMode, JobSpec
from trainguard.states import JobState
from trainguard.storage.ids import new_token
from trainguard.timers import Timers


@dataclass
class Parts:
    """What one job's master is made of."""

    job: MasterState
    outcome: Outcome
    queue: asyncio.Queue[MasterEvent]
    background: set[asyncio.Future[Any]]
    actions: MasterActions
    preset: Preset
    roles: RolePolicy
    primary: str
    launches: LaunchBuilder
    hangs: GroupedHangWatch
    inbox: Inbox
    faults: FaultInjector
    keeper: CheckpointKeeper
    output_progress: OutputProgress
    snapshots: SnapshotKeeper
    sdk: SdkServer
    gpus: GpuPool
    ledger: Ledger
    node_ledger: NodeLedger
    failures: Failures
    attempts: Attempts
    groups: Groups
    exits: Exits
    hang_response: HangResponse
    fault_handler: Faults


def wire(
    job_id: str,
    spec: JobSpec,
    backend: Backend,
    rec: Recorder,
    log_dir: Path,
    cwd: str,
    say: Callable[[str], None],
    clock: Callable[[], float],
    timers: Timers,
    strict: bool,
) -> Parts:
    """Build every part of the master of `job_id`, each handed the few others it needs."""
    ft = spec.fault_tolerance
    plans = plan_replicas(spec)
    primary = primary_replica(plans)
    pre = preset(spec.framework)
    roles = pre.role_policy(spec)
    launches = LaunchBuilder(
        job_id, pre, tuple(plans), log_dir, cwd, ft.max_num_of_job_restart, spec
    )
    services = frozenset(p.name for p in plans if p.role in pre.services)
    job = MasterState({p.name: ReplicaSlot(p) for p in plans}, services, attempt_started_s=clock())
    outcome = Outcome(JobState.PENDING)
    queue: asyncio.Queue[MasterEvent] = asyncio.Queue()
    background: set[asyncio.Future[Any]] = set()
    journal = Journal(rec, job_id, say)
    act = MasterActions(
        job,
        outcome,
        backend,
        rec,
        journal,
        queue,
        background,
        clock=clock,
        timers=timers,
        say=say,
        grace_s=ft.stop_grace_period_s,
        strict=strict,
    )
    sync = ft.execution_mode is ExecutionMode.SYNC
    # The job's watch, and one per replica group where the framework has groups.
    hangs = GroupedHangWatch(
        groups=[job.ranks(members) for members in roles.groups],
        group_output=backend.last_output_s,
        groups_enabled=ft.enable_job_hang_detection,
        enabled=sync and ft.enable_job_hang_detection,
        interval_s=ft.job_hang_interval_s,
        post=act.post,
        output_activity=backend.last_output_s,
        clock=clock,
        startup_timeout_s=ft.startup_timeout_s,
        timers=timers,
    )
    inbox = Inbox(hangs, rec, say, clock)
    injections = [parse_injection(t) for t in spec.fault_injection]
    faults = FaultInjector(injections, lambda inj: fault_handler.inject(inj), timers)
    inbox.on_step = faults.on_step
    keeper = CheckpointKeeper(spec.checkpoint, log_dir, rec, clock)

    def on_sdk_progress(
        replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        if step is not None:
            output_progress.sdk_reported()
        keeper.on_progress(replica, step, metrics, checkpoint)

    def on_output_step(replica: str, step: int, metrics: dict[str, object]) -> None:
        """A step read from the output: where an SDK report would go."""
        keeper.on_progress(replica, step, metrics, None)
        faults.on_step(None, step)  # the job's step: read from one replica for all

    def progress_note(replica: str, text: str) -> None:
        act.note(replica, "progress", text)
        say(f"{replica}: {text}")

    inbox.on_progress = on_sdk_progress
    output_progress = OutputProgress(
        spec.progress, primary, on_output_step, progress_note, act.later
    )
    every = spec.checkpoint.snapshot_persist_every
    snapshots = SnapshotKeeper(job_id, log_dir, keeper, every, say, clock)
    inbox.on_snapshot_stored = snapshots.on_snapshot
    sdk = SdkServer(inbox, new_token())
    # This machine's GPUs; on Ray the cluster reserves them (each replica's bundle).
    gpus_of = {p.role: p.resources.gpus if spec.backend != "ray" else 0 for p in spec.worker_pools}
    gpus = GpuPool([(p.name, gpus_of[p.role]) for p in plans], spec.gpu_inventory)
    ledger = Ledger(rec, gpus, say, backend.isolate_after)
    node_ledger = NodeLedger(rec, job_id, spec, backend, say, clock)
    node_ledger.avoid_known(NODE)
    failures = Failures(job, spec, roles, ledger, node_ledger, hangs, output_progress, inbox, clock)
    failures.rules()  # load the catalogue now, not on the first failure
    attempts = Attempts(
        job,
        act,
        spec=spec,
        backend=backend,
        preset=pre,
        launches=launches,
        gpus=gpus,
        keeper=keeper,
        snapshots=snapshots,
        sdk=sdk,
        hangs=hangs,
        faults=faults,
        node_ledger=node_ledger,
        rec=rec,
        services_first=lambda launched: groups.start_services_first(launched),
    )
    groups = Groups(
        job,
        act,
        roles=roles,
        preset=pre,
        launches=launches,
        hangs=hangs,
        rec=rec,
        launch=attempts.launch,
    )
    exits = Exits(
        job,
        act,
        spec=spec,
        roles=roles,
        primary=primary,
        launches=launches,
        hangs=hangs,
        output_progress=output_progress,
        failures=failures,
        rec=rec,
        maybe_running=attempts.maybe_running,
    )
    act.settled = exits.settled
    hang_response = HangResponse(
        job,
        act,
        backend=backend,
        roles=roles,
        primary=primary,
        launches=launches,
        hangs=hangs,
        inbox=inbox,
        failures=failures,
        rec=rec,
    )
    fault_handler = Faults(
        job,
        act,
        spec=spec,
        outcome=outcome,
        inbox=inbox,
        ledger=ledger,
        failures=failures,
        log_dir=log_dir,
        strict=strict,
    )
    return Parts(
        job=job,
        outcome=outcome,
        queue=queue,
        background=background,
        actions=act,
        preset=pre,
        roles=roles,
        primary=primary,
        launches=launches,
        hangs=hangs,
        inbox=inbox,
        faults=faults,
        keeper=keeper,
        output_progress=output_progress,
        snapshots=snapshots,
        sdk=sdk,
        gpus=gpus,
        ledger=ledger,
        node_ledger=node_ledger,
        failures=failures,
        attempts=attempts,
        groups=groups,
        exits=exits,
        hang_response=hang_response,
        fault_handler=fault_handler,
    )
