"""The progress recognisers (issue 20) on real output captured from the trainers they name
(tests/progress_real, SOURCES.md says how each was made), read the way the master reads
it: the raw bytes through a replica's RunOutput, in chunks, as segments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from trainguard.backends.output import RunOutput
from trainguard.classify.progress_text import (
    EPOCH_SOURCE,
    ProgressReader,
    Sighting,
    metrics_in,
    parse_hf_dict,
)
from trainguard.spec.progress import compile_progress_pattern

REAL = ROOT / "tests" / "progress_real"


def segments_of(data: bytes, tmp: Path, chunk: int) -> list[str]:
    got: list[str] = []
    out = RunOutput("worker-0", tmp / "replica.log", None, lambda _first, s: got.extend(s))
    for i in range(0, len(data), chunk):
        out.feed(data[i : i + chunk])
    out.close()
    return got


def read_all(segments: list[str], reader: ProgressReader | None = None) -> list[Sighting]:
    reader = reader or ProgressReader()
    return [s for seg in segments if (s := reader.read(seg)) is not None]


def truth(case: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((REAL / f"{case}.truth.json").read_text())
    return value


# case -> (the step the reader must end on, its source, the loss metric it must end with).
# The step is the trainer's own global step where the output shows it; the other units are
# what the output can tell (each says why).
CASES: dict[str, tuple[int, str, str]] = {
    # the bar's n/total is Trainer.state.global_step
    "hf_trainer_tqdm": (truth("hf_trainer_tqdm")["last_step_printed"], "tqdm", "loss"),
    # an evaluation bar (N/3) at each epoch's end is not the training loop's
    "hf_trainer_eval_epochs": (
        truth("hf_trainer_eval_epochs")["last_step_printed"],
        "tqdm",
        "loss",
    ),
    # no bar: the log dicts' epoch, in thousandths (40 steps of 16 per epoch = epoch 2.5)
    "hf_trainer_notqdm": (round(40 / 16 * 1000), EPOCH_SOURCE, "loss"),
    # "Epoch E: ... n/N": E*N + n = trainer.global_step
    "lightning_tqdm": (truth("lightning_tqdm")["last_step_printed"], "lightning", "train_loss"),
    "lightning_ddp2": (truth("lightning_ddp2")["last_step_printed"], "lightning", "train_loss"),
    # RichProgressBar on a pipe prints one frame, when fit ends
    "lightning_rich": (truth("lightning_rich")["last_step_printed"], "lightning", "train_loss"),
    # a bar per step; the nested per-epoch bars (leave=False) count on across epochs
    "tqdm_plain": (truth("tqdm_plain")["last_step_printed"], "tqdm", "loss"),
    "tqdm_epochs": (truth("tqdm_epochs")["last_step_printed"], "tqdm", "loss"),
    # "iter N: loss L" (and the eval lines "step N: train loss ...")
    "nanogpt_style": (truth("nanogpt_style")["last_step_printed"], "keyword", "loss"),
    # "Train Epoch: E [S/N" counts samples, not steps: E*N + S (1280 samples per epoch)
    "pytorch_examples_mnist": (2 * 1280 + 960, "keyword", "loss"),
}


@pytest.mark.parametrize("chunk", [4096, 97])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reader_ends_where_the_trainer_did(case: str, chunk: int, tmp_path: Path) -> None:
    want_step, want_source, loss_key = CASES[case]
    segments = segments_of((REAL / f"{case}.log").read_bytes(), tmp_path, chunk)
    reader = ProgressReader()
    seen = read_all(segments, reader)
    steps = [s.step for s in seen if s.step is not None]
    assert reader.off is None, reader.off
    assert reader.step == want_step, (case, steps[-10:])
    assert reader.source == want_source
    assert steps == sorted(steps), "a step read went backwards"
    want_loss = float(truth(case)["last_loss_printed_str"])
    if case == "pytorch_examples_mnist":  # the "Test set: Average loss" after it is not it
        want_loss = truth(case)["last_loss_printed"]
    assert reader.metrics[loss_key] == pytest.approx(want_loss, rel=1e-3)


def test_a_bar_is_read_while_it_runs_not_only_when_it_closes(tmp_path: Path) -> None:
    """tqdm on a pipe ends no line until it closes: its carriage-return updates count."""
    data = (REAL / "tqdm_plain.log").read_bytes()
    half = data[: len(data) // 2]
    seen = read_all(segments_of(half, tmp_path, 512))
    assert seen and seen[-1].step is not None and 20 < seen[-1].step < 80


def test_lightning_sanity_and_validation_bars_are_not_training(tmp_path: Path) -> None:
    segments = segments_of((REAL / "lightning_tqdm.log").read_bytes(), tmp_path, 4096)
    assert any(s.startswith("Sanity Checking") for s in segments)
    assert any(s.startswith("Validation DataLoader") for s in segments)
    reader = ProgressReader()
    for seg in segments:
        before = reader.step
        reader.read(seg)
        if seg.startswith(("Sanity Checking", "Validation DataLoader")):
            assert reader.step == before


@pytest.mark.parametrize(
    "lines",
    [
        # pip's and a downloader's bars: bytes, not steps
        ["Downloading model.bin:  45%|####5     | 10.0M/22.0M [00:01<00:01, 3.2MB/s]"],
        ["Map:  50%|#####     | 500/1000 [00:00<00:00, 5000.00 examples/s]"],
        ["Map (num_proc=4):  40%|####      | 4/10 [00:01<00:02, 2.51it/s]"],
        # one "step" of an installer, a rendezvous message, a bare number
        ["step 1/3: installing dependencies", "all done"],
        ["Waiting for step 0 of rendezvous", "Waiting for step 1 of rendezvous"],
        ["Epoch-based learning rate schedule set up", "seed 1234"],
    ],
)
def test_what_is_not_training_progress_is_not_read(lines: list[str]) -> None:
    reader = ProgressReader()
    assert [s for line in lines if (s := reader.read(line)) is not None and s.step] == []
    assert reader.step is None


def test_a_bare_step_counts_once_it_kept_rising() -> None:
    reader = ProgressReader()
    assert reader.read("step 1") is None
    seen = reader.read("step 2")
    assert seen is not None and seen.step == 2
    assert reader.read("step 3 loss 0.5") == Sighting(3, {"loss": 0.5}, "keyword")


def test_a_step_with_a_metric_counts_at_once() -> None:
    assert ProgressReader().read("step 120 loss 0.31 lr 1e-4") == Sighting(
        120, {"loss": 0.31, "lr": 1e-4}, "keyword"
    )


def test_a_step_that_keeps_going_back_turns_the_reader_off() -> None:
    reader = ProgressReader()
    for line in ["step 10 loss 1", "step 20 loss 1", "step 5 loss 1", "step 30 loss 1"]:
        reader.read(line)
    assert reader.off is None and reader.step == 30
    assert reader.read("step 7 loss 1") is None
    assert reader.off is not None and "backwards 2 times" in reader.off
    assert reader.read("step 40 loss 1") is None  # off stays off: it would mis-read


def test_the_first_family_read_keeps_the_step() -> None:
    """A bar's count and a "step N" line may count different things: the first wins."""
    reader = ProgressReader()
    reader.read(" 10%|#         | 10/100 [00:01<00:09, 10.00it/s]")
    reader.read("step 999 loss 0.1")
    assert reader.step == 10 and reader.source == "tqdm"


def test_a_user_pattern_reads_only_what_it_names() -> None:
    reader = ProgressReader(compile_progress_pattern(r"it=(?P<step>\d+) l=(?P<loss>\S+)"))
    assert reader.read(" 10%|#         | 10/100 [00:01<00:09, 10.00it/s]") is None
    assert reader.read("step 5 loss 0.1") is None
    assert reader.read("it=7 l=0.25") == Sighting(7, {"loss": 0.25}, "pattern")
    assert reader.read("it=8 l=nan?") == Sighting(8, {"loss": 0.25}, "pattern")


def test_off_reads_nothing() -> None:
    reader = ProgressReader(builtins=False)
    assert reader.read("step 120 loss 0.31") is None


def test_hf_log_dicts_old_and_new_spellings() -> None:
    assert parse_hf_dict("{'loss': 2.31, 'grad_norm': 0.9, 'learning_rate': 5e-05, 'epoch': 0.5}")
    new = parse_hf_dict("{'loss': '4.321', 'grad_norm': '1.421', 'epoch': '0.3125'}")
    assert new == {"loss": 4.321, "grad_norm": 1.421, "epoch": 0.3125}
    assert parse_hf_dict("{'a': 1}") is None
    assert parse_hf_dict("{not python}") is None


def test_metrics_in_a_line() -> None:
    assert metrics_in("iter 40: loss 3.2010, time 31.2ms, lr=6e-4") == {"loss": 3.201, "lr": 6e-4}


def test_an_epoch_counts_when_the_line_says_of_how_many_or_a_loss() -> None:
    reader = ProgressReader()
    assert reader.read("Epoch-based schedule, epoch 3 planned") is None
    assert reader.read("Epoch 1/10") == Sighting(1, {}, "epoch")
    assert reader.read("epoch: 2, loss=0.3") == Sighting(2, {"loss": 0.3}, "epoch")


@pytest.mark.parametrize("case", sorted(p.stem for p in REAL.glob("negative_*.log")))
def test_real_output_that_is_not_training_gives_no_step(case: str, tmp_path: Path) -> None:
    """Transformers saving and loading shards (bars of "shards" and "weights"), torch.compile's
    recompile warnings ("[0/8]"): no step in them."""
    segments = segments_of((REAL / f"{case}.log").read_bytes(), tmp_path, 512)
    reader = ProgressReader()
    assert [s for s in read_all(segments, reader) if s.step is not None] == []
    assert truth(case)["steps_total"] == 0


def test_every_capture_is_tested() -> None:
    logs = {p.stem for p in REAL.glob("*.log")}
    assert logs == set(CASES) | {p for p in logs if p.startswith("negative_")}
    assert len(logs) >= 12


def test_lightning_with_its_rich_bar_gets_a_hint(tmp_path: Path) -> None:
    """Where rich is installed Lightning picks its RichProgressBar, silent on a pipe until
    fit ends: the reader has a hint ready (the master gives it if no step follows)."""
    segments = segments_of((REAL / "lightning_rich.log").read_bytes(), tmp_path, 4096)
    reader = ProgressReader()
    for seg in segments:
        reader.read(seg)
        if seg.startswith("Epoch 1/-2"):  # the one frame, at the end of fit
            break
        assert reader.step is None
    assert reader.hint is not None and "TQDMProgressBar" in reader.hint
