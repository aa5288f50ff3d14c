"""What the machine said at a failure, as values (R-EVID-1): one `MachineReading` per thing
read (a cgroup counter, a kernel log line, a path's free space, a GPU's health, who sent
the signal). A source that could not be read is a reading too (`Finding.ABSENT`), so a
missing source is recorded, never guessed. Probes make them (`backends.machine_probe`),
the pure weighing reads them (`classify.machine`), `explain` shows them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Source(StrEnum):
    CGROUP = "cgroup"
    KMSG = "kmsg"
    SIGNAL = "signal"
    DISK = "disk"
    GPU = "gpu"
    TAIL = "tail"


class Finding(StrEnum):
    """What a reading found, for the weighing (its words are for people)."""

    ABSENT = "absent"  # the source could not be read: no verdict may rest on it
    NOTHING = "nothing"  # read, and nothing wrong in it
    OOM_KILL = "oom_kill"
    SEGFAULT = "segfault"
    TRAP = "trap"
    HUNG_TASK = "hung_task"
    XID = "xid"
    GPU_LOST = "gpu_lost"
    GPU_MEMORY = "gpu_memory"  # uncorrectable ECC, pages pending retirement, rows remapped
    GPU_RESET = "gpu_reset"  # NVML asks for a reset / a node reboot
    DISK_FULL = "disk_full"
    READ_ONLY = "read_only"
    IO_ERROR = "io_error"
    SENT_BY_TRAINGUARD = "sent_by_trainguard"
    SENT_BY_SCHEDULER = "sent_by_scheduler"
    SENT_BY_KERNEL = "sent_by_kernel"
    SENT_BY_OTHER = "sent_by_other"


@dataclass(frozen=True)
class MachineReading:
    """One thing read from the machine: `value` as read, `reading` what it means."""

    source: str
    value: str
    reading: str
    sure: bool
    finding: Finding = Finding.NOTHING
    subject: str = ""  # what it is about: the path, the library, the Xid code, the pid
    pid: int | None = None  # the process a kernel line names

    def shown(self) -> str:
        """`source: value -> reading (sure|uncertain)`, as `explain` prints it."""
        sure = "sure" if self.sure else "uncertain"
        return f"{self.source}: {self.value} -> {self.reading} ({sure})"


def to_json(readings: tuple[MachineReading, ...]) -> str | None:
    """The readings as stored with a failure record (None: none were gathered)."""
    if not readings:
        return None
    return json.dumps(
        [{k: v for k, v in asdict(r).items() if v not in ("", None)} for r in readings]
    )


def from_json(text: str | None) -> tuple[MachineReading, ...]:
    """The readings of a failure record; what a newer or older trainguard wrote that does
    not parse is left out (never raised: `explain` must show the rest)."""
    if not text:
        return ()
    try:
        rows: Any = json.loads(text)
    except ValueError:
        return ()
    out: list[MachineReading] = []
    for row in rows if isinstance(rows, list) else []:
        try:
            finding = Finding(row.get("finding", Finding.NOTHING))
            out.append(
                MachineReading(
                    str(row["source"]),
                    str(row["value"]),
                    str(row["reading"]),
                    bool(row["sure"]),
                    finding,
                    str(row.get("subject", "")),
                    int(row["pid"]) if row.get("pid") is not None else None,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return tuple(out)
