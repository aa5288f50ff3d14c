"""What a training script's own output says about its progress (issue 20).

Most scripts never call the SDK, but nearly all print their progress: Hugging Face
Trainer's log dicts and bar, PyTorch Lightning's "Epoch 3: 40%|...| 12/30" bar, a tqdm
bar, "step 120 loss 0.31", "iter 40: loss 3.2". A `ProgressReader` reads one run's output
segments (lines, and the carriage-return updates a bar writes between them) and yields a
`Sighting` when the step moves forward or new metrics arrive at it.

Pure: no clock, no I/O. A reader that would mis-read turns itself off and says why: a
step that goes backwards twice without a reason (a new epoch's bar, a new bar's reset).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainguard.classify.logtail import clean

BACKWARDS_LIMIT = 2
"""A step that goes backwards this many times without a reason: the reader turns off."""
CONFIRM = 2
"""A bare "step N" counts once this many increasing sightings were seen (one "step 3 of
5: installing" is not training)."""


EPOCH_SOURCE = "hf-trainer-epoch"
"""Hugging Face Trainer without its bar: steps are thousandths of an epoch."""


class Matcher(Protocol):
    def search(self, text: str) -> Any: ...


@dataclass(frozen=True)
class Sighting:
    """The step a run had reached (None: metrics only, no step known yet), its latest
    metrics, and which recogniser read them."""

    step: int | None
    metrics: Mapping[str, float]
    source: str


# A tqdm bar as it is written to a pipe: "desc: 45%|####5     | 36/80 [00:01<00:01,
# 30.00it/s, loss=0.5]". n and total are plain integers for a counting bar (a byte bar's
# "10.0M/22.0M" is not progress). The description is what comes before the match (see
# `_desc`): a `^(.*?)[:\s]*` prefix in the pattern costs time quadratic in a line's length
# (a 4 KiB line of spaces took 0.3 s) on the path of the replica's output (issue 37).
_BAR = re.compile(
    r"(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<inside>[^\]]*)\]"
)
# A bar without a total: "desc: 36it [00:01, 30.00it/s, loss=0.5]".
_BAR_NO_TOTAL = re.compile(r"(?<!\d)(?P<n>\d+)it \[(?P<inside>[^\]]*)\]")
# Bars of work that is not the training loop: data preparation, downloads, evaluation.
_SIDE_BAR = re.compile(
    r"map|filter|load|download|tokeni|generat|process|fetch|valid|sanity|test|predict|"
    r"eval|shard|upload|extract|convert|resolv|writ|sav|copy|batches:",
    re.IGNORECASE,
)
# Lightning's RichProgressBar, which on a pipe prints its last frame only, as the run ends:
# "Epoch 1/-2 ━━━━━━━ 30/30 0:00:00 • 0:00:00 509.81it/s train_loss: 0.060".
_RICH_EPOCH = re.compile(
    r"^Epoch (?P<e>\d+)/\S+\s[━╸╺─\s]*?\s(?P<n>\d+)/(?P<total>\d+)\s.*?(?:it/s|s/it)(?P<post>.*)$"
)
# A metric's name starts a word ("=", ":" or a space before it): a name searched for at
# every letter of a long word costs time quadratic in its length.
_NAME = r"(?<![\w./-])(?:[^\W_A-Za-z]|[./-])*([A-Za-z_][\w./-]*)"
_RICH_METRIC = re.compile(_NAME + r":\s*(" + r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?" + ")")
# Lightning's RichModelSummary, printed where `rich` is installed: its progress bar then is
# the RichProgressBar, which draws nothing on a pipe until fit ends.
_RICH_SUMMARY = re.compile(r"┃\s*┃ Name\s*┃ Type\s*┃")
RICH_LIGHTNING_HINT = (
    "Lightning uses its RichProgressBar here (rich is installed), which prints nothing to a "
    "pipe until fit ends: for progress as it trains, pass "
    "Trainer(callbacks=[TQDMProgressBar()]), or report steps with trainguard.sdk.report"
)
_RATE_UNIT = re.compile(r"(?:it|s)/(?:s|it)\b")
_LIGHTNING_EPOCH = re.compile(r"^Epoch (\d+)\b")
_KV = re.compile(_NAME + r"\s*=\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
# "step 5", "Step 12/100", "global_step=300", "iter 40:", "iteration: 7", "[Iteration 9/10]".
_KEYWORD = re.compile(
    r"(?<![\w.-])(?P<key>global[_ ]step|step|iter(?:ation)?)\b\s*[:=#]?\s*\[?\s*"
    r"(?P<n>\d{1,12})\b(?!\.\d)(?:\s*(?:/|of)\s*(?P<total>\d{1,12}))?",
    re.IGNORECASE,
)
# The pytorch/examples form "Train Epoch: 2 [640/60000 (1%)]": an epoch and its count.
_EPOCH_COUNT = re.compile(r"\bEpoch\b\s*:?\s*(?P<e>\d+)\s*\[\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)")
_EPOCH = re.compile(
    r"(?<![\w.-])epoch\b\s*[:=#]?\s*\[?\s*(?P<e>\d{1,6})\b(?!\.\d)(?:\s*(?:/|of)\s*(?P<total>\d+))?",
    re.IGNORECASE,
)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_METRIC = re.compile(
    r"(?<![\w.-])(?P<name>(?:train[_ ]|val[_ ]|eval[_ ])?loss|lr|learning[_ ]rate|acc(?:uracy)?|"
    r"ppl|perplexity|grad[_ ]norm)\b\s*[:=]?\s*(?P<value>" + _NUMBER + ")",
    re.IGNORECASE,
)
# Words of a job starting up, not training (lower case: an alternation of them searched
# with IGNORECASE cost a fifth of a millisecond for a 1 KiB line).
_STARTING = (
    "rendezvous",
    "init_process_group",
    "initialis",
    "initializ",
    "bootstrap",
    "downloading",
    "warmup for",
    "nccl info",
    "waiting",
)


def parse_hf_dict(text: str) -> dict[str, float] | None:
    """Hugging Face Trainer's log line, "{'loss': 2.31, 'grad_norm': 0.9, 'epoch': 0.5}"
    (newer versions quote the values: "{'loss': '2.31', ...}"): its numbers, or None."""
    if not (text.startswith("{") and text.endswith("}")) or "'" not in text:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, float] = {}
    for k, v in value.items():
        if isinstance(k, str) and (num := _number(v)) is not None:
            out[k] = num
    keys = set(out)
    known = {"loss", "eval_loss", "train_loss", "train_runtime", "learning_rate", "epoch"}
    return out if keys & known and "epoch" in keys else None


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def metrics_in(text: str) -> dict[str, float]:
    """ "loss 0.31", "lr=1e-4", "train_loss: 2.0": the metrics a line names (first of each)."""
    out: dict[str, float] = {}
    for m in _METRIC.finditer(text):
        name = m.group("name").lower().replace(" ", "_")
        out.setdefault(name, float(m.group("value")))
    return out


def _starting(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in _STARTING)


def _desc(text: str, end: int) -> str:
    """A bar's description: the text before its numbers, without the ": " between."""
    while end > 0 and (text[end - 1] == ":" or text[end - 1].isspace()):
        end -= 1
    return text[:end]


@dataclass
class _Bar:
    """One bar's identity (its description without digits, its total) and its count so far."""

    key: tuple[str, int | None]
    offset: int = 0  # what earlier runs of this bar counted (tqdm per epoch: it resets)
    last_n: int = -1


@dataclass
class ProgressReader:
    """One run's output, read for progress. `pattern`: the user's regex (a named group
    `step`, optional named groups of numbers); with it the built-in recognisers are off."""

    pattern: Matcher | None = None
    builtins: bool = True
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    source: str | None = None  # the family the step is read from, once one was
    off: str | None = None  # why this reader stopped reading
    # What the user could do for the output to show progress, if none comes: Lightning's
    # rich model summary was printed (its bar may be the silent RichProgressBar).
    hint: str | None = None
    _bar: _Bar | None = None
    _backwards: int = 0
    _pending: list[int] = field(default_factory=list)  # unconfirmed keyword steps

    def read(self, segment: str) -> Sighting | None:
        """A sighting if this segment moved the step forward or brought new metrics."""
        if self.off is not None:
            return None
        text = clean(segment)
        if not text:
            return None
        if self.pattern is not None:
            return self._read_pattern(text)
        if not self.builtins:
            return None
        if self.step is None and self.hint is None and _RICH_SUMMARY.search(text):
            self.hint = RICH_LIGHTNING_HINT
        if (hf := parse_hf_dict(text)) is not None:
            return self._read_hf(hf)
        if self.source in (None, "lightning") and (m := _RICH_EPOCH.match(text)) is not None:
            epoch, n, total = int(m.group("e")), int(m.group("n")), int(m.group("total"))
            metrics = {k: float(v) for k, v in _RICH_METRIC.findall(m.group("post"))}
            return self._advance(epoch * total + n, metrics, "lightning")
        if self.source in (None, "tqdm", "lightning"):
            found = self._read_bar(text)
            if found is not None:
                return found
        if self.source in (None, "keyword", "epoch") and not _starting(text):
            return self._read_keyword(text)
        return None

    # ------------------------------------------------------------ Hugging Face

    def _read_hf(self, metrics: dict[str, float]) -> Sighting | None:
        """A log dict: metrics for the bar's step; without a bar (disable_tqdm) the step
        is the dict's epoch in thousandths (the only progress it prints)."""
        if self.source in (None, EPOCH_SOURCE) and "epoch" in metrics and "loss" in metrics:
            return self._advance(round(metrics["epoch"] * 1000), metrics, EPOCH_SOURCE)
        return self._metrics_only(metrics, "hf-trainer")

    # ------------------------------------------------------------ the user's pattern

    def _read_pattern(self, text: str) -> Sighting | None:
        assert self.pattern is not None
        m = self.pattern.search(text)
        if m is None:
            return None
        groups: dict[str, str | None] = m.groupdict()
        raw = groups.pop("step", None)
        metrics = {k: num for k, v in groups.items() if (num := _number(v)) is not None}
        if raw is None:
            return self._metrics_only(metrics, "pattern") if metrics else None
        try:
            step = int(float(raw))
        except ValueError:
            return None
        return self._advance(step, metrics, "pattern")

    # ------------------------------------------------------------ bars

    def _read_bar(self, text: str) -> Sighting | None:
        m = _BAR.search(text) if "%|" in text else None  # a test far cheaper than a search
        if m is None and "it [" in text:
            m = _BAR_NO_TOTAL.search(text)
        if m is None:
            return None
        inside = m.group("inside")
        parts = [p.strip() for p in inside.split(",")]
        if len(parts) > 1 and not _RATE_UNIT.search(parts[1]) and "?" not in parts[1]:
            return None  # "B/s", "MB/s", "ex/s": not steps
        desc = _desc(text, m.start()).strip()
        lightning = _LIGHTNING_EPOCH.match(desc)
        if _SIDE_BAR.search(desc) and lightning is None:
            return None
        n = int(m.group("n"))
        total = int(m.group("total")) if "total" in m.groupdict() and m.group("total") else None
        metrics = {k: float(v) for k, v in _KV.findall(",".join(parts[2:]))}
        if lightning is not None and total:
            return self._advance(int(lightning.group(1)) * total + n, metrics, "lightning")
        key = (re.sub(r"\d+", "#", desc), total)
        bar = self._bar
        if bar is None:
            if n == 0:
                return None  # a bar that has not moved may be a side one: wait for it to
            bar = self._bar = _Bar(key)
        elif bar.key != key:
            return None  # another bar (an outer epoch bar, an evaluation): not the loop's
        if n < bar.last_n:
            bar.offset += bar.last_n  # the bar started again: a new epoch of the same loop
        bar.last_n = n
        return self._advance(bar.offset + n, metrics, "tqdm")

    # ------------------------------------------------------------ "step N"

    def _read_keyword(self, text: str) -> Sighting | None:
        metrics = metrics_in(text)
        if (m := _EPOCH_COUNT.search(text)) is not None:
            epoch, n, total = int(m.group("e")), int(m.group("n")), int(m.group("total"))
            return self._advance(epoch * total + n, metrics, "keyword")
        m = _KEYWORD.search(text)
        if m is None and self.source in (None, "epoch"):
            return self._read_epoch(text, metrics)
        if m is None:
            return None  # a loss without a step may be a test set's ("Test set: Average loss")
        step = int(m.group("n"))
        if self.source != "keyword" and not metrics:
            # a bare counter counts once it kept rising: "step 1/3 installing" does not
            self._pending = [s for s in self._pending if s < step] + [step]
            if len(self._pending) < CONFIRM:
                return None
        return self._advance(step, metrics, "keyword")

    def _read_epoch(self, text: str, metrics: dict[str, float]) -> Sighting | None:
        """ "Epoch 3/10 loss 0.52", "epoch: 4, loss=0.3": the epoch is the step, when the
        line also says how many epochs or names a metric of training."""
        m = _EPOCH.search(text)
        if m is None or not (m.group("total") or metrics):
            return None
        return self._advance(int(m.group("e")), metrics, "epoch")

    # ------------------------------------------------------------ common

    def _metrics_only(self, metrics: Mapping[str, float], source: str) -> Sighting | None:
        if not metrics:
            return None
        self.metrics = {**self.metrics, **metrics}
        return Sighting(self.step, dict(self.metrics), source)

    def _advance(self, step: int, metrics: Mapping[str, float], source: str) -> Sighting | None:
        if self.source is None:
            self.source = source
        if self.step is not None and step < self.step:
            self._backwards += 1
            if self._backwards >= BACKWARDS_LIMIT:
                self.off = (
                    f"its {source} step went backwards {self._backwards} times "
                    f"(to {step} after {self.step}): output progress is not read any more"
                )
            return None
        moved = self.step is None or step > self.step
        self.step = step
        if metrics:
            self.metrics = {**self.metrics, **metrics}
        if not moved and not metrics:
            return None
        return Sighting(step, dict(self.metrics), source)
