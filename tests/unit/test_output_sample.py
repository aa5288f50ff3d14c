"""Progress reading never holds a chatty replica back (issue 37): the master reads a
bounded sample of its output, and no line costs more than linear time to read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainguard.backends.output import SAMPLE_BURST, SAMPLE_BYTES_S, RunOutput
from trainguard.classify.logtail import MAX_LINE
from trainguard.classify.progress_text import ProgressReader


def _output(tmp_path: Path) -> tuple[RunOutput, list[str], list[float]]:
    now = [0.0]
    got: list[str] = []
    out = RunOutput(
        "worker-0", tmp_path / "w0.log", None, lambda _f, s: got.extend(s), clock=lambda: now[0]
    )
    return out, got, now


def _lines(first: int, count: int, size: int = 1024) -> bytes:
    def one(i: int) -> str:
        head = f"step {i} loss 0.5 "
        return head + "x" * (size - 1 - len(head)) + "\n"

    return "".join(one(i) for i in range(first, first + count)).encode()


def test_a_chatty_replica_is_read_as_a_bounded_sample_of_whole_newest_lines(
    tmp_path: Path,
) -> None:
    out, got, now = _output(tmp_path)
    data = _lines(0, 8192)  # 8 MiB of 1 KiB lines at 50 MB/s
    for at in range(0, len(data), 65536):  # as a pipe delivers it
        now[0] += 65536 / 50e6
        out.feed(data[at : at + 65536])
    read = sum(len(s) + 1 for s in got)
    assert read <= SAMPLE_BURST + now[0] * SAMPLE_BYTES_S  # not 8 MiB
    assert got and all(s.startswith("step ") and len(s) == 1023 for s in got)  # whole lines
    assert int(got[-1].split()[1]) > 8192 - 256  # the newest lines are read as it goes
    assert (tmp_path / "w0.log").stat().st_size == len(data)  # the log keeps every byte
    now[0] += 0.01
    out.feed(_lines(8192, 64))
    reader = ProgressReader()
    for s in got:
        reader.read(s)
    assert reader.step == 8192 + 63
    out.close()


def test_output_at_a_trainers_pace_is_all_read(tmp_path: Path) -> None:
    out, got, now = _output(tmp_path)
    for i in range(2000):  # 200 lines a second, with a bar's carriage returns between
        now[0] += 0.005
        out.feed(f"\rtrain: {i % 100}%|#| {i}/2000 [00:01<00:20, 5.00it/s]".encode())
        if i % 10 == 0:
            out.feed(f"\nstep {i} loss 0.5\n".encode())
    out.close()
    assert len(got) == 2000 + 200


def test_the_last_line_still_counts_when_the_budget_is_spent(tmp_path: Path) -> None:
    out, got, _ = _output(tmp_path)
    out.feed(_lines(0, 1024))
    out.feed(b"step 2000 loss 0.1")  # no newline: read when the output ends
    out.close()
    assert got[-1] == "step 2000 loss 0.1"


def test_an_endless_line_is_read_within_the_budget(tmp_path: Path) -> None:
    out, got, _ = _output(tmp_path)
    for _ in range(1024):  # 4 MiB without a newline
        out.feed(b"y" * 4096)
    out.close()
    assert 0 < len(got) <= SAMPLE_BURST // MAX_LINE
    assert all(s == "y" * MAX_LINE for s in got)


_N = MAX_LINE  # the longest segment a reader is given


@pytest.mark.parametrize(
    "line",
    [
        "a" + " " * (_N - 2) + "b",  # each took 0.1-0.6 s
        "a" + ":" * (_N - 2) + "b",
        "1" * _N,
        "train: 5%|#| 5/100 [00:01<00:20, 5.00it/s, " + "a" * (_N - 60) + "]",
        "Epoch 1/2 " + " " * (_N - 20) + "x",
    ],
    ids=["spaces", "colons", "digits", "a-word-in-a-bar", "rich-epoch"],
)
def test_no_line_takes_long_to_read(line: str) -> None:
    """Reading a line costs time linear in its length: a pattern that backtracks over a
    long run of spaces cost seconds of the master's loop for a few such lines."""
    took = []
    for _ in range(3):
        reader = ProgressReader()
        t0 = time.perf_counter()
        reader.read(line)
        took.append(time.perf_counter() - t0)
    assert min(took) < 0.04  # about 1 ms here; 0.1-0.6 s with the quadratic patterns
