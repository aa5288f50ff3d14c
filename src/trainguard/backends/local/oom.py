"""Evidence of the kernel's OOM killer: the `oom_kill` counter of our memory cgroup.

A replica killed by SIGKILL while this counter rose was most likely killed for memory.
cgroup v2 keeps it in `memory.events`, v1 in `memory.oom_control`; where neither can be
read the counter stays 0 and no exit is called an OOM on this evidence.
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _candidates() -> list[Path]:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    out: list[Path] = []
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            out += [_ROOT / rel / "memory.events", _ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            out += [
                _ROOT / "memory" / rel / "memory.oom_control",
                _ROOT / "memory/memory.oom_control",
            ]
    return out


def _find() -> Path | None:
    for path in _candidates():
        if path.is_file():
            return path
    return None


_FILE = _find()


def oom_kill_count() -> int:
    if _FILE is None:
        return 0
    try:
        text = _FILE.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0
