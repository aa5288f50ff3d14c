"""The pure readers of the machine's outputs, on recorded real ones (tests/fixtures/machine,
each line's source cited there)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from trainguard.classify.machine_parse import (
    disk_reading,
    gpu_readings,
    kernel_reading,
    kernel_readings,
    kmsg_record,
    nvidia_smi_failed,
    tail_storage_readings,
)
from trainguard.classify.readings import Finding, MachineReading, Source, from_json, to_json

FIXTURES = ROOT / "tests" / "fixtures" / "machine"


def _kernel_lines() -> list[tuple[int, str]]:
    out = []
    for line in (FIXTURES / "kernel_lines.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pid, _, text = line.partition(" | ")
            out.append((int(pid), text))
    return out


LINES = _kernel_lines()


def _line(start: str) -> tuple[int, str]:
    return next((pid, text) for pid, text in LINES if text.startswith(start))


@pytest.mark.parametrize(
    ("start", "finding", "subject", "sure"),
    [
        ("python3[20668]: segfault", Finding.SEGFAULT, "libc.so.6", True),
        ("oom-kill:constraint", Finding.OOM_KILL, "CONSTRAINT_MEMCG", True),
        ("Memory cgroup out of memory", Finding.OOM_KILL, "", True),
        ("Out of memory: Killed process 15784", Finding.OOM_KILL, "", True),
        ("traps: chrome", Finding.TRAP, "chrome", True),
        ("INFO: task python3:5604", Finding.HUNG_TASK, "", False),
        ("NVRM: Xid (PCI:0000:44:00): 79", Finding.XID, "79", True),
        ("NVRM: fallen off the bus", Finding.GPU_LOST, "", True),
        ("NVRM: Xid (PCI:0000:01:00): 31", Finding.XID, "31", False),  # most often the job's
        ("NVRM: Xid (PCI:0000:0a:00): 45", Finding.XID, "45", False),
        ("NVRM: Xid (PCI:0000:cb:00): 109", Finding.XID, "109", False),
    ],
)
def test_real_kernel_lines_read_as_what_they_say(
    start: str, finding: Finding, subject: str, sure: bool
) -> None:
    pid, text = _line(start)
    r = kernel_reading(text, {pid})
    assert r is not None
    assert (r.finding, r.subject, r.sure) == (finding, subject, sure)
    assert r.source == Source.KMSG and r.value == text


def test_lines_about_another_pid_say_nothing_of_ours() -> None:
    for pid, text in LINES:
        if pid:  # a line naming a pid names that one only
            assert kernel_reading(text, {pid + 1}) is None, text


def test_an_oom_kill_in_the_runs_cgroup_names_it_whatever_its_pid() -> None:
    _, text = _line("oom-kill:constraint")
    r = kernel_reading(text, {1}, cgroup="2b39c82872a12e385bf2c60a4ba38eb9/tgm-ooms")
    assert r is not None and r.finding is Finding.OOM_KILL and "own cgroup" in r.reading


def test_kmsg_records_since_the_run_began_only() -> None:
    pid, text = _line("python3[20668]: segfault")
    records = [f"3,100,5000000,-;{text}", f"3,101,9000000,-;{text}\n SUBSYSTEM=x", "junk"]
    assert kmsg_record(records[1]) == (9000000, text)
    assert kmsg_record("junk") is None
    assert len(kernel_readings(records, 6_000_000, {pid})) == 1  # the same line once
    assert kernel_readings(records, 10_000_000, {pid}) == []


def test_a_healthy_gpu_from_real_nvidia_smi_xml() -> None:
    (r,) = gpu_readings((FIXTURES / "nvidia-smi-q-x-p100.xml").read_text())
    assert (r.finding, r.reading, r.sure) == (Finding.NOTHING, "healthy", True)
    assert r.subject == "0000:04:00.0" and "Tesla P100" in r.value


def test_ecc_errors_and_pending_retirement_read_as_a_faulty_gpu() -> None:
    """The same real output with two of its counters as a failing GPU shows them."""
    xml = (FIXTURES / "nvidia-smi-q-x-p100.xml").read_text()
    volatile_dbe = "<double_bit>\n                    <device_memory>0</device_memory>"
    assert volatile_dbe in xml
    xml = xml.replace(
        "<total>0</total>\n                </double_bit>\n            </volatile>",
        "<total>2</total>\n                </double_bit>\n            </volatile>",
    )
    xml = xml.replace(
        "<pending_retirement>No</pending_retirement>",
        "<pending_retirement>Yes</pending_retirement>",
    )
    found = gpu_readings(xml)
    assert [r.finding for r in found] == [Finding.GPU_MEMORY, Finding.GPU_MEMORY]
    assert "2 uncorrectable ECC error(s)" in found[0].value
    assert all(r.sure and r.reading == "a faulty GPU" for r in found)


def test_recovery_action_and_unreadable_xml() -> None:
    action = "<gpu_recovery_action>Node Reboot Required</gpu_recovery_action>"
    xml = f"<nvidia_smi_log><gpu id='0000:3b:00.0'>{action}</gpu></nvidia_smi_log>"
    (r,) = gpu_readings(xml)
    assert r.finding is Finding.GPU_RESET and "Node Reboot Required" in r.value
    (bad,) = gpu_readings("<nvidia_smi_log")
    assert bad.finding is Finding.ABSENT and not bad.sure


def test_a_lost_gpu_from_nvidia_smis_own_failure() -> None:
    r = nvidia_smi_failed((FIXTURES / "nvidia-smi-gpu-lost.txt").read_text(), 15)
    assert (r.finding, r.sure, r.subject) == (Finding.GPU_LOST, True, "0000:02:00.0")
    other = nvidia_smi_failed("NVIDIA-SMI has failed because it couldn't communicate", 9)
    assert other.finding is Finding.ABSENT


@pytest.mark.parametrize(
    ("free", "size", "ro", "finding"),
    [
        (0, 4 << 20, False, Finding.DISK_FULL),  # a 4 MiB tmpfs, filled
        (30 << 10, 4 << 20, False, Finding.DISK_FULL),  # under 1% of it
        (1 << 20, 4 << 20, False, Finding.NOTHING),
        (63 << 20, 1 << 40, False, Finding.DISK_FULL),  # a big disk: under 64 MiB
        (10 << 30, 1 << 40, False, Finding.NOTHING),
        (10 << 30, 1 << 40, True, Finding.READ_ONLY),
    ],
)
def test_disk_readings(free: int, size: int, ro: bool, finding: Finding) -> None:
    r = disk_reading("/ckpt", free, size, ro)
    assert (r.finding, r.subject, r.sure) == (finding, "/ckpt", True)


def test_storage_errors_in_the_tail() -> None:
    tail = [
        "OSError: [Errno 28] No space left on device",
        "OSError: [Errno 30] Read-only file system: '/ckpt/x'",
        "step 3",
        "OSError: [Errno 5] Input/output error",
    ]
    found = {r.finding for r in tail_storage_readings(tail)}
    assert found == {Finding.DISK_FULL, Finding.READ_ONLY, Finding.IO_ERROR}
    assert tail_storage_readings(["step 1 loss 0.5"]) == []


def test_readings_round_trip_through_the_store_format() -> None:
    rs = (
        MachineReading(
            Source.KMSG, "x[1]: segfault", "a segfault", True, Finding.SEGFAULT, "libc.so.6", 1
        ),
        MachineReading(Source.GPU, "no nvidia-smi", "absent", False, Finding.ABSENT),
    )
    assert from_json(to_json(rs)) == rs
    assert to_json(()) is None and from_json(None) == ()
    assert from_json("not json") == () and from_json('[{"source": "kmsg"}, 3]') == ()
    assert rs[1].shown() == "gpu: no nvidia-smi -> absent (uncertain)"
