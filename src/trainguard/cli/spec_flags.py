"""The flags that build a job spec (`run` and `submit` share them, made from the table in
spec.fields), and the spec they build.

A spec file, then `--ft-args`, then explicit flags: each later source wins, and a problem
a flag caused names the flag.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from trainguard.errors import SpecError
from trainguard.spec.aimaster_flags import parse_ft_args
from trainguard.spec.fields import AIMASTER, FIELDS, FT_FLAGGED, flag, set_field
from trainguard.spec.frameworks import RULES
from trainguard.spec.limits import MAX_REPLICAS
from trainguard.spec.models import JobSpec, load_spec_file, preload_names, validate_spec
from trainguard.spec.text import shown
from trainguard.storage.checkpoint_copy import listing


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a job spec: the same for `run` and `submit`, from spec.fields."""
    for row in FIELDS:
        if not row.flags:
            continue
        kw: dict[str, Any] = {"dest": row.key, "help": row.help or row.path}
        if row.metavar:
            kw["metavar"] = row.metavar
        if row.action == "switch":
            kw.update(action="store_const", const=True)
        elif row.action == "repeat":
            kw["action"] = "append"
        elif row.action == "file":
            kw["type"] = Path
        p.add_argument(*row.flags, **kw)


def build_spec(args: argparse.Namespace, command: list[str]) -> JobSpec:
    """Spec file, then --ft-args, then explicit flags: each later source wins."""
    data: dict[str, Any] = load_spec_file(args.file) if args.file else {}
    problems = _pools(data, args, command) + _env(data, args) + _torchft_only(data, args)
    if problems:
        raise SpecError(problems)
    _fault_tolerance(data, args)
    _the_rest(data, args)
    if "name" not in data and command:
        data["name"] = _default_name(command)
    try:
        return validate_spec(data)
    except SpecError as exc:
        raise SpecError([_name_the_flag(line, args) for line in exc.problems]) from None


def _pools(data: dict[str, Any], args: argparse.Namespace, command: list[str]) -> list[str]:
    """The command after `--` becomes the framework's pools; a spec's pools stay."""
    if command:
        if data.get("worker_pools"):
            return ["command: give either a spec with worker_pools or a command, not both"]
        name = args.framework or data.get("framework") or "pytorch"
        replicas = args.nproc if args.nproc is not None else 1
        if args.nodes is not None:
            nodes = _whole(flag("nodes"), args.nodes)
            per = _whole(flag("nproc"), args.nproc or 1)
            if isinstance(nodes, str) or isinstance(per, str):
                return [p for p in (nodes, per) if isinstance(p, str)]
            replicas = nodes * per
            slurm = dict(data.get("slurm") or {})
            data["slurm"] = {**slurm, "nodes": nodes, "tasks_per_node": per}
        if name == "torchft":
            groups = _torchft_groups(data, args)
            if isinstance(groups, str):
                return [groups]
            replicas = groups
        # An unknown framework gets the default pools: the spec's check names it.
        data["worker_pools"] = RULES.get(name, RULES["pytorch"]).pools_for(command, replicas)
        return []
    if not data.get("worker_pools"):
        return [
            "command: none given; put it after --, e.g. "
            "`trainguard run --nproc-per-node 2 -- python train.py`, or use -f job.yaml"
        ]
    if args.nproc is not None:
        return [f"{flag('nproc')}: applies to a command, not to a spec's worker_pools"]
    if args.groups is not None:
        return [f"{flag('groups')}: applies to a command, not to a spec's worker_pools"]
    return []


def _torchft_only(data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    if (args.framework or data.get("framework")) == "torchft":
        return []
    given = [k for k in ("groups", "nproc_per_group") if getattr(args, k) is not None]
    return [f"{flag(k)}: applies to {flag('framework')} torchft only" for k in given]


def _torchft_groups(data: dict[str, Any], args: argparse.Namespace) -> int | str:
    """The worker replicas of `--framework torchft --groups G --nproc-per-group N`: G*N
    (`--nproc-per-node K` alone: K groups of one rank); or what is wrong."""
    if args.groups is not None and args.nproc is not None:
        return (
            f"{flag('groups')} and {flag('nproc')}: give one of them "
            f"(groups x {flag('nproc_per_group')})"
        )
    counts: list[int] = []
    for option, value in (
        (flag("groups"), args.groups or args.nproc),
        (flag("nproc_per_group"), args.nproc_per_group),
    ):
        n = _whole(option, value if value is not None else 1)
        if isinstance(n, str):
            return n
        counts.append(n)
    groups, per = counts
    if args.nproc_per_group is not None:
        data["torchft"] = {**(data.get("torchft") or {}), "nproc_per_group": per}
    else:
        per = int((data.get("torchft") or {}).get("nproc_per_group", 1))
    return groups * per


def _env(data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """`--env KEY=VALUE` for every pool."""
    if not (args.env and data.get("worker_pools")):
        return []
    problems, extra = [], {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(f"{flag('env')}: must be KEY=VALUE, got {shown(item)}")
        extra[key] = value
    data["worker_pools"] = [
        {**p, "env": {**p.get("env", {}), **extra}} if isinstance(p, dict) else p
        for p in data["worker_pools"]
    ]
    return problems


def _fault_tolerance(data: dict[str, Any], args: argparse.Namespace) -> None:
    ft: dict[str, Any] = dict(data.get("fault_tolerance") or {})
    if args.ft_args:
        for name, value in parse_ft_args(args.ft_args).items():
            set_field(ft, f"fault_tolerance.{name}", value)
    for row in FT_FLAGGED:
        if getattr(args, row.key) is not None:
            set_field(ft, row.path, getattr(args, row.key))
    if args.retryable_errors:
        ft["retryable_errors"] = [*ft.get("retryable_errors", []), *args.retryable_errors]
    data["fault_tolerance"] = ft


def _merged(
    data: dict[str, Any], key: str, args: argparse.Namespace, dests: dict[str, str]
) -> None:
    """`data[key]` with the flags that were given (spec key -> flag dest) on top."""
    section: dict[str, Any] = dict(data.get(key) or {})
    for name, dest in dests.items():
        if getattr(args, dest) is not None:
            section[name] = getattr(args, dest)
    if section or key == "queue":
        data[key] = section


def _a_checkpoint(path: Path) -> None:
    """What the master would copy at its start, checked before anything is stored: a
    folder it cannot copy used to cost three internal-error attempts."""
    try:
        files = listing(path).files
    except (ValueError, OSError) as e:
        raise SpecError([f"{flag('initial_checkpoint')}: {e}"]) from None
    if not files:
        raise SpecError([f"{flag('initial_checkpoint')}: {shown(str(path))} holds no file"])


def _the_rest(data: dict[str, Any], args: argparse.Namespace) -> None:
    for key in ("name", "framework", "success_policy", "allow_partial"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.initial_checkpoint is not None:
        path = Path(args.initial_checkpoint)
        if not path.is_dir():
            where = shown(args.initial_checkpoint)
            raise SpecError([f"{flag('initial_checkpoint')}: not a folder: {where}"])
        _a_checkpoint(path)
        data["checkpoint"] = {**(data.get("checkpoint") or {}), "initial": str(path.resolve())}
    if args.fault_injection:
        data["fault_injection"] = [*data.get("fault_injection", []), *args.fault_injection]
    _merged(
        data, "ray", args, {"address": "ray_address", "placement_strategy": "placement_strategy"}
    )
    if args.preload is not None and args.no_preload:
        raise SpecError([f"{flag('preload')} and {flag('no_preload')}: give one of them"])
    if args.no_preload:
        data["preload"] = []
    elif args.preload is not None:
        named = preload_names(args.preload)
        if [m.lower() for m in named] == ["none"]:
            data["preload"] = []
        else:  # more, on top of what the spec has (by default, what auto finds)
            before = data.get("preload")
            base = ["auto"] if before is None else preload_names(before)
            base = [m for m in base if m.lower() != "none"]
            data["preload"] = [*base, *(m for m in named if m not in base)]
    _progress(data, args)
    if args.backend is not None:
        data["backend"] = args.backend
    elif args.ray_address is not None:
        data["backend"] = "ray"  # --ray-address alone says where
    elif "backend" not in data and os.environ.get("SLURM_JOB_ID") and _many_nodes(data):
        data["backend"] = "slurm"  # inside an allocation, a job of several nodes
    _merged(data, "queue", args, {k: k for k in ("priority", "max_wait_s", "wait_for_capacity")})
    _agents(data, args)
    if args.gpus is not None:
        data["gpu_inventory"] = [g.strip() for g in args.gpus.split(",") if g.strip()]


def _whole(option: str, value: object) -> int | str:
    """A count from 1 to MAX_REPLICAS from a flag, or what is wrong with it."""
    text = str(value).strip()
    if not text.lstrip("-").isdecimal():
        return f"{option}: must be a whole number, got {shown(text)}"
    n = int(text) if len(text) <= 20 else MAX_REPLICAS + 1  # int() refuses 4300 digits
    if not 1 <= n <= MAX_REPLICAS:
        return f"{option}: must be 1 to {MAX_REPLICAS}, got {shown(text)}"
    return n


def _many_nodes(data: dict[str, Any]) -> bool:
    nodes = (data.get("slurm") or {}).get("nodes")
    return isinstance(nodes, int) and nodes > 1


def _agents(data: dict[str, Any], args: argparse.Namespace) -> None:
    """The switches set the agents of the job's engine: Slurm's or Ray's."""
    engine = "ray" if data.get("backend") == "ray" else "slurm"
    _merged(data, engine, args, {"agents": "agents"})
    if args.no_node_agents:
        if args.agents:
            raise SpecError([f"{flag('agents')} and {flag('no_node_agents')}: give one of them"])
        data[engine] = {**(data.get(engine) or {}), "agents": False}


def _progress(data: dict[str, Any], args: argparse.Namespace) -> None:
    if args.progress_pattern is not None and args.no_progress:
        raise SpecError([f"{flag('progress_pattern')} and {flag('no_progress')}: give one of them"])
    before = data.get("progress")
    section = dict(before) if isinstance(before, dict) else {}
    if isinstance(before, str):  # the shorthand: a keyword or a pattern
        word = before.strip().lower()
        section = {"read": word} if word in ("auto", "off") else {"pattern": before}
    if args.no_progress:
        section = {**section, "read": "off"}
        section.pop("pattern", None)
    elif args.progress_pattern is not None:
        section = {**section, "pattern": args.progress_pattern}
    if section:
        data["progress"] = section


def _name_the_flag(line: str, args: argparse.Namespace) -> str:
    """`fault_tolerance.max_num_of_job_restart: ...` also names the flag that set it (an
    explicit flag, else the `--ft-args` one), as `fault_injection[1]: ...` names the flag
    that gave that item."""
    field = line.split(":", 1)[0]
    for row in FIELDS:
        given = getattr(args, row.key, None)
        if row.path and row.flags and given is not None and _under(field, row.path):
            return f"{line} (from {row.flag})"
    from_ft_args = parse_ft_args(args.ft_args) if args.ft_args else {}  # it parsed before
    for name, row in AIMASTER.items():
        if row.name in from_ft_args and _under(field, row.path):
            return f"{line} (from {flag('ft_args')} --{name})"
    if ".env" in field and _from_env_flag(field, line, args.env or []):
        return f"{line} (from {flag('env')})"
    return line


def _under(field: str, path: str) -> bool:
    """`field` is the field at `path`, or an item or a part of it."""
    return field == path or field.startswith((f"{path}.", f"{path}["))


def _from_env_flag(field: str, line: str, items: list[str]) -> bool:
    """True if the variable a problem names (`worker_pools[0].env.KEY`, or the key quoted
    in the line) was given with `--env`."""
    keys = {item.partition("=")[0] for item in items}
    return any(field.endswith(f".env.{k}") or f"key {k!r}" in line for k in keys)


def _default_name(command: list[str]) -> str:
    """`python train.py` -> `train`; `./run.sh` -> `run`; otherwise the program's name."""
    script = next((w for w in command if w.endswith((".py", ".sh"))), command[0])
    stem = Path(script).stem
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem).strip("-._")[:60] or "job"
