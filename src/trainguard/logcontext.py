"""What a log tail tells around its error: how far training got, and where it stood.

Pure functions of the lines. The classifier uses the phase (a failure during start-up
reads differently from the same text after hours of training); the policy uses the
progress point to see "the same error at the same step" across attempts.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from enum import StrEnum

from trainguard.logtail import clean


class Phase(StrEnum):
    STARTUP = "startup"  # no sign of training progress before the failure
    TRAINING = "training"  # the job had been training
    UNKNOWN = "unknown"


# A step counter as trainers print it: "step 5", "Step 12/100", "global_step=300",
# "iter 40", "iteration: 7", "[Iteration 9/10]". A number glued to a word is not one.
_STEP = re.compile(
    r"(?<![\w.-])(?:global[_ ]step|step|iter(?:ation)?s?)\b\s*[:=#]?\s*\[?\s*(\d{1,12})\b(?!\.\d)",
    re.IGNORECASE,
)
# Lines that only a training loop prints: a loss or learning-rate value, a throughput,
# a tqdm bar with a rate, an epoch counter, Hugging Face's log dicts.
_PROGRESS = re.compile(
    r"\bloss\b\s*[:=]?\s*[-+]?\d|['\"]loss['\"]\s*:\s*[-+]?\d|\blr\b\s*[:=]\s*\d|"
    r"\d+(\.\d+)?\s*(it|s)/(s|it)\b|\bsamples?/s(ec)?\b|\btokens?/s(ec)?\b|"
    r"\bepoch\b\s*[:=]?\s*\[?\d+\s*(/|of)\s*\d+|\bEpoch \d+:\s+\d+%|\d+%\|[^|]*\|\s*\d+/\d+ \[|"
    r"\bglobal[_ ]step\b\s*[:=]\s*\d|\bstep\b\s*\d+\s*(/|of)\s*\d+|"
    r"\btrain(ing)?[_ ](loss|step)\b|\bconsumed_samples\b",
    re.IGNORECASE,
)
# Words that say the job is still starting: a line with these is not a training step
# even when it carries a number ("Waiting for step 0 of rendezvous").
_STARTING = re.compile(
    r"rendezvous|init_process_group|initiali[sz]|loading (checkpoint|model|shards|weights)|"
    r"NCCL INFO|Bootstrap|Downloading|Fetching|Map:|Tokeniz|warmup for",
    re.IGNORECASE,
)
_TQDM_DATA = re.compile(r"(Map|Filter|Loading|Download|Tokeniz|Generating|Processing)", re.I)


def _is_progress_line(line: str) -> bool:
    if _STARTING.search(line):
        return False
    if _TQDM_DATA.search(line) and "%|" in line:
        return False  # a data-preparation bar, not training
    return bool(_PROGRESS.search(line)) or bool(_STEP.search(line) and _has_metric(line))


def _has_metric(line: str) -> bool:
    return bool(re.search(r"\b(loss|lr|acc(uracy)?|ppl|grad_norm)\b", line, re.IGNORECASE))


def progress_lines(lines: Sequence[str]) -> list[int]:
    """Indices of the lines that show training progress."""
    return [i for i, line in enumerate(lines) if _is_progress_line(clean(line))]


def last_step(lines: Sequence[str]) -> int | None:
    """The step of the last progress line that names one (None: no step printed)."""
    for line in reversed(lines):
        text = clean(line)
        if not _is_progress_line(text) and not text.lower().startswith(("step ", "iter")):
            continue
        found = _STEP.findall(text)
        if found:
            return int(found[0])
    return None


def phase_of(lines: Sequence[str], progressed: bool | None = None) -> Phase:
    """Start-up or training: what the master knows (`progressed`) wins over the text."""
    if progressed is not None:
        return Phase.TRAINING if progressed else Phase.STARTUP
    if progress_lines(lines):
        return Phase.TRAINING
    return Phase.UNKNOWN


# ---------------------------------------------------------------- launcher wrappers

# How launchers report a child's death when the launcher itself exits 1: torchrun's
# ChildFailedError summary, multiprocessing.spawn, DeepSpeed's and Accelerate's
# launchers, a shell. Each gives the child's return code (-N for a signal) or a signal.
_CHILD_CODE = (
    re.compile(r"^exitcode\s*:\s*(-?\d+)"),
    re.compile(r"exits? with return code\s*=\s*(-?\d+)"),
    re.compile(r"returned non-zero exit status (-?\d+)"),
    re.compile(r"\bexit(?:ed)?(?: with)? (?:code|status)[:= ]+(1[2-9]\d)\b", re.IGNORECASE),
)
_CHILD_SIGNAL = (
    re.compile(r"Signal \d+ \((SIG[A-Z]+)\) received by PID"),
    re.compile(r"terminated with signal (SIG[A-Z]+)"),
    re.compile(r"died with <Signals\.(SIG[A-Z]+): \d+>"),
    re.compile(r"killed by signal:? (SIG[A-Z]+|Killed|Segmentation fault|Aborted)", re.I),
)
_SHELL_SIGNAL = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Killed": "SIGKILL",
    "Bus error": "SIGBUS",
}
_SHELL = re.compile(
    r"^(?:.*\bline \d+:\s+\d+\s+)?(Segmentation fault|Aborted|Killed|Bus error)"
    r"(?: \(core dumped\))?(?:\s+.*)?$"
)
_FATAL_SIGNAL = re.compile(
    r"(?:Fatal Python error|\*\*\* Received signal|caught signal).*?(SIG[A-Z]+)"
)


def _signal_from_code(code: int) -> str | None:
    num = -code if code < 0 else code - 128 if 128 < code <= 192 else 0
    try:
        return signal.Signals(num).name if num else None
    except ValueError:
        return None


def child_signal(lines: Sequence[str]) -> str | None:
    """The signal a launcher's summary says the failing child died of (None: none said).

    torchrun puts the first observed failure under "Root Cause"; elsewhere the first
    death the tail reports is taken, since later ones are usually the launcher's own stop.
    """
    cleaned = [clean(x) for x in lines]
    root = next((i for i, x in enumerate(cleaned) if x.startswith("Root Cause")), None)
    order = cleaned[root:] + cleaned[:root] if root is not None else cleaned
    for text in order:
        for pattern in _CHILD_SIGNAL:
            m = pattern.search(text)
            if m:
                name = m.group(1)
                return _SHELL_SIGNAL.get(name.capitalize(), name.upper())
        for pattern in _CHILD_CODE:
            m = pattern.search(text)
            if m:
                return _signal_from_code(int(m.group(1)))
        m = _SHELL.match(text)
        if m:
            return _SHELL_SIGNAL[m.group(1)]
        m = _FATAL_SIGNAL.search(text)
        if m:
            return m.group(1)
    return None
