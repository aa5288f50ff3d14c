"""The node ledger's queries (R-EVID-4): rows in, node standings out.

One table, `node_events`, read in order per node: the failures that blame the machine and
the changes of its standing (trainguard.policy.probation folds them). Masters write faults
and probations; `trainguard nodes release`, the API and a passing node check forgive.
"""

from __future__ import annotations

import socket
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from trainguard.errors import StoreError, TrainguardError
from trainguard.policy.probation import (
    FORGIVING,
    NodeEvent,
    NodeEventKind,
    NodeState,
    node_state,
)
from trainguard.records.engine import one_line
from trainguard.records.rows import NodeEventRow
from trainguard.records.schema import node_events
from trainguard.records.store import Store

NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"
"""A node as a backend names it (a hostname, a Slurm node, a Ray node id)."""

ONE_MACHINE = "local backend: one machine, nothing to avoid"
"""What `nodes` says of a node only the local backend used."""


HISTORY_KEPT = 100
"""A node's newest ledger rows in `nodes --json` and GET /api/nodes (its standing counts
them all)."""


class NodeNotFound(TrainguardError):
    """A node the ledger holds no row of (exit 2; 404 from the API)."""

    exit_code = 2


def add(store: Store, event: NodeEvent) -> int:
    """Write one ledger row; returns its id."""
    return store.insert(
        node_events,
        node=event.node,
        kind=event.kind.value,
        at_s=event.at_s,
        job_id=event.job_id,
        attempt=event.attempt,
        replica=event.replica,
        failure_class=event.failure_class,
        rule=event.rule,
        matched_line=event.matched_line,
        reason=event.reason,
        backend=event.backend,
    )


def _event(row: Any) -> NodeEvent:
    r = NodeEventRow.of(row._mapping)
    return NodeEvent(
        r.node,
        NodeEventKind(r.kind),
        r.at_s,
        r.job_id,
        r.attempt,
        r.replica,
        r.failure_class,
        r.rule,
        r.matched_line,
        r.reason,
        r.backend,
    )


def _read(store: Store, stmt: Any) -> list[Any]:
    try:
        with store.engine.connect() as conn:
            return list(conn.execute(stmt).all())
    except SQLAlchemyError as exc:  # as the store's own reads say it
        raise StoreError(
            f"trainguard store error: {type(exc).__name__}: {one_line(exc)}",
            transient=isinstance(exc, OperationalError),
        ) from None


def _events(store: Store, node: str | None = None) -> dict[str, list[NodeEvent]]:
    stmt = select(node_events).order_by(node_events.c.id)  # the order they were written
    if node is not None:
        stmt = stmt.where(node_events.c.node == node)
    out: dict[str, list[NodeEvent]] = defaultdict(list)
    for row in _read(store, stmt):
        e = _event(row)
        out[e.node].append(e)
    return dict(out)


def states(store: Store) -> list[NodeState]:
    """Every node the ledger knows, by name."""
    return [node_state(n, evs) for n, evs in sorted(_events(store).items())]


def state_of(store: Store, node: str) -> NodeState:
    """One node's standing (no rows: a clean one)."""
    return node_state(node, _events(store, node).get(node, []))


def on_probation(store: Store) -> dict[str, str]:
    """node -> why, for every node on probation: placement avoids them, and each needs a
    node check before it is used again. Read at every job's start, so in SQL: the nodes
    whose last change of standing is a probation (100,000 rows: milliseconds, not the
    second that folding every row takes)."""
    t = node_events
    standing = [k.value for k in (NodeEventKind.PROBATION, *FORGIVING)]
    last = (
        select(func.max(t.c.id).label("id"))
        .where(t.c.kind.in_(standing))
        .group_by(t.c.node)
        .subquery()
    )
    stmt = (
        select(t.c.node, t.c.reason)
        .join(last, t.c.id == last.c.id)
        .where(t.c.kind == NodeEventKind.PROBATION.value)
        .order_by(t.c.node)
    )
    return {node: reason or "on probation" for node, reason in _read(store, stmt)}


needs_check = on_probation
"""The nodes a node check must pass on before they are used again (same set)."""


def release(store: Store, node: str, at_s: float, by: str | None = None) -> NodeState:
    """A person forgives `node`: its faults so far count no more, its probation ends."""
    if not _events(store, node):
        known = ", ".join(s.node for s in states(store)[:10]) or "none yet"
        raise NodeNotFound(f"no node {node!r} in the node ledger (known: {known})")
    who = by or "a person"
    add(store, NodeEvent(node, NodeEventKind.RELEASED, at_s, reason=f"released by {who}"))
    return state_of(store, node)


def check_passed(store: Store, node: str, at_s: float, detail: str = "") -> bool:
    """A node check passed on `node` (the node-check's call): a node on probation is
    forgiven and used again. Returns whether it was on probation."""
    if not state_of(store, node).on_probation:
        return False
    why = "node check passed" + (f": {detail}" if detail else "")
    add(store, NodeEvent(node, NodeEventKind.CHECK_PASSED, at_s, reason=why))
    return True


def _row(e: NodeEvent) -> dict[str, Any]:
    keys = ("kind", "at_s", "job_id", "attempt", "replica", "failure_class", "rule")
    out = {k: getattr(e, k) for k in keys}
    out["kind"] = e.kind.value
    out.update(matched_line=e.matched_line, reason=e.reason, backend=e.backend)
    return out


def view(s: NodeState) -> dict[str, Any]:
    """One node as `nodes --json` and GET /api/nodes show it."""
    backends = sorted({e.backend for e in s.history if e.backend})
    note = ONE_MACHINE if backends == ["local"] else None
    last = s.faults[-1] if s.faults else None
    return {
        "node": s.node,
        "state": "probation" if s.on_probation else "ok",
        "needs_check": s.needs_check,
        "since_s": s.since_s,
        "reason": s.reason,
        "faults": len(s.faults),  # since it was last forgiven
        "jobs": len({f.job_id for f in s.faults if f.job_id}),
        "last_fault_s": last.at_s if last else None,
        "last_fault": last.reason if last else None,
        "backends": backends,
        "note": note,
        "history": [_row(e) for e in s.history[-HISTORY_KEPT:]],
        "history_rows": len(s.history),  # in the ledger; the newest HISTORY_KEPT are shown
    }


def nodes_view(store: Store) -> list[dict[str, Any]]:
    return [view(s) for s in states(store)]


def who() -> str:
    """The person releasing a node here: user@host."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"
