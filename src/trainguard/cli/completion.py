"""`trainguard completion bash|zsh`: a completion script, made from the parser itself so
it never drifts from the commands and flags: commands, each command's flags, and job ids
(from `trainguard jobs`) where a command takes a job.

    source <(trainguard completion bash)      # ~/.bashrc
    source <(trainguard completion zsh)       # ~/.zshrc (through zsh's bashcompinit)
"""

from __future__ import annotations

import argparse

from trainguard.cli.parser import INTERNAL

_BASH = """_trainguard() {
    local cur="${COMP_WORDS[COMP_CWORD]}" cmd="${COMP_WORDS[1]}" opts=""
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "%(commands)s" -- "$cur"))
        return
    fi
    case "$cmd" in
%(cases)s
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ " %(job_commands)s " == *" $cmd "* ]]; then
        COMPREPLY=($(compgen -W "$(trainguard jobs 2>/dev/null | awk 'NR>1 {print $1}')" \\
            -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _trainguard trainguard
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    commands = _commands(parser)
    cases = "\n".join(
        f'        {name}) opts="{" ".join(flags)}" ;;' for name, (flags, _job) in commands.items()
    )
    body = _BASH % {
        "commands": " ".join(commands),
        "cases": cases,
        "job_commands": " ".join(n for n, (_f, job) in commands.items() if job),
    }
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], bool]]:
    """Each visible command: its flags, and whether it takes a job."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, tuple[list[str], bool]] = {}
    for name, p in sub.choices.items():
        if name in INTERNAL:
            continue
        flags = sorted(f for a in p._actions for f in a.option_strings if f.startswith("--"))
        job = any(a.dest == "job" and not a.option_strings for a in p._actions)
        out[name] = (flags, job)
    return out
