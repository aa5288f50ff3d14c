"""The command-line reference: every subcommand and flag of `trainguard`, read from the
argparse grammar itself (`cli.parser.build_parser`), with its help, default and choices."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from refmd import bare_environment, code, prose, table

from trainguard.cli.parser import INTERNAL, SPEC_COMMANDS, build_parser


def parser() -> argparse.ArgumentParser:
    """The whole grammar (spec flags included), with defaults as a bare environment gives."""
    with bare_environment():
        return build_parser(None)


def subcommands(p: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand a user may type, in the grammar's order."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name not in INTERNAL:
                    yield name, helps.get(name, ""), sub


def _shown(action: argparse.Action) -> bool:
    return (
        not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and action.help != argparse.SUPPRESS
    )


def shared(p: argparse.ArgumentParser) -> set[tuple[str, ...]]:
    """The option strings of the flags every spec command (`run`, `submit`) has: the job
    spec's and torchrun's, listed once."""
    subs = {name: sub for name, _, sub in subcommands(p)}
    flags = [{tuple(a.option_strings) for a in subs[n]._actions} for n in SPEC_COMMANDS]
    return set.intersection(*flags) - {(), ("-h", "--help")}


def _metavar(action: argparse.Action) -> str:
    if action.choices is not None:
        return " | ".join(str(c) for c in action.choices)
    if isinstance(action.metavar, str):
        return action.metavar
    return action.dest if not action.option_strings else action.dest.upper()


def takes(action: argparse.Action) -> str:
    """What the flag takes: nothing (a switch), a value, an optional value, the rest."""
    if action.nargs == 0:
        return "switch"
    name = _metavar(action)
    if action.nargs == argparse.REMAINDER:
        return code(f"-- {name} ...")
    if action.nargs == "?":
        return code(f"[{name}]")
    if isinstance(action, argparse._AppendAction):
        return code(name) + " (repeatable)"
    return code(name)


def default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, []):
        return ""
    return code(str(action.default))


def _exclusive(p: argparse.ArgumentParser, action: argparse.Action) -> str:
    others = [
        a.option_strings[-1]
        for g in p._mutually_exclusive_groups
        if action in g._group_actions
        for a in g._group_actions
        if a is not action
    ]
    return f" Not with {', '.join(code(o) for o in others)}." if others else ""


def _name(action: argparse.Action) -> str:
    if action.option_strings:
        return ", ".join(code(o) for o in action.option_strings)
    return code(action.dest)


def options_table(p: argparse.ArgumentParser, only: set[tuple[str, ...]] | None = None) -> str:
    """The flags of `p` (`only` those with these option strings), or "" if none."""
    rows = [
        [_name(a), takes(a), default(a), prose(a.help or "") + _exclusive(p, a)]
        for a in p._actions
        if _shown(a) and (only is None or tuple(a.option_strings) in only)
    ]
    return table(["Option", "Takes", "Default", "Help"], rows) if rows else ""


def _hidden(p: argparse.ArgumentParser) -> str:
    """Options the grammar accepts and `--help` does not list."""
    names = [
        code(o)
        for a in p._actions
        if a.help == argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        for o in a.option_strings
    ]
    return f"Accepted, not listed in `--help`: {', '.join(names)}." if names else ""


def synopsis(name: str, p: argparse.ArgumentParser) -> str:
    words = [f"trainguard {name}", "[OPTIONS]"]
    for a in p._actions:
        if not a.option_strings and a.nargs != argparse.REMAINDER:
            words.append(f"[{a.dest}]" if a.nargs == "?" else a.dest.upper())
        elif a.nargs == argparse.REMAINDER:
            words.append("[-- COMMAND ...]")
    return code(" ".join(words))


def render() -> str:
    p = parser()
    common = shared(p)
    named = [f"`trainguard {n}`" for n in SPEC_COMMANDS]
    spec_commands = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    helps = [o for a in p._actions if isinstance(a, argparse._HelpAction) for o in a.option_strings]
    asked = f"Every command also takes {', '.join(code(o) for o in helps)}: its own help."
    parts = ["## `trainguard`", "", prose(p.description or ""), "", asked, ""]
    parts += [options_table(p), ""]
    for name, text, sub in subcommands(p):
        parts += [f"## `trainguard {name}`", "", prose(text), "", synopsis(name, sub), ""]
        own = {tuple(a.option_strings) for a in sub._actions} - common
        if name in SPEC_COMMANDS:
            parts += ["The [job spec options](#job-spec-options), and:", ""]
        parts += [options_table(sub, own), ""]
    any_spec = next(sub for name, _, sub in subcommands(p) if name in SPEC_COMMANDS)
    parts += ["## Job spec options", "", f"Taken by {spec_commands} alike.", ""]
    parts += [options_table(any_spec, common), "", _hidden(any_spec), ""]
    return "\n".join(parts)
