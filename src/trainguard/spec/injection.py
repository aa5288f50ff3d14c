"""Built-in fault injection (issue 5): `--inject SPEC`, for users to test their resilience.

    signal:REPLICA:SIGNAL@TRIGGER   e.g. signal:worker-1:SIGKILL@20s, signal:worker-0:SEGV@step=50
    exit:REPLICA:CODE@TRIGGER       the replica exits with CODE at its next SDK call
    stop:REPLICA@TRIGGER            SIGSTOP: a hang without a code change
    master@TRIGGER                  SIGKILL the master itself (then `trainguard resume`)

TRIGGER is `Ns` (seconds after the attempt is running) or `step=N` (when the replica
reports that step through the SDK, or the job's output shows it: see `progress`). An
injection fires once, in attempt 0 unless
`,attempt=N` follows the trigger.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainguard.signals import parse_signal, signal_name
from trainguard.spec.text import shown

_SPEC = re.compile(
    r"^(?P<action>signal|stop|master|exit)"
    r"(?::(?P<replica>[a-z][a-z0-9_-]*-\d+))?"
    r"(?::(?P<signal>[A-Za-z0-9]+))?"
    r"@(?:(?P<after>\d+(?:\.\d+)?)s|step=(?P<step>\d+))"
    r"(?:,attempt=(?P<attempt>\d+))?$"
)


@dataclass(frozen=True)
class Injection:
    action: Literal["signal", "stop", "master", "exit"]
    replica: str | None
    signal: int | None
    after_s: float | None
    at_step: int | None
    attempt: int
    text: str
    code: int | None = None  # exit: the status to exit with

    def describe(self) -> str:
        what = {
            "signal": f"send {signal_name(self.signal or 0)} to {self.replica}",
            "stop": f"SIGSTOP {self.replica}",
            "master": "SIGKILL the master",
            "exit": f"make {self.replica} exit with status {self.code}",
        }[self.action]
        when = (
            f"{self.after_s:g} s into" if self.after_s is not None else f"at step {self.at_step} of"
        )
        return f"{what} {when} attempt {self.attempt}"


_LATEST_S = 10**7  # about 115 days: later is a typo
_LAST_STEP = 10**15


def parse_injection(text: str) -> Injection:
    """One `--inject` value; ValueError names what is wrong."""
    m = _SPEC.match(text.strip())
    if m is None:
        raise ValueError(
            f"must look like signal:worker-1:SIGKILL@20s, stop:worker-0@step=50 or master@30s, "
            f"got {shown(text)}"
        )
    if m["after"] and float(m["after"]) > _LATEST_S:
        raise ValueError(f"an injection time is at most {_LATEST_S} s, got {shown(text)}")
    if m["attempt"] and int(m["attempt"]) > _LAST_STEP:
        raise ValueError(f"an injection attempt is at most {_LAST_STEP}, got {shown(text)}")
    if m["step"] and int(m["step"]) > _LAST_STEP:
        raise ValueError(f"an injection step is at most {_LAST_STEP}, got {shown(text)}")
    action = m["action"]
    if action == "exit":
        if not (m["replica"] and m["signal"] and m["signal"].isdigit()):
            raise ValueError(
                f"exit needs a replica and a status, e.g. exit:worker-1:3@5s, got {shown(text)}"
            )
        if not 0 <= int(m["signal"]) <= 255:
            raise ValueError(f"an exit status is 0 to 255, got {m['signal']} in {shown(text)}")
        return Injection(
            "exit",
            m["replica"],
            None,
            float(m["after"]) if m["after"] else None,
            int(m["step"]) if m["step"] else None,
            int(m["attempt"] or 0),
            text,
            code=int(m["signal"]),
        )
    if action in ("signal", "stop") and not m["replica"]:
        raise ValueError(f"{action} needs a replica, e.g. {action}:worker-1, got {shown(text)}")
    if action == "master" and (m["replica"] or m["signal"]):
        raise ValueError(f"master takes no replica or signal, got {shown(text)}")
    sig: int | None = None
    if action == "signal":
        if not m["signal"]:
            raise ValueError(
                f"signal needs a signal, e.g. signal:worker-1:SIGKILL@5s, got {shown(text)}"
            )
        sig = parse_signal(m["signal"])
    elif m["signal"]:
        raise ValueError(f"{action} takes no signal, got {shown(text)}")
    return Injection(
        action=action,  # type: ignore[arg-type]
        replica=m["replica"],
        signal=sig,
        after_s=float(m["after"]) if m["after"] else None,
        at_step=int(m["step"]) if m["step"] else None,
        attempt=int(m["attempt"] or 0),
        text=text,
    )
