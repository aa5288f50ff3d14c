"""YAML from users, read with bounds: size, aliases, nesting, duplicate keys, binary.

A job spec or a server config is small. PyYAML's `safe_load` still expands an alias
bomb (a few lines that build millions of nodes), keeps the last of two equal keys without
a word, and reads `/dev/zero` until memory runs out; `load_bounded` refuses each with one
line that names the file and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainguard.spec.text import shown

MAX_BYTES = 1024 * 1024
"""A spec larger than this is not a spec."""
MAX_ALIASES = 32  # a legitimate spec repeats a block a few times; a bomb needs many
MAX_DEPTH = 64


class YamlProblem(ValueError):
    """What is wrong with a YAML file, in one line (without the file's name)."""


def _line(node_or_mark: Any) -> str:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return f" at line {mark.line + 1}" if mark is not None else ""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: construct_mapping says so below
                continue
            if duplicate:
                raise YamlProblem(f"the key {shown(key)} is given twice{_line(key_node)}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_events(text: str) -> None:
    """Count aliases and nesting on the event stream, before anything is built."""
    aliases = depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YamlProblem(f"more than {MAX_ALIASES} aliases{_line(event)} (an alias bomb?)")
        elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep{_line(event)}")
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


def parse_bounded(text: str) -> Any:
    """The data in a YAML text, or YamlProblem."""
    if "\x00" in text:
        raise YamlProblem("it holds NUL bytes: a binary file, not YAML")
    try:
        _check_events(text)
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise YamlProblem(f"not valid YAML{_line(mark)}") from None
    except YamlProblem:
        raise
    except (ValueError, OverflowError) as exc:  # a constructor's: 5000 digits, 2019-13-01
        why = str(exc).split(";")[0][:100]
        raise YamlProblem(f"a value YAML cannot build: {why}") from None


def read_bounded(path: Path) -> str:
    """A file's text, at most MAX_BYTES (a FIFO or /dev/zero is not read forever)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlProblem(f"larger than {MAX_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise YamlProblem("not UTF-8 text: a binary file?") from None
