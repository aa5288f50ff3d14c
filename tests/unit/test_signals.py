"""Table tests for signal spellings (R-CLS-1): return codes, names, numbers, shell codes."""

from __future__ import annotations

import signal

import pytest

from trainguard.signals import decode_returncode, parse_signal, signal_name


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        (-6, (134, signal.SIGABRT)),
        (134, (134, signal.SIGABRT)),
        (-11, (139, signal.SIGSEGV)),
        (139, (139, signal.SIGSEGV)),
        (-9, (137, signal.SIGKILL)),
        (137, (137, signal.SIGKILL)),
        (-15, (143, signal.SIGTERM)),
        (143, (143, signal.SIGTERM)),
        (-7, (135, signal.SIGBUS)),
        (135, (135, signal.SIGBUS)),
        (-2, (130, signal.SIGINT)),
        # Plain exit statuses: not signals.
        (0, (0, None)),
        (1, (1, None)),
        (2, (2, None)),
        (128, (128, None)),
        (255, (255, None)),
    ],
)
def test_decode_returncode(returncode: int, expected: tuple[int, int | None]) -> None:
    assert decode_returncode(returncode) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-6, signal.SIGABRT),
        (134, signal.SIGABRT),
        ("SIGABRT", signal.SIGABRT),
        ("abrt", signal.SIGABRT),
        ("ABRT", signal.SIGABRT),
        (6, signal.SIGABRT),
        ("6", signal.SIGABRT),
        ("-6", signal.SIGABRT),
        ("134", signal.SIGABRT),
        (-11, signal.SIGSEGV),
        (139, signal.SIGSEGV),
        ("SIGSEGV", signal.SIGSEGV),
        ("segv", signal.SIGSEGV),
        ("sigsegv", signal.SIGSEGV),
        (" SIGSEGV ", signal.SIGSEGV),
        (11, signal.SIGSEGV),
        ("11", signal.SIGSEGV),
        (-9, signal.SIGKILL),
        (137, signal.SIGKILL),
        ("SIGKILL", signal.SIGKILL),
        ("kill", signal.SIGKILL),
        (9, signal.SIGKILL),
        (-15, signal.SIGTERM),
        (143, signal.SIGTERM),
        ("SIGTERM", signal.SIGTERM),
        ("term", signal.SIGTERM),
        (15, signal.SIGTERM),
        (-7, signal.SIGBUS),
        (135, signal.SIGBUS),
        ("SIGBUS", signal.SIGBUS),
        ("bus", signal.SIGBUS),
        (7, signal.SIGBUS),
    ],
)
def test_parse_signal_spellings(value: str | int, expected: int) -> None:
    assert parse_signal(value) == int(expected)


@pytest.mark.parametrize("value", [0, 128, "0", "128", 200, "SIGNOPE", "nope", ""])
def test_parse_signal_rejects(value: str | int) -> None:
    with pytest.raises(ValueError):
        parse_signal(value)


@pytest.mark.parametrize(
    ("num", "name"),
    [(6, "SIGABRT"), (7, "SIGBUS"), (9, "SIGKILL"), (11, "SIGSEGV"), (15, "SIGTERM")],
)
def test_signal_name(num: int, name: str) -> None:
    assert signal_name(num) == name
