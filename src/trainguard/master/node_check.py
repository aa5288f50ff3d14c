"""The node check before a suspicious retry, carried out: after a failure that may be the
machine's (`policy.node_check.check_reason`) and before the job starts again, the backend
checks its nodes and keeps the bad ones out; the restart record says which and why.

The check is bounded (`CHECK_LIMIT_S`, plus a margin for the backend's own calls) and
runs as awaited child processes, so the loop's other tasks (the SDK channel, the backend's
streams) go on; a check that cannot run or does not finish is recorded, never fatal.
"""

from __future__ import annotations

import asyncio

from trainguard.backends.interface import Backend, NodeCheckOutcome, check_nodes
from trainguard.master.actions import Actions
from trainguard.master.node_ledger import NodeLedger
from trainguard.policy.budgets import Failure
from trainguard.policy.node_check import CHECK_LIMIT_S, check_reason
from trainguard.records.recorder import Recorder

NODE_CHECK_EVENT = "node_check"
_MARGIN_S = 15.0  # the backend's own calls around the check (scontrol, probes)


async def before_restart(
    act: Actions,
    backend: Backend,
    rec: Recorder,
    node_ledger: NodeLedger,
    failure: Failure,
    record_id: int,
) -> None:
    """Check the nodes if `failure` calls for it; record what was found and done."""
    reason = check_reason(failure.classification)
    if reason is None:
        return
    try:
        outcome = await asyncio.wait_for(check_nodes(backend, reason), CHECK_LIMIT_S + _MARGIN_S)
    except TimeoutError:
        why = f"did not finish in {CHECK_LIMIT_S + _MARGIN_S:g} s"
        outcome = NodeCheckOutcome(f"node check after {reason} {why}", ran=False)
    except Exception as exc:  # the check's own fault: the retry goes on unchecked
        why = f"{type(exc).__name__}: {exc}"
        outcome = NodeCheckOutcome(f"node check after {reason} could not run: {why}", ran=False)
    act.note(failure.replica, NODE_CHECK_EVENT, outcome.note)
    node_ledger.after_check(outcome, failure)
    if not outcome.supported:
        return  # the backend has none: an event, and no word in the restart record
    act.say(outcome.note)
    if outcome.changed or not outcome.ran:
        rec.restart_note(record_id, outcome.note)
