"""The pure weighing of the machine's readings (classify.machine): what each does to the
log's verdict, and how `explain` shows them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.classify.machine_parse import (
    disk_reading,
    kernel_reading,
    kernel_readings,
    tail_storage_readings,
)
from trainguard.classify.readings import Finding, MachineReading, Source, to_json
from trainguard.records.explain import print_explain

SEGV = (
    "python3[4242]: segfault at 0 ip 00007fb258f85ad8 sp 00007fff610f93f8 error 4 "
    "in libc.so.6[167ad8,7fb258e44000+156000] likely on CPU 0 (core 0, socket 0)"
)
OOM = "Out of memory: Killed process 4242 (python3) total-vm:11964kB, anon-rss:4288kB"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
NOTHING_KMSG = MachineReading(Source.KMSG, "/dev/kmsg: no line about pid 4242", "nothing", True)
NO_OOM = MachineReading(Source.CGROUP, "memory.oom_control: oom_kill 0 -> 0", "no OOM kill", True)
ABSENT = (
    MachineReading(Source.KMSG, "/dev/kmsg: cannot open", "absent", False, Finding.ABSENT),
    MachineReading(Source.CGROUP, "no counter", "absent", False, Finding.ABSENT),
)


def kmsg(line: str) -> MachineReading:
    r = kernel_reading(line, {4242})
    assert r is not None
    return r


def ev(code: int, *machine: MachineReading, tail: tuple[str, ...] = ()) -> ExitEvidence:
    return ExitEvidence("worker-0", code, log_tail=tail, machine=machine)


def test_no_readings_change_nothing() -> None:
    for code, tail in ((-9, ()), (-11, ("step 3",)), (1, ("KeyError: 'x'",))):
        c = classify_exit(ev(code, tail=tail))
        assert c.readings == ()


def test_the_kernels_oom_kill_of_the_pid_is_a_sure_host_oom() -> None:
    """No cgroup limit of its own, so no counter rose: the kernel log names it."""
    before = classify_exit(ev(-9))
    assert before.failure_class is FailureClass.PREEMPTION  # the log alone: a kill
    c = classify_exit(ev(-9, kmsg(OOM), NO_OOM))
    assert (c.failure_class, c.retryable, c.rule) == (
        FailureClass.HOST_OOM,
        False,
        "host-oom-kernel",
    )
    assert c.confidence == 0.99 and c.matched_line == OOM
    assert "ran out of memory" in c.message
    origin = next(r for r in c.readings if r.source == Source.SIGNAL)
    assert (origin.finding, origin.sure) == (Finding.SENT_BY_KERNEL, True)


def test_a_segfault_stays_one_with_its_library_named() -> None:
    c = classify_exit(ev(-11, kmsg(SEGV), tail=("step 3 loss 0.1",)))
    assert c.failure_class is FailureClass.TRANSIENT_EXIT and c.retryable
    assert c.reason == "SIGSEGV: a segfault in libc.so.6"
    assert c.message.endswith("Termination reason: SIGSEGV: a segfault in libc.so.6.")
    other = kmsg(SEGV.replace("libc.so.6", "libnccl.so.2"))
    assert classify_exit(ev(-11, other)).fingerprint != c.fingerprint  # another library


def test_an_xid_79_is_hardware_sure() -> None:
    c = classify_exit(ev(-6, kmsg(XID79)))
    assert (c.failure_class, c.retryable, c.hardware) == (
        FailureClass.RETRYABLE_MESSAGE,
        True,
        True,
    )
    assert c.confidence == 0.95 and c.matched_line == XID79 and "fell" not in c.rule


def test_a_full_checkpoint_path_stops_and_says_what_to_free() -> None:
    tail = ("Traceback (most recent call last):", "OSError: [Errno 28] No space left on device")
    full = disk_reading("/ckpt", 0, 4 << 20, False)
    c = classify_exit(ev(1, full, *tail_storage_readings(tail), tail=tail))
    assert (c.failure_class, c.retryable, c.rule) == (FailureClass.USER_ERROR, False, "disk-full")
    assert not c.uncertain  # retry_uncertain gives it no retry either
    assert "Free space on /ckpt" in c.message and c.reason == "/ckpt is full"
    ro = disk_reading("/ckpt", 1 << 30, 1 << 40, True)
    tail_ro = ("OSError: [Errno 30] Read-only file system: '/ckpt/x'",)
    c = classify_exit(ev(1, ro, *tail_storage_readings(tail_ro), tail=tail_ro))
    assert (c.rule, c.retryable) == ("read-only-storage", False)
    assert "Make /ckpt writable" in c.message


def test_a_bug_on_a_disk_that_is_also_full_stays_a_bug() -> None:
    tail = ("Traceback (most recent call last):", "KeyError: 'boom'")
    c = classify_exit(ev(1, disk_reading("/logs", 0, 4 << 20, False), tail=tail))
    assert c.rule != "disk-full" and c.failure_class is FailureClass.USER_ERROR


@pytest.mark.parametrize("tail", [(), ("Killed",)])
def test_a_kill_with_no_oom_anywhere_is_an_external_kill(tail: tuple[str, ...]) -> None:
    """With the kernel log and the cgroup read and silent, neither a bare SIGKILL nor the
    shell's `Killed` is an OOM: someone else sent it. Retried: a bare SIGKILL as surely as
    the log alone read it (a preemption-like kill may come again), the shell's `Killed`,
    which the log read as the OOM killer's, uncertain (once)."""
    c = classify_exit(ev(-9, NOTHING_KMSG, NO_OOM, tail=tail))
    assert (c.failure_class, c.retryable, c.rule) == (
        FailureClass.PREEMPTION,
        True,
        "external-kill",
    )
    assert c.uncertain is bool(tail)
    origin = next(r for r in c.readings if r.source == Source.SIGNAL)
    assert origin.shown() == (
        "signal: SIGKILL (exit status 137) -> sent by another process "
        "(no OOM kill in the kernel log or the cgroup) (uncertain)"
    )


def test_with_nothing_readable_the_log_verdict_stands() -> None:
    tail = ("Killed",)
    c = classify_exit(ev(-9, *ABSENT, tail=tail))
    assert c.rule == classify_exit(ev(-9, tail=tail)).rule
    assert c.failure_class is FailureClass.HOST_OOM  # the shell's `Killed`, unrefuted
    origin = next(r for r in c.readings if r.source == Source.SIGNAL)
    assert origin.finding is Finding.ABSENT and "not ruled out" in origin.reading


def test_a_stop_carries_its_readings_and_changes_nothing() -> None:
    e = replace(ev(-15, NOTHING_KMSG), stop_requested=True)
    c = classify_exit(e)
    assert c.failure_class is None and c.readings == (NOTHING_KMSG,)


def test_explain_shows_each_reading(capsys: pytest.CaptureFixture[str]) -> None:
    c = classify_exit(ev(-11, kmsg(SEGV), *ABSENT[1:]))
    job = {"id": "j", "name": "n", "state": "FAILED", "attempts": 1, "error_message": None}
    row = {
        "attempt": 0,
        "replica": "worker-0",
        "root_cause": True,
        "cascade_of": None,
        "failure_class": "transient_exit",
        "retryable": True,
        "rule": c.rule,
        "matched_line": None,
        "confidence": c.confidence,
        "phase": "training",
        "fingerprint": c.fingerprint,
        "message": c.message,
        "decision": "RestartJob",
        "notes": "\n".join(c.notes),
        "machine": to_json(c.readings),
    }
    print_explain(job, [row])
    out = capsys.readouterr().out
    assert f"    machine      kmsg: {SEGV} -> a segfault at address 0 in libc.so.6 (sure)" in out
    assert "    machine      cgroup: no counter -> absent (uncertain)" in out


def test_an_oom_kill_of_another_pid_keeps_a_launchers_kill_an_oom() -> None:
    """torchrun's child has a pid of its own: an OOM kill of it in the kernel log, with the
    launcher reporting its child SIGKILLed, is no external kill."""
    other = kernel_readings(
        ["6,1,5000000,-;Out of memory: Killed process 777 (python3) total-vm:1kB"], 0, {4242}
    )
    assert [(r.finding, r.sure, r.pid) for r in other] == [(Finding.OOM_KILL, False, 777)]
    tail = ("torch.distributed.elastic.multiprocessing.api: failed (exitcode: -9)",)
    c = classify_exit(ev(-9, *other, NO_OOM, tail=tail))
    assert c.rule != "external-kill"
    origin = next(r for r in c.readings if r.source == Source.SIGNAL)
    assert (origin.finding, origin.sure) == (Finding.SENT_BY_KERNEL, False)


def test_a_cgroup_alone_does_not_rule_out_a_global_oom_kill() -> None:
    """No kernel log: a kill by the node's OOM killer would show in no cgroup counter."""
    c = classify_exit(ev(-9, ABSENT[0], NO_OOM))
    assert c.rule == "external-SIGKILL" and not c.uncertain  # the log's verdict stands
    origin = next(r for r in c.readings if r.source == Source.SIGNAL)
    assert origin.finding is Finding.ABSENT and "not ruled out" in origin.reading


def test_an_oom_in_its_own_limit_names_the_limit_in_the_message() -> None:
    own = MachineReading(
        Source.CGROUP,
        "/sys/fs/cgroup/memory/tg/run-1/memory.oom_control: oom_kill 1; limit 67108864 bytes",
        "the kernel's OOM killer killed a process of the replica's own cgroup, held to its "
        "resources.memory of 64 MiB",
        True,
        Finding.OOM_KILL,
    )
    c = classify_exit(ev(-9, own))
    assert c.failure_class is FailureClass.HOST_OOM and c.confidence == 0.99
    assert c.message.endswith("It was held to its resources.memory of 64 MiB.")
    assert "resources.memory" not in classify_exit(ev(-9, kmsg(OOM), NO_OOM)).message
