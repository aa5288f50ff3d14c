"""What the SDK channel accepts in a request body: one reader per field, each failing
with a one-line error that names the field, what it expects and what it got.

Apart from the server (`sdk_channel`): these are the wire contract with the SDK, not
HTTP framing, and the limits here are the ones the SDK documents.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from http import HTTPStatus

from trainguard.spec.limits import MAX_PATTERNS, MAX_SECONDS, pattern_problems

MAX_BODY_BYTES = 64 * 1024
MAX_REPLICA_CHARS = 128
MAX_TEXT_CHARS = 4000
MAX_STEP = 10**15  # more steps than any run takes: a larger number is garbage
HANG_DETECT_OFF = -1
"""The SDK's `hang_detect(-1)`: detection off in that scope (sdk.HANG_DETECT_OFF)."""

SHOWN_CHARS = 60
"""How much of a rejected value an error message quotes."""


class HttpError(Exception):
    """A request answered with `status` and a one-line JSON error."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


Body = dict[str, object]


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def json_object(raw: bytes) -> Body:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"body: malformed JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "body: expected a JSON object")
    return value


def _bad(field: str, expected: str, value: object) -> HttpError:
    return HttpError(HTTPStatus.BAD_REQUEST, f"{field}: expected {expected}, got {show(value)}")


def show(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= SHOWN_CHARS else shown[: SHOWN_CHARS - 3] + "..."


def read_replica(body: Body) -> str:
    value = body.get("replica")
    if not (isinstance(value, str) and 0 < len(value) <= MAX_REPLICA_CHARS and value.isprintable()):
        raise _bad("replica", f"a printable string of 1 to {MAX_REPLICA_CHARS} chars", value)
    return value


def _optional_int(body: Body, field: str, low: int, high: int) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(field, f"an integer from {low} to {high} or null", value)
    return value


def _int(body: Body, field: str, low: int, high: int) -> int:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(field, f"an integer from {low} to {high}", value)
    return value


def read_step(body: Body) -> int | None:
    return _optional_int(body, "step", 0, MAX_STEP)


def read_given_step(body: Body) -> int:
    return _int(body, "step", 0, MAX_STEP)


MAX_WORLD = 1_000_000


def read_world(body: Body) -> int:
    return _int(body, "world", 1, MAX_WORLD)


def read_seconds(body: Body) -> float | None:
    value = body.get("seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad("seconds", "a number or null", value)
    if value > MAX_SECONDS:
        raise _bad("seconds", f"at most {MAX_SECONDS}", value)
    if value != HANG_DETECT_OFF and value <= 0:
        raise _bad("seconds", f"> 0 or {HANG_DETECT_OFF} (off)", value)
    return float(value)


def read_patterns(body: Body) -> list[str]:
    """A list of strings, held to the spec's rule for retryable patterns (its count,
    length and no blank one: `spec.limits.pattern_problems`, the one place of that rule)."""
    value = body.get("patterns")
    if not (isinstance(value, list) and len(value) <= MAX_PATTERNS):
        raise _bad("patterns", f"a list of at most {MAX_PATTERNS} strings", value)
    for i, pattern in enumerate(value):
        if not isinstance(pattern, str):
            raise _bad(f"patterns[{i}]", "a string", pattern)
    problems = pattern_problems(value, "patterns")
    if problems:
        raise HttpError(HTTPStatus.BAD_REQUEST, problems[0])
    return value


MAX_METRICS = 100
_CHECKPOINT_NAME = re.compile(r"^checkpoint_\d{6,20}$")


def read_metrics(body: Body) -> dict[str, object]:
    value = body.get("metrics")
    if not (isinstance(value, dict) and len(value) <= MAX_METRICS):
        raise _bad("metrics", f"an object of at most {MAX_METRICS} entries", value)
    for key, item in value.items():
        if len(key) > MAX_REPLICA_CHARS:
            raise _bad("metrics", f"keys of at most {MAX_REPLICA_CHARS} chars", key)
        if isinstance(item, str) and len(item) > MAX_TEXT_CHARS:
            raise _bad(f"metrics.{key}", f"a string of at most {MAX_TEXT_CHARS} chars", item)
        if isinstance(item, float) and not math.isfinite(item):
            raise _bad(f"metrics.{key}", "a finite number", item)
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**63:
            raise _bad(f"metrics.{key}", "an integer that fits in 64 bits", item)
        if not (isinstance(item, int | float | str | bool) or item is None):
            raise _bad(f"metrics.{key}", "a number, string, boolean or null", item)
    return value


def read_checkpoint(body: Body) -> str | None:
    value = body.get("checkpoint")
    if value is not None and not (isinstance(value, str) and _CHECKPOINT_NAME.match(value)):
        raise _bad("checkpoint", "null or a name like checkpoint_000001", value)
    return value


MESSAGE_RATE_PER_S = 5.0
MESSAGE_BURST = 100
"""Custom messages a job may send: this many a second, after a first burst of this many.
Each is a row, a line of the master's log and perhaps a notification: a loop that sends
one a step must not fill the disk (50,000 of them once made 400 MB)."""


@dataclass
class RateBucket:
    """A token bucket: `take` says whether one more may pass now (a value: no clock of its own)."""

    rate_per_s: float
    burst: int
    tokens: float = field(init=False)
    at_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)  # full at first

    def take(self, now_s: float) -> bool:
        if self.at_s is not None:
            elapsed = max(0.0, now_s - self.at_s)
            self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate_per_s)
        self.at_s = now_s
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def read_text(body: Body) -> str:
    value = body.get("text")
    if not (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS):
        raise _bad("text", f"a string of at most {MAX_TEXT_CHARS} chars", value)
    return value
