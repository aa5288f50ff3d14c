"""Run one program cold (`--no-preload`) and then warm (the default), for comparing."""

from __future__ import annotations

from pathlib import Path

from conftest import TG


def newest_logs(tg: TG) -> list[str]:
    """The log of every replica of the newest job, by rank."""
    newest = tg.json("jobs")[0]["id"]  # newest first
    return [Path(r["log_path"]).read_text() for r in tg.json("status", newest)["replicas"]]


def cold_and_warm(
    tg: TG,
    *argv: str,
    prefix: str,
    warm_flags: tuple[str, ...] = (),
    warm_note: str = "warm start: torch",
    timeout: float = 300,
) -> tuple[list[list[str]], list[list[str]]]:
    """Each replica's lines that hold `prefix`, cold and then warm (`warm_flags`, default
    none); the warm run must have forked (its note says so) and the cold one must not.
    Every replica runs to its end (`--success-policy all`): by default rank 0's success
    ends the job, and a busy machine may stop rank 1 before it printed."""
    seen = []
    for flags in (("--no-preload",), warm_flags):
        res = tg("run", "--quiet", "--success-policy", "all", *flags, *argv, timeout=timeout)
        assert res.returncode == 0, res.stderr
        assert (warm_note in res.stderr) == (flags == warm_flags), res.stderr
        seen.append([[x for x in log.splitlines() if prefix in x] for log in newest_logs(tg)])
    return seen[0], seen[1]
