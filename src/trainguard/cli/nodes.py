"""`trainguard nodes`: the node ledger (R-EVID-4), each node's standing and history;
`trainguard nodes release NODE` forgives one. From this machine's store, or a server's."""

from __future__ import annotations

import argparse
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Protocol

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from trainguard.cli.readers import dump_json
from trainguard.cli.render import console, data_text, fmt_time
from trainguard.errors import SpecError
from trainguard.records.store import Store

if TYPE_CHECKING:
    from trainguard.cli.client import Client

HISTORY_SHOWN = 10
"""The newest ledger rows shown under each node in the table (--json has them all)."""


class NodeSource(Protocol):
    def list(self) -> list[dict[str, Any]]: ...
    def release(self, node: str) -> dict[str, Any]: ...


class LocalNodes:
    """This machine's node ledger (its module, with the probation rules, is imported only
    by `nodes`: the other commands start faster without it)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def list(self) -> list[dict[str, Any]]:
        from trainguard.records import nodes

        return nodes.nodes_view(self.store)

    def release(self, node: str) -> dict[str, Any]:
        from trainguard.records import nodes

        return nodes.view(nodes.release(self.store, node, time.time(), nodes.who()))


class RemoteNodes:
    def __init__(self, client: Client) -> None:
        self.client = client

    def list(self) -> list[dict[str, Any]]:
        return list(self.client.call("GET", "/api/nodes"))

    def release(self, node: str) -> dict[str, Any]:
        path = f"/api/nodes/{urllib.parse.quote(node, safe='')}/release"
        return dict(self.client.call("POST", path, {}))


def cmd_nodes(args: argparse.Namespace, source: NodeSource) -> int:
    if args.action is None and args.node is not None:
        raise SpecError([f"nodes: unexpected argument {args.node!r} (nodes release NODE)"])
    if args.action == "release":
        if args.node is None:
            raise SpecError(["nodes release: name the node to release (nodes release NODE)"])
        view = source.release(args.node)
        if args.json:
            dump_json(view)
        else:
            print(f"node {view['node']} released: its faults so far no longer count")
        return 0
    rows = source.list()
    if args.json:
        dump_json(rows)
        return 0
    if not rows:
        print("no node has a machine-blamed failure yet")
        return 0
    console().print(nodes_renderable(rows))
    return 0


def nodes_renderable(rows: list[dict[str, Any]]) -> RenderableType:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for i, c in enumerate(("NODE", "STATE", "FAULTS", "JOBS", "LAST FAULT", "WHY")):
        table.add_column(c, overflow="fold", no_wrap=i == 0)
    for r in rows:
        state = "probation (needs check)" if r["needs_check"] else r["state"]
        why = r["reason"] if r["state"] == "probation" else r["last_fault"]
        cells = (r["node"], state, r["faults"], r["jobs"], fmt_time(r["last_fault_s"]), why)
        table.add_row(*(data_text("" if c is None else c) for c in cells))
    parts: list[RenderableType] = [table]
    for r in rows:
        parts.append(Text(""))
        parts.append(data_text(f"{r['node']}:" + (f" ({r['note']})" if r.get("note") else "")))
        for h in r["history"][-HISTORY_SHOWN:]:
            parts.append(data_text(f"  {history_line(h)}"))
    return Group(*parts)


def history_line(h: dict[str, Any]) -> str:
    when = fmt_time(h["at_s"])
    if h["kind"] != "fault":
        return f"{when}  {h['kind']}: {h.get('reason') or ''}".rstrip()
    where = f"job {h['job_id']} attempt {h['attempt']} {h['replica']}"
    return f"{when}  fault of {where}: {h.get('reason') or h.get('failure_class')}"
