"""The node agent's wire (issue 40): one JSON object a line over one TCP connection from
the agent to the master. Each message names its `type`; the agent's first, `hello`, says
its protocol version, trainguard's version, the job, the node and the job's token, and the
master answers `welcome` or `refuse` (why, in one line) before anything else.

Pure: what a message must hold (`AGENT_SAYS`, `MASTER_SAYS`), how it is written and read
(`encode`, `decode`: a message that breaks the schema is a `ProtocolError` naming what is
wrong), whom the master refuses (`refusal`), and how launches and backend events travel
(`launch_message`/`launch_of`, `event_message`/`event_of`), so the master sees an agent's
replicas exactly as it sees its own machine's."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from trainguard import __version__
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.classify.classes import ExitEvidence
from trainguard.classify.readings import from_json, to_json

VERSION = 2
"""The protocol's version: an agent that speaks another is refused (and says so)."""

MAX_LINE = 4 << 20
"""The longest message either side reads (a replica's output arrives in bounded segments)."""

TOKEN_ENV = "TRAINGUARD_AGENT_TOKEN"
"""Where the agent finds the job's token (never on its command line, visible in `ps`)."""

AGENT_SAYS: Mapping[str, tuple[str, ...]] = {
    "hello": ("protocol", "version", "job", "node", "token", "pid"),
    "started": ("attempt", "replica", "restart", "pid", "time_s"),
    "first_output": ("attempt", "replica", "restart", "time_s"),
    "output": ("items",),  # [attempt, replica, restart, segments, time_s] of each, batched
    "exited": ("attempt", "replica", "restart", "pid", "evidence", "time_s"),
    "note": ("text",),  # what its warm start did, or why a replica starts cold
    "done": ("id",),  # the answer to an order: "ok" (a stop, a signal), "stacks" (stacks)
    "beat": ("time_s",),
}
MASTER_SAYS: Mapping[str, tuple[str, ...]] = {
    "welcome": ("preload",),  # what the agent's zygote imports
    "refuse": ("why",),
    "start": ("launches", "env"),  # "env": what every launch's environment holds
    "warm": ("launches", "env"),  # plan the zygote for such ranks now (a spare: none start yet)
    "stop": ("id", "replicas", "grace_s"),
    "signal": ("id", "replica", "signum"),
    "stacks": ("id", "targets", "timeout_s", "faulthandler_files"),
    "beat": ("time_s",),
    "close": (),
}


class ProtocolError(Exception):
    """A message that breaks the schema; the text names what is wrong."""


def encode(msg: Mapping[str, Any]) -> bytes:
    """One message as one line."""
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, says: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """One line read back as a message of `says` (`AGENT_SAYS` or `MASTER_SAYS`)."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a message of {len(line)} bytes: the most is {MAX_LINE}")
    try:
        msg = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message is a JSON object, got {type(msg).__name__}")
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in says:
        raise ProtocolError(f"unknown message type {kind!r}: expected one of {sorted(says)}")
    missing = [k for k in says[kind] if k not in msg]
    if missing:
        raise ProtocolError(f"{kind!r} message without {', '.join(missing)}")
    return msg


def hello(job: str, node: str, token: str, pid: int) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": VERSION,
        "version": __version__,
        "job": job,
        "node": node,
        "token": token,
        "pid": pid,
    }


def refusal(msg: Mapping[str, Any], job: str, token: str) -> str | None:
    """Why the master refuses this `hello` (None: welcome): another protocol or trainguard
    version, another job, a wrong token."""
    if msg.get("type") != "hello":
        return f"the first message must be 'hello', got {msg.get('type')!r}"
    if msg["protocol"] != VERSION or msg["version"] != __version__:
        return (
            f"agent of trainguard {msg['version']} (protocol {msg['protocol']}); this master "
            f"is trainguard {__version__} (protocol {VERSION}): run the same version on every node"
        )
    if msg["job"] != job:
        return f"agent for job {msg['job']!r}; this master runs job {job!r}"
    if not isinstance(msg["token"], str) or not hmac.compare_digest(msg["token"], token):
        return "wrong token for this job"
    return None


_LAUNCH_FIELDS = tuple(f.name for f in fields(Launch))


def launch_message(launch: Launch) -> dict[str, Any]:
    """Shallow (`asdict` deep-copies every environment: a thousand launches took 0.25 s)."""
    d = {name: getattr(launch, name) for name in _LAUNCH_FIELDS}
    d["argv"], d["log_path"] = list(launch.argv), str(launch.log_path)
    return d


def launch_of(d: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Launch:
    """A launch back; `env`: what its message left out of its environment (the shared)."""
    try:
        kw = {f.name: d[f.name] for f in fields(Launch) if f.name in d}
        kw["argv"], kw["log_path"] = tuple(kw["argv"]), Path(kw["log_path"])
        if env:
            kw["env"] = {**env, **kw["env"]}
        return Launch(**kw)
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"a launch without a valid {exc}") from None


def launches_message(launches: Sequence[Launch]) -> dict[str, Any]:
    """Launches with the environment they share said once (`env`), each with what is its
    own: a node's ranks share all but a few variables, and a start to 1,024 ranks was
    mostly the same environment encoded 1,024 times."""
    envs = [la.env for la in launches]
    shared = dict(envs[0]) if envs else {}
    for env in envs[1:]:
        shared = {k: v for k, v in shared.items() if env.get(k) == v}
    out = []
    for la in launches:
        d = launch_message(la)
        d["env"] = {k: v for k, v in la.env.items() if k not in shared}
        out.append(d)
    return {"launches": out, "env": shared}


def launches_of(msg: Mapping[str, Any]) -> list[Launch]:
    env = msg["env"]
    if not isinstance(env, dict):
        raise ProtocolError("a start whose env is not an object")
    return [launch_of(d, env) for d in msg["launches"]]


def event_message(ev: BackendEvent) -> dict[str, Any]:
    """A backend event of the agent's replicas, as the agent sends it."""
    d = asdict(ev)
    if isinstance(ev, ReplicaStarted):
        d["type"] = "started"
    elif isinstance(ev, ReplicaFirstOutput):
        d["type"] = "first_output"
    elif isinstance(ev, ReplicaOutput):
        return output_message([ev])
    else:
        d["type"] = "exited"
        d["evidence"]["machine"] = to_json(ev.evidence.machine)  # as a failure record holds it
    return d


def output_message(outputs: Sequence[ReplicaOutput]) -> dict[str, Any]:
    """The output of any of a node's replicas in one message: the agent batches what comes
    within `node.OUTPUT_BATCH_S`, so the master reads a message per batch, not per line."""
    items = [[o.attempt, o.replica, o.restart, list(o.segments), o.time_s] for o in outputs]
    return {"type": "output", "items": items}


def outputs_of(msg: Mapping[str, Any]) -> list[ReplicaOutput]:
    try:
        return [
            ReplicaOutput(int(a), str(r), int(k), tuple(str(s) for s in segs), float(t))
            for a, r, k, segs, t in msg["items"]
        ]
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"'output' message with a bad item: {exc}") from None


def event_of(msg: Mapping[str, Any], node: str) -> BackendEvent:
    """The backend event an agent on `node` sent (its replicas' starts run there); an
    output message of one item is that output."""
    kind = msg["type"]
    if kind == "output":
        outputs = outputs_of(msg)
        if len(outputs) != 1:
            raise ProtocolError(f"an output message of {len(outputs)} items is no one event")
        return outputs[0]
    try:
        head = (int(msg["attempt"]), str(msg["replica"]), int(msg["restart"]))
        if kind == "started":
            return ReplicaStarted(*head, int(msg["pid"]), float(msg["time_s"]), node)
        if kind == "first_output":
            return ReplicaFirstOutput(*head, float(msg["time_s"]))
        if kind == "exited":
            pid = None if msg["pid"] is None else int(msg["pid"])
            return ReplicaExited(*head, pid, _evidence(msg["evidence"]), float(msg["time_s"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"{kind!r} message with a bad field: {exc}") from None
    raise ProtocolError(f"{kind!r} is no replica event")


def _evidence(d: Mapping[str, Any]) -> ExitEvidence:
    kw = {f.name: d[f.name] for f in fields(ExitEvidence) if f.name in d}
    kw["log_tail"] = tuple(kw.get("log_tail", ()))
    kw["own_ports"] = tuple(kw.get("own_ports", ()))
    kw["machine"] = from_json(kw.get("machine"))
    return ExitEvidence(**kw)
