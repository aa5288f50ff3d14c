"""How the CLI draws a job: the tables of `jobs`, `status` and `records`, and the live
panel of `trainguard run`, all with rich, so they look alike on a terminal and stay plain
text (no colour, no screen control) in a pipe or a log.

Job data (names, messages, replica output, metric names) is text, never markup nor
terminal control: every cell is a `Text` of `printable(...)`, and the consoles read no
markup at all, so `[/]` in an error message is shown, not parsed (and cannot crash)."""

from __future__ import annotations

import io
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from trainguard.classify.logtail import printable

_STATE_STYLE = {
    "RUNNING": "green",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "RESTARTING": "yellow",
    "PENDING": "cyan",
    "QUEUED": "cyan",
    "CANCELLING": "magenta",
    "CANCELLED": "magenta",
    "EXPIRED": "red",
    "INTERRUPTED": "red",
    "STOPPED": "dim",
}


PIPE_WIDTH = 200
"""Rows in a pipe or a log are this wide before they wrap (a terminal's own width there)."""


def console(file: TextIO | None = None) -> Console:
    """A console on `file` (stdout): colour on a terminal only, long rows kept whole in
    a pipe."""
    out = file or sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())
    return Console(
        file=out,
        highlight=False,
        markup=False,
        soft_wrap=True,
        width=None if tty else PIPE_WIDTH,
    )


def to_text(renderable: RenderableType, color: bool = False) -> str:
    """What `renderable` prints, as a string (the terminal's width; colour if asked)."""
    out = Console(
        file=io.StringIO(),
        width=shutil.get_terminal_size().columns if color else PIPE_WIDTH,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    out.print(renderable)
    value = out.file.getvalue()  # type: ignore[attr-defined]
    return str(value).rstrip("\n")


def fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def fmt_span(seconds: float) -> str:
    """1:02:03, 2:03, 0:07."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def data_text(value: object, style: str = "") -> Text:
    """Job data as rich shows it: as it is, its control characters escaped."""
    return value if isinstance(value, Text) else Text(printable(str(value)), style=style)


def state_text(state: str) -> Text:
    return data_text(state, style=_STATE_STYLE.get(state, ""))


def _add_row(table: Table, *cells: object) -> None:
    table.add_row(*(data_text(c) for c in cells))


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for i, c in enumerate(columns):
        table.add_column(c, overflow="fold", no_wrap=i == 0)
    return table


def jobs_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = _table("ID", "NAME", "STATE", "ATTEMPTS", "STEP", "CREATED", "NOTE")
    for r in rows:
        step = r.get("last_step")
        _add_row(
            table,
            r["id"],
            r["name"],
            state_text(r["state"]),
            str(r["attempts"]),
            "-" if step is None else str(step),
            fmt_time(r["created_at_s"]),
            r.get("queued_reason") or "",
        )
    return table


def status_renderable(view: dict[str, Any]) -> RenderableType:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    _add_row(head, "job", f"{view['id']} ({view['name']})")
    _add_row(head, "state", state_text(view["state"]))
    if view.get("queued_reason"):
        _add_row(head, "queue", view["queued_reason"])
    _add_row(head, "attempts", f"{view['attempts']} ({view['restarts']} restart(s))")
    if (line := progress_line(view.get("progress"))) is not None:
        _add_row(head, "progress", line)
    _add_row(
        head,
        "created",
        f"{fmt_time(view['created_at_s'])}   ended {fmt_time(view['ended_at_s'])}",
    )
    if view["error_message"]:
        _add_row(head, "error", f"[{view['error_code']}] {view['error_message']}")
    _add_row(head, "logs", view["log_dir"])
    replicas = _table("REPLICA", "RANK", "STATE", "PID", "EXIT", "NODE")
    for r in view["replicas"]:
        code = "" if r["exit_code"] is None else str(r["exit_code"])
        if r.get("signal"):
            code = f"{code} ({r['signal']})".strip()
        _add_row(
            replicas,
            r["name"],
            str(r["rank"]),
            state_text(r["state"]),
            str(r["pid"] or "-"),
            code,
            r.get("node") or "",
        )
    return Group(head, Text(""), replicas)


def progress_line(progress: dict[str, Any] | None, rate: float | None = None) -> str | None:
    """ "step 120 (8.1/s)  loss 0.31" from a job's last progress; None: no progress yet."""
    if not progress or progress.get("step") is None:
        return None
    metrics = progress.get("metrics") or {}
    step = progress["step"]
    where = metrics.get("progress_from")
    text = f"epoch {step / 1000:g}" if where == "hf-trainer-epoch" else f"step {step}"
    if rate is not None:
        text += f" ({rate:.3g}/s)"
    shown = [
        f"{k} {v:.4g}"
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and "loss" in k
    ][:2]
    if where:
        shown.append(f"(read from the output: {where})")
    return "  ".join([text, *shown])


def records_renderable(rows: Sequence[dict[str, Any]]) -> RenderableType:
    table = _table("#", "AT", "NODE", "REPLICA", "CODE", "SOURCE", "CLASS", "DECISION")
    for r in rows:
        _add_row(
            table,
            str(r["round"]),
            fmt_time(r["at_s"]),
            r["node"] or "-",
            r["replica"] or "-",
            str(r["error_code"] or "-"),
            r["error_source"] or "-",
            r["failure_class"] or "-",
            r["decision"] or "-",
        )
    details: list[RenderableType] = [table]
    for r in rows:
        lines = [f"#{r['round']} {r['error_message']}"]
        if r["cascade"]:
            lines.append(f"   cascade:  {r['cascade']} failed after it")
        if r["isolated"]:
            lines.append(f"   isolated: {r['isolated']}")
        if r["snapshot_id"]:
            lines.append(f"   stacks:   trainguard stacks {r['job_id']}")
        phases = ", ".join(
            f"{k[:-3]} {r[k]:.0f} ms"
            for k in ("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms")
            if r[k] is not None
        )
        if phases:
            lines.append(f"   phases:   {phases}")
        details.append(data_text("\n".join(lines)))
    return Group(*details)


def live_panel(
    view: dict[str, Any] | None,
    activity: tuple[str, float] | None,
    rate: float | None,
    now_s: float,
) -> RenderableType:
    """The panel below the replicas' output while `trainguard run` supervises: the job's
    state, attempt, replicas, progress, restarts, elapsed time, and what it is doing now
    (with how long it has been at it: a long wait shows that it is still waiting)."""
    if view is None:
        return Panel(Text("starting ..."), title=Text("trainguard"), box=box.ROUNDED)
    states = [r["state"] for r in view["replicas"]]
    running = states.count("RUNNING")
    failed = sum(s in ("FAILED", "LOST") for s in states)
    line = Text()
    line.append(printable(f"{view['name']} "), style="bold")
    line.append_text(state_text(view["state"]))
    line.append(f"  attempt {max(0, view['attempts'] - 1)}")
    line.append(f"  replicas {running}/{len(states)} running")
    if failed:
        line.append(f", {failed} failed", style="red")
    line.append(f"  restarts {view['restarts']}")
    line.append(f"  elapsed {fmt_span(now_s - view['created_at_s'])}")
    rows: list[RenderableType] = [line]
    progress = progress_line(view.get("progress"), rate)
    rows.append(data_text(progress or "no step seen yet", style="" if progress else "dim"))
    if activity is not None:
        doing, since = activity
        rows.append(data_text(f"{doing}  ({fmt_span(now_s - since)})", style="dim"))
    title = data_text(f"trainguard {view['id']}")
    return Panel(Group(*rows), title=title, box=box.ROUNDED, expand=True)
