"""Text from users as it may be shown and stored: values shortened for a one-line message,
and strings that are not UTF-8 found before anything keeps them.

Python hands bytes that are not UTF-8 (in argv, the environment, a file name) over as
lone surrogates ('\\udcff' for the byte 0xff); JSON and YAML escapes can spell them too.
No store, log, regex engine or HTTP body takes them, so a spec that holds one is refused
with the field that does, rather than accepted and failing inside the master later.
"""

from __future__ import annotations

import re
from typing import Any

SHOWN_CHARS = 60
"""A value in a message is cut to about this many characters (a 100,000-character pattern
is not echoed back)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)`, cut to about `limit` characters, saying how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[: limit - 3]}...{size}"


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 job`, `2 jobs` (`plural`: where adding an s is wrong)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def not_utf8(text: str) -> str | None:
    """What in `text` is not UTF-8 ("the byte 0xff"), or None if all of it is."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    code = ord(found.group())
    if 0xDC80 <= code <= 0xDCFF:  # Python's spelling of an undecodable byte
        return f"the byte 0x{code - 0xDC00:02x}"
    return f"the lone surrogate U+{code:04X}"


def replace_non_utf8(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD: how that byte reads in a log decoded
    with `errors="replace"`, and what a UTF-8-only engine (RE2) can take."""
    return _SURROGATE.sub("\ufffd", text)


def not_utf8_problem(where: str, text: str, what: str = "") -> str | None:
    """The line that says `text` (given as `where`) is not UTF-8, or None if it is."""
    found = not_utf8(text)
    if found is None:
        return None
    return (
        f"{where}: {what}{shown(text)} holds {found}, which is not UTF-8 text "
        "(trainguard takes UTF-8 only)"
    )


def non_utf8_problems(data: Any, where: str = "") -> list[str]:
    """One line for each string (a key or a value) in plain data that is not UTF-8 text."""
    problems: list[str] = []
    if isinstance(data, str):
        line = not_utf8_problem(where or "value", data)
        problems += [line] if line else []
    elif isinstance(data, dict):
        for key, value in data.items():
            bad_key = isinstance(key, str) and not_utf8_problem(where or "spec", key, "the key ")
            if bad_key:
                problems.append(bad_key)
                continue
            problems += non_utf8_problems(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            problems += non_utf8_problems(item, f"{where}[{i}]")
    return problems
