"""The catalogue of failure signatures (R-CLS-3): data in `signatures.yaml`, not code.

`Rules` bundles the built-in catalogue with a job's own retryable keywords; user
keywords are checked first. The catalogue is ours and uses Python's `re`; a user's
pattern (spec, `--retryable-error`, `set_retryable_errors`) runs in RE2, which takes
linear time on any input, so no pattern can freeze the master on a log line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol

import re2  # type: ignore[import-untyped]
import yaml

from trainguard.spec.text import replace_non_utf8

_CLASSES = frozenset(
    {
        "user_error",
        "host_oom",
        "device_oom",
        "retryable_message",
        "insufficient_capacity",
        "preemption",
        "node_lost",
    }
)


@dataclass(frozen=True)
class Untrained:
    """What a signature means instead when the log shows no training progress yet."""

    failure_class: str
    retryable: bool
    confidence: float
    reason: str


class Matcher(Protocol):
    """What a signature needs of a compiled pattern (Python's `re` or RE2)."""

    def search(self, string: str, /) -> object | None: ...


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: Matcher
    failure_class: str
    retryable: bool
    reason: str
    cascade: bool = False
    hardware: bool = False
    confidence: float = 0.9  # how sure a match makes the class
    weak: bool = False  # a wrapper's or bystander's words: only when nothing else matches
    untrained: Untrained | None = None  # the reading before any training progress


def _compile(entry: Any, where: str) -> Signature:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping")
    missing = {"id", "pattern", "class", "retryable", "reason"} - entry.keys()
    if missing:
        raise ValueError(f"{where}: missing {', '.join(sorted(missing))}")
    if entry["class"] not in _CLASSES:
        raise ValueError(f"{where} ({entry['id']}): unknown class {entry['class']!r}")
    try:
        pattern = re.compile(str(entry["pattern"]), re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"{where} ({entry['id']}): bad pattern: {exc}") from None
    untrained = None
    if "untrained" in entry:
        u = entry["untrained"]
        if not isinstance(u, dict) or u.get("class") not in _CLASSES:
            raise ValueError(f"{where} ({entry['id']}): untrained needs a known class")
        untrained = Untrained(
            failure_class=str(u["class"]),
            retryable=bool(u.get("retryable", entry["retryable"])),
            confidence=float(u.get("confidence", 0.5)),
            reason=str(u.get("reason", entry["reason"])),
        )
    return Signature(
        id=str(entry["id"]),
        pattern=pattern,
        failure_class=str(entry["class"]),
        retryable=bool(entry["retryable"]),
        reason=str(entry["reason"]),
        cascade=bool(entry.get("cascade", False)),
        hardware=bool(entry.get("hardware", False)),
        confidence=float(entry.get("confidence", 0.9)),
        weak=bool(entry.get("weak", False)),
        untrained=untrained,
    )


def parse_catalogue(text: str) -> tuple[Signature, ...]:
    data = yaml.safe_load(text)
    entries = data.get("signatures") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the catalogue must have a list under `signatures`")
    sigs = tuple(_compile(e, f"signatures[{i}]") for i, e in enumerate(entries))
    ids = [s.id for s in sigs]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate signature ids: {sorted(dup)}")
    return sigs


@cache
def builtin_catalogue() -> tuple[Signature, ...]:
    text = resources.files("trainguard.classify").joinpath("signatures.yaml").read_text()
    return parse_catalogue(text)


def compile_user_pattern(text: str) -> Matcher:
    """A user's regex in RE2 (case-insensitive); what RE2 cannot parse (a backreference,
    a lookahead, a stray bracket) is matched as the plain keyword it then most likely is.

    RE2 takes UTF-8 only: a lone surrogate (an undecodable byte, as Python spells it; the
    SDK's JSON can carry one) becomes U+FFFD, as that byte reads in a log decoded here."""
    text = replace_non_utf8(text)
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # RE2 would print to stderr
    try:
        return re2.compile(text, options)  # type: ignore[no-any-return]
    except re2.error:
        options.literal = True
        return re2.compile(text, options)  # type: ignore[no-any-return]


def user_signatures(keywords: tuple[str, ...], source: str) -> tuple[Signature, ...]:
    """A job's own retryable keywords (regexes), as signatures checked before the catalogue.
    A blank one (the SDK does not refuse it; a spec does) would match every line: skipped."""
    out = []
    for i, kw in enumerate(keywords):
        if not kw.strip():
            continue
        pattern = compile_user_pattern(kw)
        out.append(
            Signature(
                id=f"{source}-{i}",
                pattern=pattern,
                failure_class="retryable_message",
                retryable=True,
                reason=f"matches the retryable keyword {kw!r} ({source})",
                confidence=0.95,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Rules:
    """What classification matches log lines against: the user's keywords, then ours."""

    user: tuple[Signature, ...] = ()
    catalogue: tuple[Signature, ...] = ()

    @classmethod
    def default(cls, keywords: tuple[str, ...] = (), runtime: tuple[str, ...] = ()) -> Rules:
        return cls(
            user=user_signatures(keywords, "spec-keyword")
            + user_signatures(runtime, "runtime-keyword"),
            catalogue=builtin_catalogue(),
        )


def first_match(
    sigs: tuple[Signature, ...], line: str, weak: bool | None = None
) -> Signature | None:
    """The first signature matching `line`; `weak` picks only weak (or only strong) ones."""
    maybe = _screen(sigs).candidates(line)
    for i, sig in enumerate(sigs):
        wanted = (weak is None or sig.weak == weak) and (maybe is None or i in maybe)
        if wanted and sig.pattern.search(line):
            return sig
    return None


_ODD_SPACE = "\x0b\x1c\x1d\x1e\x1f"
"""What Python's `\\s` takes for space in a str and RE2's does not."""


class _Screen:
    """One RE2 pass over a line says which of the catalogue's patterns may match it, so
    Python's `re` (the catalogue's engine: it has lookarounds) runs only those, and the
    ones RE2 cannot parse. A classification reads 200 lines against 54 case-insensitive
    patterns: 75-150 ms in `re` alone, in the master's loop, before a restart is ordered.
    Only on ASCII lines, where the two agree on `\\w`, `\\b`, `\\d`, case and space; a
    match is still Python's to confirm."""

    def __init__(self, sigs: tuple[Signature, ...]) -> None:
        options = re2.Options()
        options.case_sensitive = False
        options.log_errors = False  # RE2 would print what it cannot parse to stderr
        self._set = re2.Set.SearchSet(options)
        self._of: list[int] = []  # the set's index -> the signature's
        self._always: frozenset[int] = frozenset()
        always = set()
        for i, sig in enumerate(sigs):
            pattern = sig.pattern
            if isinstance(pattern, re.Pattern) and pattern.flags == re.IGNORECASE | re.UNICODE:
                try:
                    self._set.Add(_without_lookarounds(pattern.pattern))
                except (re2.error, ValueError):
                    always.add(i)
                    continue
                self._of.append(i)
            else:
                always.add(i)  # a user's RE2 pattern is fast already; other flags: unscreened
        self._always = frozenset(always)
        self._set.Compile()

    def candidates(self, line: str) -> frozenset[int] | None:
        """The signatures that may match `line`; None: any may (not screened)."""
        if not self._of or not line.isascii() or any(c in line for c in _ODD_SPACE):
            return None
        hits = self._set.Match(line)
        if not hits:
            return self._always
        return self._always | {self._of[h] for h in hits}


_SCREENS: dict[int, tuple[tuple[Signature, ...], _Screen]] = {}


def _screen(sigs: tuple[Signature, ...]) -> _Screen:
    """The screen of `sigs`, made once per tuple (by identity: hashing 54 signatures on
    every line cost more than the matching it saves)."""
    held = _SCREENS.get(id(sigs))
    if held is None or held[0] is not sigs:
        held = _SCREENS[id(sigs)] = (sigs, _Screen(sigs))
    return held[1]


_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")


def _without_lookarounds(pattern: str) -> str:
    """`pattern` with its lookarounds left out, which RE2 lacks: it then matches wherever
    `pattern` does, and more, so a line it does not match cannot match `pattern`.
    ValueError where that would not hold (a quantifier after a lookaround)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "\\":
            out.append(pattern[i : i + 2])
            i += 2
        elif pattern[i] == "[":
            end = _class_end(pattern, i)
            out.append(pattern[i:end])
            i = end
        elif pattern.startswith(_LOOKAROUND, i):
            i = _group_end(pattern, i)
            if pattern[i : i + 1] in ("*", "+", "?", "{"):  # a quantified lookaround
                raise ValueError(f"no superset of {pattern!r} without its lookarounds")
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _class_end(pattern: str, i: int) -> int:
    """Past the character class that opens at `i` (`[]...]` and `[^]...]` included)."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _group_end(pattern: str, i: int) -> int:
    """Past the group that opens at `i`."""
    depth, j = 0, i
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            j = _class_end(pattern, j)
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        j += 1
        if depth == 0:
            return j
    return j
