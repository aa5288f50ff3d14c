"""Pydantic's validation errors as one line per problem, naming the field and the value."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trainguard.spec.text import shown


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-") or "[" in str(part):
            continue  # pydantic's union-branch labels say nothing to a user
        else:
            out += ("." if out else "") + str(part)
    return out


def _describe(err: Any) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    loc = _loc(err["loc"])
    got = err.get("input")
    if kind == "missing":
        return f"{loc}: is required"
    if kind == "extra_forbidden":
        return f"{loc}: unknown field"
    if kind == "value_error":
        msg = str(ctx.get("error", err["msg"]))
        # Our own validators already name field and value ("memory: must be ...").
        return f"{loc}.{msg}" if loc and ":" in msg.split(" ")[0] else f"{loc}: {msg}".lstrip(": ")
    text = {
        "greater_than_equal": "must be >= {ge}",
        "greater_than": "must be > {gt}",
        "less_than_equal": "must be <= {le}",
        "less_than": "must be < {lt}",
        "too_short": "must have at least {min_length} item(s)",
        "string_pattern_mismatch": "must match {pattern}",
        "literal_error": "must be one of {expected}",
        "enum": "must be one of {expected}",
    }.get(kind)
    bounds = {k: f"{v:g}" if isinstance(v, float) else v for k, v in ctx.items()}
    msg = text.format(**bounds) if text else err["msg"][0].lower() + err["msg"][1:]
    return f"{loc}: {msg}, got {shown(got)}"


def validation_problems(exc: ValidationError) -> list[str]:
    seen: list[str] = []
    for err in exc.errors():
        line = _describe(err)
        if line not in seen:
            seen.append(line)
    return seen
