"""Stacks: parse py-spy and faulthandler dumps, group them, name the culprit; stragglers."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from trainguard.hangs.stack_model import Frame, ReplicaStacks, StackReport, ThreadStack
from trainguard.hangs.stack_parsers import parse_faulthandler, parse_py_spy_json
from trainguard.hangs.stacks import aggregate, in_collective, render
from trainguard.hangs.stragglers import straggler_report

PYSPY = ROOT / "tests" / "fixtures" / "pyspy"
SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def fixture_snaps(native: bool) -> list[ReplicaStacks]:
    """The real 2-rank DDP hang: rank 1 sleeps in _stall_forever, rank 0 waits in backward."""
    suffix = ".native.json" if native else ".json"
    return [
        snap(f"worker-{r}", r, parse_py_spy_json((PYSPY / f"ddp_hang_rank{r}{suffix}").read_text()))
        for r in (0, 1)
    ]


def snap(replica: str, rank: int, threads: tuple[ThreadStack, ...]) -> ReplicaStacks:
    return ReplicaStacks(replica, rank, 1000 + rank, "py-spy", True, None, 12.5, threads)


def py(name: str, filename: str, line: int) -> Frame:
    return Frame(name, filename, line, False)


def nat(name: str, lib: str = "/venv/lib/libtorch_cpu.so") -> Frame:
    return Frame(name, lib, None, True)


def main_thread(*frames: Frame, tid: int = 1) -> ThreadStack:
    return ThreadStack(tid, "MainThread", True, frames)


def in_all_reduce(line: int = 40) -> tuple[Frame, ...]:
    return (
        py("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2806),
        py("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
        py("train_step", "/home/u/train.py", line),
        py("<module>", "/home/u/train.py", 90),
    )


def in_barrier() -> tuple[Frame, ...]:
    return (
        py("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4159),
        py("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
        py("save_checkpoint", "/home/u/train.py", 60),
        py("<module>", "/home/u/train.py", 91),
    )


def helper(tid: int) -> ThreadStack:
    frames = (
        py("Condition.wait", f"{STDLIB}/threading.py", 327),
        py("_pin_memory_loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 51),
        py("Thread.run", f"{STDLIB}/threading.py", 982),
        py("Thread._bootstrap", f"{STDLIB}/threading.py", 1002),
    )
    return ThreadStack(tid, f"Thread-{tid}", False, frames)


# -- parsing ---------------------------------------------------------------------------


def test_parse_py_spy_native_marks_native_frames_and_drops_hex_noise() -> None:
    (thread,) = parse_py_spy_json((PYSPY / "ddp_hang_rank0.native.json").read_text())
    assert thread.thread_name == "MainThread"
    names = [f.name for f in thread.frames]
    assert not any(n.startswith("0x") for n in names)
    assert names[:3] == [
        "pthread_cond_wait",
        "std::condition_variable::wait",
        "c10d::Reducer::finalize_backward",
    ]
    reducer = thread.frames[2]
    assert (reducer.native, reducer.line) == (True, None)
    assert reducer.filename.endswith("libtorch_cpu.so")
    ddp_main = next(f for f in thread.frames if f.name == "main")
    assert (ddp_main.native, ddp_main.line) == (False, 105)


def test_parse_py_spy_names_the_main_thread_when_threading_was_never_imported() -> None:
    raw = [
        {
            "pid": 7,
            "thread_id": 99,
            "thread_name": None,
            "os_thread_id": 7,
            "active": True,
            "frames": [{"name": "f", "filename": "x.py", "module": None, "line": 3}],
        }
    ]
    (thread,) = parse_py_spy_json(json.dumps(raw))
    assert thread == ThreadStack(99, "MainThread", True, (Frame("f", "x.py", 3, False),))


FAULTHANDLER_TEXT = """\
Thread 0x00007fa3f99f86c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/home/u/train.py", line 5 in helper
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007fa3fa453b80 (most recent call first):
  File "/home/u/train.py", line 9 in stuck_here
  File "/home/u/train.py", line 10 in <module>
"""


def test_parse_faulthandler_text() -> None:
    helper_t, main_t = parse_faulthandler(FAULTHANDLER_TEXT)
    assert helper_t.thread_id == 0x00007FA3F99F86C0
    assert (helper_t.thread_name, helper_t.active) == (None, False)
    assert [f.name for f in helper_t.frames] == ["wait", "helper", "run", "_bootstrap"]
    assert (main_t.thread_name, main_t.active) == ("MainThread", True)
    assert main_t.frames[0] == Frame("stuck_here", "/home/u/train.py", 9, False)


def test_parse_faulthandler_keeps_the_last_of_several_dumps() -> None:
    second = FAULTHANDLER_TEXT.replace("line 9 in stuck_here", "line 12 in later")
    threads = parse_faulthandler(FAULTHANDLER_TEXT + "\n" + second)
    assert len(threads) == 2
    assert threads[1].frames[0].name == "later"


# -- state and culprit ------------------------------------------------------------------


def test_real_ddp_hang_with_native_frames_names_the_rank_outside_the_collective() -> None:
    report = aggregate(fixture_snaps(native=True))
    r0, r1 = report.replicas
    assert (r0.state, r0.culprit) == ("communication", False)
    assert "c10d::Reducer::finalize_backward" in r0.reason
    assert (r1.state, r1.culprit) == ("computation", True)
    assert report.culprits == ("worker-1",)
    assert report.summary == (
        "computation hang: worker-1 is stuck outside any collective in _stall_forever "
        "(ddp_train.py:73) while 1 peer waits in c10d::Reducer::finalize_backward"
    )


def test_real_ddp_hang_with_python_frames_only_names_the_culprit_as_likely() -> None:
    """Rank 0's Python stack stops in torch/autograd (DDP's all-reduce runs in C++ hooks):
    it may be computing gradients or waiting for them, so its state is "unknown". With
    every other rank in backward and one in the user's own code, that one is the likely
    culprit, and the summary says the native frames were missing."""
    snaps = fixture_snaps(native=False)
    report = aggregate(snaps)
    r0, r1 = report.replicas
    assert r0.state == "unknown" and "autograd backward" in r0.reason
    assert r1.state == "computation"
    assert report.culprits == ("worker-1",)
    assert report.summary.startswith("likely computation hang: worker-1 is outside torch")
    assert "no native frames" in report.summary


def test_in_collective_reads_the_innermost_frames() -> None:
    assert in_collective(main_thread(*in_all_reduce()))
    waits_natively = (
        nat("pthread_cond_wait", "/lib/libc.so.6"),
        nat("c10d::ProcessGroupNCCL::WorkNCCL::wait"),
    )
    assert in_collective(main_thread(*waits_natively, py("train_step", "/home/u/train.py", 40)))
    # Model code run from FSDP's forward computes, although FSDP lives in torch/distributed.
    fsdp = py("forward", f"{SITE}/torch/distributed/fsdp/fully_sharded_data_parallel.py", 850)
    assert not in_collective(
        main_thread(py("forward", f"{SITE}/torch/nn/modules/linear.py", 125), fsdp)
    )
    assert not in_collective(
        main_thread(py("broadcast_tensors", f"{SITE}/torch/functional.py", 77))
    )


def test_all_in_the_same_collective_names_no_culprit() -> None:
    snaps = [snap(f"w{r}", r, (main_thread(*in_all_reduce()),)) for r in range(4)]
    report = aggregate(snaps)
    assert report.culprits == ()
    assert report.summary.startswith(
        "no culprit: all 4 ranks wait in the same collective, all_reduce"
    )
    assert len(report.groups) == 1 and report.groups[0].count == 4


def test_the_only_rank_in_a_different_collective_is_the_culprit() -> None:
    snaps = [snap(f"w{r}", r, (main_thread(*in_all_reduce()),)) for r in range(3)]
    snaps.append(snap("w3", 3, (main_thread(*in_barrier()),)))
    report = aggregate(snaps)
    assert report.culprits == ("w3",)
    assert report.replicas[3].reason == "the only rank in a different collective"
    assert report.summary.startswith("collective mismatch: w3 is the only rank in a different")


def test_same_collective_on_another_line_is_a_different_collective() -> None:
    snaps = [snap(f"w{r}", r, (main_thread(*in_all_reduce(line=40)),)) for r in range(3)]
    snaps.append(snap("w3", 3, (main_thread(*in_all_reduce(line=44)),)))
    assert aggregate(snaps).culprits == ("w3",)


def test_two_ranks_in_different_collectives_cannot_be_told_apart() -> None:
    snaps = [
        snap("w0", 0, (main_thread(*in_all_reduce()),)),
        snap("w1", 1, (main_thread(*in_barrier()),)),
    ]
    assert aggregate(snaps).culprits == ()


def test_a_failed_stack_dump_is_unknown() -> None:
    failed = ReplicaStacks("w1", 1, 1001, "py-spy", False, "cannot attach", 3.0, ())
    report = aggregate([snap("w0", 0, (main_thread(*in_all_reduce()),)), failed])
    assert report.replicas[1].state == "unknown"
    assert report.replicas[1].reason == "stack dump failed: cannot attach"
    assert report.culprits == ()


def test_grouping_across_8_replicas_with_identical_helper_threads() -> None:
    snaps = []
    for r in range(8):
        main = in_barrier() if r == 5 else in_all_reduce()
        snaps.append(snap(f"w{r}", r, (helper(10 + r), main_thread(*main, tid=r), helper(20 + r))))
    report = aggregate(snaps)
    assert report.culprits == ("w5",)
    by_top = {g.frames[0].name: g for g in report.groups}
    assert set(by_top) == {"barrier", "all_reduce", "Condition.wait"}
    helpers = by_top["Condition.wait"]
    assert (helpers.count, len(helpers.replicas), helpers.unique) == (16, 8, False)
    reduce = by_top["all_reduce"]
    assert (reduce.count, reduce.unique) == (7, False)
    assert ("w5", 5) not in reduce.members and ("w0", 0) in reduce.members
    barrier = by_top["barrier"]
    assert (barrier.count, barrier.replicas, barrier.unique) == (1, ("w5",), True)
    assert report.groups == (barrier, reduce, helpers)  # culprit, main threads, helpers


def test_user_line_numbers_count_but_library_ones_do_not() -> None:
    a = in_all_reduce()
    b = (py("all_reduce", a[0].filename, 9999), *a[1:])
    report = aggregate([snap("w0", 0, (main_thread(*a),)), snap("w1", 1, (main_thread(*b),))])
    assert len(report.groups) == 1


def test_report_round_trips_through_json() -> None:
    report = aggregate(fixture_snaps(native=True), {"worker-0": "ok"})
    again = StackReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    for s in fixture_snaps(native=True):
        assert ReplicaStacks.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_a_report_stored_before_pace_had_its_name_reads_back() -> None:
    """Reports stored before issue 39 call a replica's pace "progress"."""
    report = aggregate(fixture_snaps(native=True), {"worker-0": "stuck"})
    stored = report.to_dict()
    for d in stored["replicas"]:
        d["progress"] = d.pop("pace")
    again = StackReport.from_dict(json.loads(json.dumps(stored)))
    assert [d.pace for d in again.replicas] == [d.pace for d in report.replicas]
    assert "stuck" in [d.pace for d in again.replicas]


def test_render_marks_the_culprit() -> None:
    text = render(aggregate(fixture_snaps(native=True)))
    lines = text.splitlines()
    assert lines[0].startswith("computation hang: worker-1")
    culprit_row = next(ln for ln in lines if ln.lstrip().startswith("worker-1"))
    assert ">>> culprit" in culprit_row
    header = next(ln for ln in lines if ln.startswith(">>> culprit"))
    assert "worker-1" in header and "(unique)" in header
    stack = lines[lines.index(header) + 1 :]
    assert stack[0] == "    clock_nanosleep  [native libc.so.6]"
    assert stack[2] == "    _stall_forever  /work/main/examples/ddp_train.py:73"
    assert "    c10d::Reducer::finalize_backward  [native libtorch_cpu.so]" in lines
    assert sum(ln.startswith(">>> culprit") for ln in lines) == 1


# -- stragglers from heartbeats ---------------------------------------------------------


def steady(steps: int, step_s: float, start_s: float = 0.0) -> list[tuple[int, float]]:
    return [(s, start_s + s * step_s) for s in range(1, steps + 1)]


def test_straggler_report_ok_when_all_keep_pace() -> None:
    beats = {"a": steady(10, 1.0), "b": steady(10, 1.05), "c": steady(10, 0.95)}
    assert straggler_report(beats, now_s=10.6) == {"a": "ok", "b": "ok", "c": "ok"}


def test_straggler_report_stuck_when_it_stopped_while_others_advanced() -> None:
    beats = {"a": steady(20, 1.0), "b": steady(20, 1.0), "c": steady(12, 1.0)}
    assert straggler_report(beats, now_s=20.5) == {"a": "ok", "b": "ok", "c": "stuck"}


def test_straggler_report_repeated_beats_on_one_step_are_not_progress() -> None:
    frozen = [*steady(5, 1.0), *((5, 5.0 + k) for k in range(1, 15))]  # beats, no steps
    beats = {"a": steady(20, 1.0), "b": frozen}
    assert straggler_report(beats, now_s=20.2) == {"a": "ok", "b": "stuck"}


def test_straggler_report_slow_against_the_others_median() -> None:
    beats = {"a": steady(20, 1.0), "b": steady(20, 1.1), "c": steady(8, 3.0)}
    assert straggler_report(beats, now_s=24.5)["c"] == "slow"
    # With two replicas one can still be slow: it is compared with the other alone.
    assert straggler_report({"a": steady(20, 1.0), "c": steady(8, 3.0)}, now_s=24.5) == {
        "a": "ok",
        "c": "slow",
    }


def test_straggler_report_one_step_behind_by_jitter_is_ok_and_no_beats_is_absent() -> None:
    beats = {"a": steady(11, 1.0), "b": steady(10, 1.0, start_s=0.4), "c": []}
    assert straggler_report(beats, now_s=11.2) == {"a": "ok", "b": "ok"}


@pytest.mark.parametrize("now_s", [3.0, 30.0])
def test_straggler_report_all_stopped_together_is_no_straggler(now_s: float) -> None:
    beats = {"a": steady(3, 1.0), "b": steady(3, 1.0)}
    assert straggler_report(beats, now_s) == {"a": "ok", "b": "ok"}


# The deadlock at exit of a gloo DDP rank, as py-spy --native showed it on this machine
# (8 ranks of examples/ddp_train.py with torch._dynamo imported before init_process_group;
# the frames as dumped, innermost first, libc addresses left out).
LIBTORCH_PY = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so"
EXIT_MAIN = (
    nat("std::thread::join", "/usr/lib/libstdc++.so.6.0.30"),
    nat("c10d::ProcessGroupGloo::~ProcessGroupGloo"),
    nat("c10d::ProcessGroupGloo::~ProcessGroupGloo"),
    nat("c10d::ProcessGroup::~ProcessGroup"),
    nat("c10d::ProcessGroup::~ProcessGroup"),
    nat("c10d::Reducer::~Reducer"),
    nat("std::_Sp_counted_base<(__gnu_cxx::_Lock_policy)2>::_M_release", LIBTORCH_PY),
    nat("pybind11::detail::clear_instance", LIBTORCH_PY),
    nat("pybind11_object_dealloc", LIBTORCH_PY),
    py("<module>", "/work/examples/ddp_train.py", 172),
)
EXIT_WORKER = (
    nat("pthread_cond_timedwait", "/usr/lib/libc.so.6"),
    nat("pybind11::gil_scoped_acquire::gil_scoped_acquire", LIBTORCH_PY),
    nat("torch::detail::(anonymous namespace)::ConcretePyInterpreterVTable::decref", LIBTORCH_PY),
    nat("at::ThreadLocalState::~ThreadLocalState"),
    nat("c10d::ProcessGroupGloo::AsyncWork::~AsyncWork"),
    nat("c10d::AsyncAllreduceWork::~AsyncAllreduceWork"),
    nat("c10d::ProcessGroupGloo::runLoop"),
)


def test_a_rank_deadlocked_in_gloo_teardown_is_named_with_the_torch_bug() -> None:
    stuck = snap("worker-3", 3, (main_thread(*EXIT_MAIN), ThreadStack(2, None, False, EXIT_WORKER)))
    done = snap("worker-0", 0, (main_thread(*in_barrier()),))
    report = aggregate([done, stuck])
    assert report.culprits == ("worker-3",)
    assert report.summary.startswith("deadlock in torch: worker-3 is stuck destroying a gloo")
    assert "pytorch/pytorch#56297" in report.summary
    # the same teardown with no worker waiting for the GIL is not that deadlock
    joining = snap("worker-3", 3, (main_thread(*EXIT_MAIN),))
    assert "deadlock in torch" not in aggregate([done, joining]).summary
