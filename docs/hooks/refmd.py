"""Markdown pieces for the generated reference, and what the code says about itself
beyond docstrings: comments beside a model's fields, docstrings under constants.

Every generator renders through these, so escaping is decided once: text from the code
goes into tables whole, and a `|`, `*` or `<` in a help line cannot break the page.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import os
import re
import textwrap
import tokenize
from collections.abc import Iterator, Sequence
from unittest import mock

_SPECIAL = re.compile(r"([\\*_\[\]|])")
_PRAGMA = re.compile(r"^(type:|noqa|pragma|fmt:)")


def prose(text: str) -> str:
    """`text` as one line of Markdown: its `code spans` kept, everything else literal."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part)
        else:
            out.append(_SPECIAL.sub(r"\\\1", part).replace("<", "&lt;"))
    return "".join(out)


def code(text: str) -> str:
    """`text` as an inline code span, whatever backticks it holds."""
    text = " ".join(text.split())
    if "`" not in text:
        return f"`{text}`"
    fence = "``" if "``" not in text else "```"
    return f"{fence} {text} {fence}"


def value(obj: object) -> str:
    """A default or an example as a spec would spell it (JSON, which YAML reads too)."""
    return code(json.dumps(obj, default=str, ensure_ascii=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; cells are Markdown already (`prose`, `code`), empty ones a dash."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell or "—" for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, as one line."""
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


@contextlib.contextmanager
def bare_environment() -> Iterator[None]:
    """No environment variables while the code is read: a default taken from
    `$TRAINGUARD_DB` or a preset's `os.environ.get` must not depend on who builds the site."""
    with mock.patch.dict(os.environ, {}, clear=True):
        yield


def _comments(source: str) -> dict[int, str]:
    """line -> its comment's text (pragmas such as `type: ignore` left out)."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if text and not _PRAGMA.match(text):
                out[tok.start[0]] = text
    return out


def _notes(
    lines: list[str],
    comments: dict[int, str],
    node: ast.stmt,
    after: ast.stmt | None,
    grouped: bool,
) -> str:
    """The docstring under `node` (`after`), else its comments: the block just above it
    (`grouped`: above the run of lines it ends, as a comment heads a group of constants)
    and any at its end of line."""
    if (
        isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    ):
        return first_paragraph(after.value.value)
    above: list[str] = []
    line = node.lineno - 1
    while grouped and line >= 1 and lines[line - 1].strip()[:1] not in ("", "#"):
        line -= 1
    while line >= 1 and lines[line - 1].strip().startswith("#") and line in comments:
        above.insert(0, comments[line])
        line -= 1
    end = node.end_lineno or node.lineno
    beside = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
    return " ".join([*above, *beside])


def _statement_notes(source: str, body: list[ast.stmt], grouped: bool) -> dict[str, str]:
    lines = source.splitlines()
    comments = _comments(source)
    out: dict[str, str] = {}
    for i, node in enumerate(body):
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = _notes(lines, comments, node, after, grouped)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = _notes(lines, comments, node, after, grouped)
    return out


def field_notes(cls: type) -> dict[str, str]:
    """field name -> what the class's source says of it (docstring under it, or comments)."""
    source = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(source)
    node = tree.body[0]
    return _statement_notes(source, node.body, False) if isinstance(node, ast.ClassDef) else {}


def module_notes(name: str) -> dict[str, str]:
    """module-level name -> what the module's source says of it (a comment heading a group
    of constants speaks for each of them)."""
    source = inspect.getsource(importlib.import_module(name))
    return _statement_notes(source, ast.parse(source).body, True)
