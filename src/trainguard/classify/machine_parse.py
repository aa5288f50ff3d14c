"""Pure readers of what the machine says (R-EVID-1): kernel log records, `nvidia-smi -q -x`
XML, a path's `statvfs` numbers and a replica's last lines become `MachineReading`s. No
file, process or clock: the probes (`backends.machine_probe`) hand the raw text in, and
the tests hand in recorded real outputs (tests/fixtures/machine)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable

from trainguard.classify.readings import Finding, MachineReading, Source

# ---------------------------------------------------------------- the kernel log


def kmsg_record(raw: str) -> tuple[int, str] | None:
    """(microseconds since boot, text) of one /dev/kmsg record `pri,seq,usec,flags;text`
    (continuation lines, ` KEY=value`, dropped); None for what is not one."""
    head, sep, text = raw.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not fields[2].isdigit():
        return None
    return int(fields[2]), text.split("\n", 1)[0]


_OOM = re.compile(
    r"(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: "
    r"Kill(?:ed)? process (\d+) \(([^)]*)\)"
)
_OOM_CONSTRAINT = re.compile(
    r"oom-kill:constraint=(\w+),.*?task_memcg=([^,]*),task=([^,]*),pid=(\d+)"
)
_SEGV = re.compile(r"^(.*?)\[(\d+)\]: segfault at (\S+) ip \S+ sp \S+ error \S+(?: in ([^\[\s]+))?")
_TRAP = re.compile(
    r"traps: (.*?)\[(\d+)\] (.+?) ip[: ]\S+ sp[: ]\S+ error[: ]\S+(?:\s+in ([^\[\s]+))?"
)
_HUNG = re.compile(r"INFO: task (.+):(\d+) blocked for more than (\d+) seconds")
_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+), (?:pid=('?[^,]*'?), )?(?:name=([^,]*), )?(.*)"
)
_OFF_BUS = re.compile(r"NVRM: (?:.*GPU (?:at PCI:)?([0-9A-Fa-f:.]+))?.*fallen off the bus")

HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})
"""Xids NVIDIA's own table reads as the device's (uncorrectable ECC, row remapping,
NVLink, a GPU off the bus, GSP errors), not the application's: 13, 31 and 43 are most
often the job's own bad access, so they are not here."""


def kernel_reading(
    text: str, pids: Collection[int], cgroup: str | None = None
) -> MachineReading | None:
    """What one kernel log line says about the processes `pids` (or the cgroup whose path
    ends in `cgroup`), or None when it says nothing about them."""
    m = _OOM_CONSTRAINT.search(text)
    if m and (int(m.group(4)) in pids or (cgroup and m.group(2).endswith(cgroup))):
        where = (
            "its own cgroup's limit" if m.group(1) == "CONSTRAINT_MEMCG" else "the node's memory"
        )
        return MachineReading(
            Source.KMSG,
            text,
            f"the kernel's OOM killer chose it ({where})",
            True,
            Finding.OOM_KILL,
            m.group(1),
            int(m.group(4)),
        )
    m = _OOM.search(text)
    if m and int(m.group(1)) in pids:
        scope = (
            "its memory cgroup's limit" if "Memory cgroup" in text else "the node ran out of memory"
        )
        return MachineReading(
            Source.KMSG,
            text,
            f"killed by the kernel's OOM killer ({scope})",
            True,
            Finding.OOM_KILL,
            "",
            int(m.group(1)),
        )
    m = _SEGV.search(text)
    if m and int(m.group(2)) in pids:
        lib = m.group(4) or ""
        where = f" in {lib}" if lib else ""
        return MachineReading(
            Source.KMSG,
            text,
            f"a segfault at address {m.group(3)}{where}",
            True,
            Finding.SEGFAULT,
            lib,
            int(m.group(2)),
        )
    m = _TRAP.search(text)
    if m and int(m.group(2)) in pids:
        lib = m.group(4) or ""
        return MachineReading(
            Source.KMSG,
            text,
            f"a CPU trap: {m.group(3)}" + (f" in {lib}" if lib else ""),
            True,
            Finding.TRAP,
            lib,
            int(m.group(2)),
        )
    m = _HUNG.search(text)
    if m and int(m.group(2)) in pids:
        return MachineReading(
            Source.KMSG,
            text,
            f"stuck in the kernel for over {m.group(3)} s (uninterruptible: I/O or a driver)",
            False,
            Finding.HUNG_TASK,
            "",
            int(m.group(2)),
        )
    return _gpu_line(text, pids)


def _gpu_line(text: str, pids: Collection[int]) -> MachineReading | None:
    m = _XID.search(text)
    if m:
        code = int(m.group(2))
        pid_text = (m.group(3) or "").strip("'")
        pid = int(pid_text) if pid_text.isdigit() else None
        if pid is not None and pid not in pids:
            return None  # another process's channel: its own fault
        hardware = code in HARDWARE_XIDS
        what = "a GPU hardware fault" if hardware else "a GPU fault, most often the job's own"
        return MachineReading(
            Source.KMSG,
            text,
            f"Xid {code} on {m.group(1)}: {what}",
            hardware and (pid is not None or code in (48, 79)),
            Finding.XID,
            str(code),
            pid,
        )
    m = _OFF_BUS.search(text)
    if m:
        return MachineReading(
            Source.KMSG,
            text,
            f"the GPU{' at ' + m.group(1) if m.group(1) else ''} fell off the bus",
            True,
            Finding.GPU_LOST,
            m.group(1) or "",
        )
    return None


def kernel_readings(
    records: Iterable[str], since_us: int, pids: Collection[int], cgroup: str | None = None
) -> list[MachineReading]:
    """The readings of the /dev/kmsg `records` logged at or after `since_us`; an OOM kill
    of a process it does not name (a launcher's child has a pid of its own) is kept as an
    uncertain reading: the kernel was killing for memory on this node meanwhile."""
    out: list[MachineReading] = []
    others = 0
    for raw in records:
        rec = kmsg_record(raw)
        if rec is None or rec[0] < since_us:
            continue
        found = kernel_reading(rec[1], pids, cgroup)
        if found is None and others < _OTHER_OOMS:
            found = _other_oom(rec[1])
            others += found is not None
        if found is not None and found not in out:
            out.append(found)
    return out


_OTHER_OOMS = 3  # kept at most: the first tell enough


def _other_oom(text: str) -> MachineReading | None:
    m = _OOM.search(text)
    if m is None:
        return None
    reading = f"the OOM killer killed pid {m.group(1)} ({m.group(2)}) on this node meanwhile"
    return MachineReading(
        Source.KMSG, text, reading, False, Finding.OOM_KILL, "another process", int(m.group(1))
    )


# ---------------------------------------------------------------- GPUs


def _int(node: ET.Element | None, path: str) -> int:
    found = node.findtext(path) if node is not None else None
    try:
        return int((found or "").split()[0])
    except (ValueError, IndexError):
        return 0  # N/A: the GPU does not count it


def _yes(node: ET.Element, path: str) -> bool:
    return (node.findtext(path) or "").strip().lower() == "yes"


def gpu_readings(xml_text: str) -> list[MachineReading]:
    """Each GPU's health from `nvidia-smi -q -x`: uncorrectable ECC errors since the driver
    loaded, pages pending retirement, rows remapped or failing, NVML's recovery action."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        return [
            MachineReading(
                Source.GPU,
                f"nvidia-smi -q -x: unreadable XML ({exc})",
                "absent",
                False,
                Finding.ABSENT,
            )
        ]
    out: list[MachineReading] = []
    for gpu in root.iter("gpu"):
        bus = gpu.get("id", "?")
        volatile = gpu.find("ecc_errors/volatile")
        dbe = _int(volatile, "double_bit/total") + _int(volatile, "dram_uncorrectable")
        dbe += _int(volatile, "sram_uncorrectable") + _int(volatile, "sram_uncorrectable_secded")
        bad: list[tuple[str, Finding]] = []
        if dbe:
            bad.append(
                (f"{dbe} uncorrectable ECC error(s) since the driver loaded", Finding.GPU_MEMORY)
            )
        if _yes(gpu, "retired_pages/pending_retirement") or _yes(
            gpu, "retired_pages/pending_blacklist"
        ):
            bad.append(
                ("memory pages pending retirement (a reset retires them)", Finding.GPU_MEMORY)
            )
        if _yes(gpu, "remapped_rows/remapped_row_pending"):
            bad.append(("memory rows pending remapping (a reset remaps them)", Finding.GPU_MEMORY))
        if _yes(gpu, "remapped_rows/remapped_row_failure"):
            bad.append(("a memory row remapping failed", Finding.GPU_MEMORY))
        action = (gpu.findtext("gpu_recovery_action") or "").strip()
        if action and action.lower() not in ("none", "n/a"):
            bad.append((f"NVML's recovery action: {action}", Finding.GPU_RESET))
        if _yes(gpu, "gpu_reset_status/reset_required"):
            bad.append(("NVML says it needs a reset", Finding.GPU_RESET))
        name = gpu.findtext("product_name") or "GPU"
        for what, finding in bad:
            out.append(
                MachineReading(
                    Source.GPU, f"{name} {bus}: {what}", "a faulty GPU", True, finding, bus
                )
            )
        if not bad:
            out.append(
                MachineReading(
                    Source.GPU,
                    f"{name} {bus}: no ECC error, nothing pending",
                    "healthy",
                    True,
                    Finding.NOTHING,
                    bus,
                )
            )
    if not out:
        out.append(
            MachineReading(
                Source.GPU, "nvidia-smi -q -x lists no GPU", "no GPU seen", False, Finding.NOTHING
            )
        )
    return out


_LOST = re.compile(
    r"Unable to determine the device handle for GPU ?([0-9A-Fa-f]+:[0-9A-Fa-f:]+\.[0-9A-Fa-f]+)?"
    r"|GPU is lost|GPU has fallen off the bus"
)


def nvidia_smi_failed(output: str, code: int) -> MachineReading:
    """What nvidia-smi's own failure says: a lost GPU, or only that it failed."""
    first = next((x.strip() for x in output.splitlines() if x.strip()), f"exit status {code}")
    m = _LOST.search(output)
    if m:
        return MachineReading(
            Source.GPU,
            f"nvidia-smi: {first}",
            "a GPU vanished (lost by the driver)",
            True,
            Finding.GPU_LOST,
            m.group(1) or "",
        )
    return MachineReading(
        Source.GPU, f"nvidia-smi failed: {first}", "absent", False, Finding.ABSENT
    )


# ---------------------------------------------------------------- storage

FULL_BELOW_BYTES = 64 * 1024 * 1024
FULL_BELOW_FRACTION = 0.01


def disk_reading(path: str, free_bytes: int, size_bytes: int, read_only: bool) -> MachineReading:
    """A path's free space and mount state: full under min(64 MiB, 1% of its size)."""
    value = f"{path}: {_size(free_bytes)} free of {_size(size_bytes)}" + (
        ", read-only" if read_only else ""
    )
    if read_only:
        return MachineReading(
            Source.DISK, value, "mounted read-only", True, Finding.READ_ONLY, path
        )
    if free_bytes < min(FULL_BELOW_BYTES, FULL_BELOW_FRACTION * size_bytes):
        return MachineReading(Source.DISK, value, "full", True, Finding.DISK_FULL, path)
    return MachineReading(Source.DISK, value, "room left", True, Finding.NOTHING, path)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n:.1f} TiB"


_STORAGE_ERRORS = (
    (
        re.compile(r"No space left on device|\[Errno 28\]|\bENOSPC\b"),
        Finding.DISK_FULL,
        "a write found the disk full (ENOSPC)",
    ),
    (
        re.compile(r"Read-only file system|\[Errno 30\]|\bEROFS\b"),
        Finding.READ_ONLY,
        "a write found a read-only file system (EROFS)",
    ),
    (
        re.compile(r"Input/output error|\[Errno 5\]|\bEIO\b"),
        Finding.IO_ERROR,
        "the storage failed a read or write (EIO)",
    ),
)


def tail_storage_readings(lines: Iterable[str]) -> list[MachineReading]:
    """ENOSPC, EROFS and EIO in a replica's last lines: the newest line of each."""
    found: dict[Finding, MachineReading] = {}
    for line in lines:
        for pattern, finding, what in _STORAGE_ERRORS:
            if pattern.search(line):
                text = line.strip()
                text = text if len(text) <= 200 else text[:197] + "..."
                found[finding] = MachineReading(Source.TAIL, text, what, True, finding)
    return list(found.values())
