"""Progress read from a replica's output (issue 20): what the master forwards, how often,
from whom, and that the SDK's own reports come first."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from fakes import FakeBackend, FakeClock, make_master, settle

from trainguard.backends.interface import ReplicaOutput
from trainguard.master.loop import Master
from trainguard.master.output_progress import HINT_AFTER_S, OutputProgress
from trainguard.spec.progress import ProgressOptions


def _feeder(
    options: ProgressOptions | None = None, every_s: float = 0.5
) -> tuple[OutputProgress, list[tuple[str, int, dict[str, object]]], list[str]]:
    sent: list[tuple[str, int, dict[str, object]]] = []
    notes: list[str] = []
    progress = OutputProgress(
        options or ProgressOptions(),
        "worker-0",
        lambda r, s, m: sent.append((r, s, m)),
        lambda _r, text: notes.append(text),
        every_s=every_s,
    )
    return progress, sent, notes


def _out(t: float, *lines: str, replica: str = "worker-0", attempt: int = 0) -> ReplicaOutput:
    return ReplicaOutput(attempt, replica, 0, lines, t)


def test_steps_go_out_at_most_every_half_second_and_the_last_on_flush() -> None:
    progress, sent, _ = _feeder()
    for i in range(1, 11):  # ten steps in 0.45 s
        progress.feed(_out(i * 0.05, f"step {i} loss 0.{i}"))
    assert [s for _, s, _ in sent] == [1]
    progress.feed(_out(0.6, "step 11 loss 0.1"))
    assert [s for _, s, _ in sent] == [1, 11]
    progress.feed(_out(0.7, "step 12 loss 0.05"))
    progress.flush()  # the replica exited: its last step still counts
    assert [s for _, s, _ in sent] == [1, 11, 12]
    assert sent[-1][2] == {"loss": 0.05, "progress_from": "keyword"}


def test_a_new_run_sends_its_first_step_and_where_it_passes_the_old_one_at_once() -> None:
    """Goodput's "work lost" is the time a restarted run takes to pass the old one's step."""
    progress, sent, _ = _feeder()
    progress.feed(_out(1.0, "step 1 loss 1"))
    progress.feed(_out(1.1, "step 45 loss 1"))
    progress.flush()
    progress.feed(_out(1.2, "step 41 loss 1", attempt=1))  # resumed from step 40
    progress.feed(_out(1.25, "step 45 loss 1", attempt=1))
    progress.feed(_out(1.3, "step 46 loss 1", attempt=1))
    progress.feed(_out(1.35, "step 47 loss 1", attempt=1))
    assert [s for _, s, _ in sent] == [1, 45, 41, 46]


def test_only_the_source_replica_is_read() -> None:
    progress, sent, _ = _feeder()
    progress.feed(_out(1.0, "step 9 loss 1", replica="worker-1"))
    assert sent == []
    named, sent2, _ = _feeder(ProgressOptions(replica="worker-1"))
    named.feed(_out(1.0, "step 9 loss 1", replica="worker-1"))
    assert [(r, s) for r, s, _ in sent2] == [("worker-1", 9)]


def test_sdk_reports_come_first() -> None:
    progress, sent, _ = _feeder()
    progress.feed(_out(1.0, "step 1 loss 1"))
    progress.sdk_reported()
    progress.feed(_out(2.0, "step 2 loss 1"))
    progress.flush()
    assert [s for _, s, _ in sent] == [1]
    assert progress.step_of("worker-0") is None


def test_off_and_pattern() -> None:
    off, sent, _ = _feeder(ProgressOptions.model_validate("off"))
    off.feed(_out(1.0, "step 1 loss 1"))
    assert sent == [] and not off.enabled
    pattern = ProgressOptions.model_validate(r"batch (?P<step>\d+)")
    mine, sent2, _ = _feeder(pattern)
    mine.feed(_out(1.0, "step 1 loss 1", "batch 7"))
    assert [s for _, s, _ in sent2] == [7]


def test_a_reader_that_turns_off_says_so_once() -> None:
    progress, _, notes = _feeder()
    lines = ["step 10 loss 1", "step 3 loss 1", "step 20 loss 1", "step 2 loss 1"]
    for i, line in enumerate(lines * 2):
        progress.feed(_out(float(i), line))
    assert len(notes) == 1 and "went backwards 2 times" in notes[0]


async def _drain(m: Master) -> None:
    while not m._queue.empty():
        await m.step(m._queue.get_nowait())


def test_the_master_records_steps_from_output_and_injects_at_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make_master(tmp_path, be, fault_injection=["signal:worker-1:SIGKILL@step=3"])
        await m.begin()
        await _drain(m)
        be.print("worker-0", "step 1 loss 0.9", time_s=1.0)
        be.print("worker-1", "step 1 loss 0.9", time_s=1.0)  # not the source: not read
        be.print("worker-0", "step 3 loss 0.5", time_s=2.0)
        await _drain(m)
        rows = store.progress_of("job-1")
        assert [(r.attempt, r.step) for r in rows] == [(0, 1), (0, 3)]
        job = store.job("job-1")
        assert job.last_step == 3 and '"loss": 0.5' in str(job.last_metrics_json)
        await settle(m)  # the injection's task: the signal goes out
        assert ("worker-1", signal.SIGKILL) in be.signals
        await m.shutdown()
        assert ("worker-1", signal.SIGKILL) in be.signals  # step=3 read from the output

    asyncio.run(scenario())


def test_a_run_that_is_not_current_is_not_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make_master(tmp_path, be)
        await m.begin()
        await _drain(m)
        m.post(ReplicaOutput(5, "worker-0", 0, ("step 9 loss 1",), 1.0))  # a later attempt
        await _drain(m)
        assert store.progress_of("job-1") == []
        await m.shutdown()

    asyncio.run(scenario())


def test_a_hint_is_given_only_when_no_step_follows() -> None:
    clock = FakeClock()
    notes: list[str] = []
    summary = "┃   ┃ Name ┃ Type       ┃ Params ┃ Mode  ┃"

    def make() -> OutputProgress:
        return OutputProgress(
            ProgressOptions(),
            "worker-0",
            lambda *_: None,
            lambda _r, text: notes.append(text),
            clock.later,
        )

    silent = make()
    silent.feed(_out(1.0, summary))
    assert clock.pending() == [clock() + HINT_AFTER_S]
    clock.advance(HINT_AFTER_S - 0.1)
    assert notes == []
    clock.advance(0.1)
    assert len(notes) == 1 and "TQDMProgressBar" in notes[0]
    talking = make()
    talking.feed(_out(1.0, summary))
    talking.feed(_out(2.0, "Epoch 0:  10%|#         | 3/30 [00:00<00:00, 40.00it/s]"))
    clock.advance(HINT_AFTER_S * 2)
    assert len(notes) == 1  # a step came: no hint
