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

from trainguard.classify.logtail import clean, exception_block


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
    r"\btrain(ing)?[_ ](loss|step)\b|\bconsumed_samples\b|\bloss_?\w*\s*[:=]\s*[-+]?\d|"
    r"\bTrain Epoch\b|\bEpoch\s*\[\d+\]\s*\[\d+/\d+\]|\biteration\s+\d+\s*/\s*\d+|"
    r"\bsaving (model )?checkpoint|\bcheckpoint saved\b|\belapsed time per iteration\b",
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
    re.compile(r"(?:^|\))exitcode\s*:\s*(-?\d+)"),  # a paste may glue it to "(local rank: 2)"
    re.compile(r"\bfailed \(exitcode: (-?\d+)\)"),
    re.compile(r"exits? with return code\s*=\s*(-?\d+)"),
    re.compile(r"returned non-zero exit status (-?\d+)"),
    re.compile(r"\bexit(?:ed)?(?: with)? (?:code|status)[:= ]+(1[2-9]\d)\b", re.IGNORECASE),
)
_CHILD_SIGNAL = (
    re.compile(r"Signal \d+ \((SIG[A-Z]+)\) received by PID", re.IGNORECASE),
    re.compile(r"terminated with signal (SIG[A-Z]+)"),
    re.compile(r"died with <Signals\.(SIG[A-Z]+): \d+>"),
    re.compile(r"killed by signal:? (SIG[A-Z]+|Killed|Segmentation fault|Aborted)", re.I),
)
_SHELL_SIGNAL = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Killed": "SIGKILL",
    "Bus error": "SIGBUS",
    "已杀死": "SIGKILL",  # a Chinese locale's shell
    "段错误": "SIGSEGV",
    "已放弃": "SIGABRT",
}
_SHELL = re.compile(
    r"(?:^|\bline \d+:\s+\d+\s+|[\]*]|\s)(Segmentation fault|Aborted|Killed|Bus error|"
    r"已杀死|段错误|已放弃)(?: \(core dumped\)| \(核心已转储\))?\**(?:\s+python.*)?\s*$",
    re.IGNORECASE,
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
        m = _SHELL.search(text)
        if m:
            return _SHELL_SIGNAL[m.group(1).capitalize() if m.group(1).isascii() else m.group(1)]
        m = _FATAL_SIGNAL.search(text)
        if m:
            return m.group(1)
    return None


# ---------------------------------------------------------------- the root inside a wrapper

# Exceptions that only report another process's failure: the cause is told before them.
_WRAPPER = re.compile(
    r"^([\w.]+\.)?(ChildFailedError|CalledProcessError|ProcessExitedException|SystemExit|"
    r"SubprocessError)\b"
)


def root_exception_block(lines: Sequence[str]) -> tuple[int, int, list[str]] | None:
    """The last traceback that is not a launcher's wrapper around a child's failure.

    torchrun's ChildFailedError, DeepSpeed's and Accelerate's CalledProcessError and
    multiprocessing's ProcessExitedException come after the child's own traceback (when
    the log holds it): that one is the root. Without one, the wrapper is all there is.
    """
    block = exception_block(lines)
    for _ in range(4):
        if block is None or not _WRAPPER.match(block[2][0]):
            return block
        inner = exception_block(lines[: block[0]])
        if inner is None:
            return block
        block = inner
    return block


# ---------------------------------------------------------------- collectives

_WORK = re.compile(
    r"(?:WorkNCCL|WorkGloo|Work)\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(\d+), NumelOut=(\d+))?|"
    r"CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+), TensorShape=(\[[\d, ]*\])()"
)
_MISMATCH = re.compile(
    r"Detected mismatch between collectives|Collectives differ in the following aspects|"
    r"mismatch between collectives|collective (type|size|shape)s? mismatch|"
    r"Invalidate trace cache @ step|expected module \d+, but got module \d+|"
    r"different number of (tensors|elements|parameters)|sizes of the tensors are different",
    re.IGNORECASE,
)


def collective_mismatch(lines: Sequence[str]) -> str | None:
    """Evidence that ranks called collectives differently: a bug, not a slow network.

    Ranks that time out at the same sequence number in different operations or with
    different sizes, or PyTorch's and DeepSpeed's own mismatch reports. Returns why.
    """
    seen: dict[str, tuple[str, str | None]] = {}
    for line in lines:
        text = clean(line)
        m = _MISMATCH.search(text)
        if m:
            return f"the log reports a collective mismatch ({m.group(0)})"
        for found in _WORK.findall(text):
            seq, op, numel = found[0] or found[4], found[1] or found[5], found[2] or found[6]
            numel = numel or None
            prev = seen.setdefault(seq, (op, numel))
            if prev[0] != op:
                return f"ranks ran different collectives at SeqNum {seq} ({prev[0]} and {op})"
            if prev[1] and numel and prev[1] != numel:
                return f"ranks sent different sizes at SeqNum {seq} ({prev[1]} and {numel})"
    return None


_INIT = re.compile(
    r"store based barrier|initializing process group|init_process_group|"
    r"setting up NCCL communicator|ncclCommInitRank|ncclUniqueId",
    re.IGNORECASE,
)


def first_collectives(lines: Sequence[str]) -> bool:
    """The job failed in its first collectives (SeqNum <= 2, or the process-group set-up)."""
    for line in lines:
        text = clean(line)
        if _INIT.search(text):
            return True
        nums = [int(f[0] or f[4]) for f in _WORK.findall(text)]
        if nums and min(nums) <= 2:
            return True
    return False


_TIMEOUT = re.compile(r"collective operation timeout|Timed out waiting \d+ms|timed out", re.I)
_SOLO_WORK = re.compile(
    r"\bsaving (model )?checkpoint|\bSaving model\b|\bsave_checkpoint\b|torch\.save|"
    r"Running Evaluation|\bevaluat(e|ing|ion)\b|\bvalidat(e|ing|ion)\b|\bgenerat(e|ing)\b|"
    # a validation table's header; an epoch's progress bar just full (its end-of-epoch work)
    r"\bmAP@|(?<![\d.])100%\|",
    re.IGNORECASE,
)


def solo_work_before_timeout(lines: Sequence[str], window: int = 10) -> str | None:
    """A save, evaluation or generation just before a collective timeout: work some ranks
    do alone (rank 0 saving) while the others wait in a collective, a bug of the job's
    timing more than of the network. Returns the line."""
    cleaned = [clean(x) for x in lines]
    first = next((i for i, x in enumerate(cleaned) if _TIMEOUT.search(x)), None)
    if first is None:
        return None
    for text in reversed(cleaned[max(0, first - window) : first]):
        if _SOLO_WORK.search(text):
            return text
    return None


# ---------------------------------------------------------------- crashes with a cause

_CRASH_CAUSE = re.compile(
    r"device-side assert(ion)? triggered|Assertion `.+` failed|Assertion .* failed\.|"
    r"torchCheckFail|c10::detail::torchCheckFail|undefined symbol|"
    r"free\(\): invalid|double free or corruption|corrupted size vs\. prev_size|"
    r"malloc\(\): (corrupted|memory corruption)|munmap_chunk\(\): invalid pointer|"
    r"version `GLIBC|GLIBCXX_[\d.]+' not found|Illegal instruction|"
    r"what\(\):\s+(?!.*(NCCL|nccl|Watchdog|timed? ?out|Connection|socket|ECC|CUDA error: "
    r"(unknown|an illegal memory|unspecified)))",
    re.IGNORECASE,
)


def crash_cause(lines: Sequence[str]) -> str | None:
    """A line before a SIGSEGV/SIGABRT that makes the crash deterministic (or None)."""
    for line in reversed(lines):
        text = clean(line)
        if _CRASH_CAUSE.search(text):
            return text
    return None


# ---------------------------------------------------------------- GPU memory held by others

_SIZE = r"([\d.]+) (B|KiB|MiB|GiB|TiB)"
_CUDA_OOM_NUMBERS = re.compile(
    rf"{_SIZE} total capacity; (?:{_SIZE} already allocated; )?{_SIZE} free;"
    rf"(?: [^;]*;)*? ?{_SIZE} (?:reserved in total by PyTorch|cached)",
)
_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def gpu_held_elsewhere(lines: Sequence[str]) -> str | None:
    """A CUDA OOM while most of the GPU's memory is neither this process's nor free:
    another process (often a stale one of an earlier run) has it, and a restart may find
    it free. PyTorch's message gives total, free and what it holds ("reserved in total",
    or in older versions "already allocated" plus "cached").
    """
    for line in reversed(lines):
        m = _CUDA_OOM_NUMBERS.search(line)
        if not m:
            continue
        g = m.groups()
        total, free, held = (float(g[i]) * _UNIT[g[i + 1]] for i in (0, 4, 6))
        if "cached" in m.group(0).rsplit(";", 1)[-1] and g[2] is not None:
            held += float(g[2]) * _UNIT[g[3]]  # old format: allocated and cached are apart
        elsewhere = (total - held - free) / total if total > 0 else 0.0
        if elsewhere > 0.5:
            return (
                f"PyTorch held {held / total:.0%} of the GPU's memory and {free / total:.0%} "
                f"was free: another process had {elsewhere:.0%}"
            )
        return None
    return None
