"""The node agent's wire (issue 40): what each side may say, how a broken message is named,
whom the master refuses, and events that arrive as the local backend emitted them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainguard import __version__
from trainguard.backends.agent import protocol as wire
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.classify.classes import ExitEvidence
from trainguard.classify.readings import Finding, MachineReading


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"{not json\n", "not a JSON message"),
        (b"[1, 2]\n", "a message is a JSON object, got list"),
        (b'{"type": "dance"}\n', "unknown message type 'dance'"),
        (b'{"kind": "beat"}\n', "unknown message type None"),
        (b'{"type": "exited", "attempt": 0}\n', "'exited' message without replica, restart"),
        (b'{"type": "beat"}' + b" " * wire.MAX_LINE, "the most is"),
    ],
)
def test_a_broken_message_is_named(line: bytes, says: str) -> None:
    with pytest.raises(wire.ProtocolError, match=says):
        wire.decode(line, wire.AGENT_SAYS)


def test_each_side_reads_only_its_peers_words() -> None:
    start = wire.encode({"type": "start", "launches": [], "env": {}})
    assert wire.decode(start, wire.MASTER_SAYS)["type"] == "start"
    with pytest.raises(wire.ProtocolError, match="unknown message type 'start'"):
        wire.decode(start, wire.AGENT_SAYS)


HELLO = wire.hello("job-1", "n1", "secret", 42)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({}, None),
        ({"version": "0.0.1"}, f"agent of trainguard 0.0.1 (protocol {wire.VERSION}); this"),
        ({"protocol": 1}, "(protocol 1); this master is trainguard"),
        ({"job": "job-2"}, "agent for job 'job-2'; this master runs job 'job-1'"),
        ({"token": "guess"}, "wrong token for this job"),
        ({"token": 7}, "wrong token for this job"),
        ({"type": "beat"}, "the first message must be 'hello', got 'beat'"),
    ],
)
def test_the_master_refuses_other_versions_jobs_and_tokens(
    change: dict[str, object], why: str | None
) -> None:
    got = wire.refusal({**HELLO, **change}, "job-1", "secret")
    assert got == why if why is None else got is not None and why in got


def test_hello_says_this_version() -> None:
    assert (HELLO["protocol"], HELLO["version"]) == (wire.VERSION, __version__)


def test_launches_travel_whole_with_their_shared_environment_said_once(tmp_path: Path) -> None:
    one = Launch(2, "worker-1", 1, 3, ("python", "t.py"), {"A": "b", "RANK": "1"}, "/w", tmp_path)
    two = Launch(2, "worker-2", 2, 0, ("python", "t.py"), {"A": "b", "RANK": "2"}, "/w", tmp_path)
    line = wire.encode({"type": "start", **wire.launches_message([one, two])})
    msg = wire.decode(line, wire.MASTER_SAYS)
    assert msg["env"] == {"A": "b"} and [d["env"] for d in msg["launches"]] == [
        {"RANK": "1"},
        {"RANK": "2"},
    ]
    assert wire.launches_of(msg) == [one, two]
    alone = wire.launches_message([replace(one, memory_bytes=7)])
    assert wire.launches_of(alone) == [replace(one, memory_bytes=7)]
    (back,) = alone["launches"]
    with pytest.raises(wire.ProtocolError, match="a launch without a valid 'argv'"):
        wire.launch_of({k: v for k, v in back.items() if k != "argv"})


READING = MachineReading("dmesg", "segfault at 0", "a segfault", True, Finding.SEGFAULT, pid=9)
EVENTS: list[BackendEvent] = [
    ReplicaStarted(1, "worker-0", 0, 4242, 10.5),
    ReplicaFirstOutput(1, "worker-0", 0, 11.0),
    ReplicaOutput(1, "worker-0", 0, ("step 1", "step 2\r"), 11.5),
    ReplicaExited(
        1,
        "worker-0",
        0,
        4242,
        ExitEvidence(
            "worker-0",
            -11,
            log_tail=("step 2", "Segmentation fault"),
            oom_kills=1,
            progressed=True,
            own_ports=(29500,),
            machine=(READING,),
        ),
        12.0,
    ),
    ReplicaExited(1, "worker-1", 2, None, ExitEvidence("worker-1", None, spawn_error="no"), 3.0),
]


@pytest.mark.parametrize("ev", EVENTS, ids=lambda ev: type(ev).__name__)
def test_an_event_arrives_as_the_agents_backend_emitted_it(ev: BackendEvent) -> None:
    line = wire.encode(wire.event_message(ev))
    back = wire.event_of(wire.decode(line, wire.AGENT_SAYS), "n1")
    if isinstance(ev, ReplicaStarted):
        assert back == ReplicaStarted(1, "worker-0", 0, 4242, 10.5, "n1")  # where it runs
    else:
        assert back == ev


def test_an_event_with_a_bad_field_is_named() -> None:
    msg = {**wire.event_message(EVENTS[0]), "pid": "many"}
    with pytest.raises(wire.ProtocolError, match="'started' message with a bad field"):
        wire.event_of(msg, "n1")


def test_a_batch_of_output_arrives_as_one_event_per_replica_run() -> None:
    outs = [
        ReplicaOutput(1, "worker-0", 0, ("step 1",), 11.5),
        ReplicaOutput(1, "worker-1", 2, ("step 1", "step 2"), 11.6),
    ]
    msg = wire.decode(wire.encode(wire.output_message(outs)), wire.AGENT_SAYS)
    assert wire.outputs_of(msg) == outs
    with pytest.raises(wire.ProtocolError, match="an output message of 2 items is no one"):
        wire.event_of(msg, "n1")
    with pytest.raises(wire.ProtocolError, match="'output' message with a bad item"):
        wire.outputs_of({"type": "output", "items": [[1, "worker-0", 0, ["x"]]]})
