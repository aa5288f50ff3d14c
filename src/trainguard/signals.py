"""Signal spellings (R-CLS-1): -N return codes, 128+N shell codes, names, numbers."""

from __future__ import annotations

import signal

_MAX_SIGNAL = 64


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def decode_returncode(returncode: int) -> tuple[int, int | None]:
    """(exit status as a shell shows it, signal number or None).

    Python reports death by signal N as -N; a shell (or a container runtime) as 128+N.
    Both mean the same death, so both decode to the signal and the status 128+N.
    """
    if returncode < 0:
        return 128 - returncode, -returncode
    if 128 < returncode <= 128 + _MAX_SIGNAL:
        return returncode, returncode - 128
    return returncode, None


def parse_signal(value: str | int) -> int:
    """'SIGSEGV', 'segv', '11', 11, -11 and 139 all name SIGSEGV."""
    if isinstance(value, int) or value.strip().lstrip("-").isdigit():
        num = abs(int(value))
        if num > 128:
            num -= 128
        if 0 < num <= _MAX_SIGNAL:
            return num
        raise ValueError(f"not a signal number: {value!r}")
    name = value.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError(f"unknown signal: {value!r}") from None
