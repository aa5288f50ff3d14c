"""The flags that build a job spec (`run` and `submit` share them), and the spec they build.

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
from trainguard.records.checkpoint_copy import listing
from trainguard.spec.aimaster_flags import parse_ft_args
from trainguard.spec.frameworks import RULES
from trainguard.spec.limits import MAX_REPLICAS
from trainguard.spec.models import JobSpec, load_spec_file, preload_names, validate_spec
from trainguard.spec.text import shown

# CLI flag -> fault_tolerance field (one to one; None = the flag's own name).
_FT_FLAGS = {
    "execution_mode": "--execution-mode",
    "fault_tolerant_policy": "--fault-tolerant-policy",
    "enable_job_restart": "--enable-job-restart",
    "max_num_of_job_restart": "--max-restarts",
    "max_replica_restarts": "--max-replica-restarts",
    "max_transient_restarts": "--max-transient-restarts",
    "max_uncertain_restarts": "--max-uncertain-restarts",
    "retry_uncertain": "--retry-uncertain",
    "enable_repeat_detection": "--enable-repeat-detection",
    "max_num_of_same_error": "--max-num-of-same-error",
    "max_tolerated_failure_rate": "--max-tolerated-failure-rate",
    "enable_job_hang_detection": "--enable-job-hang-detection",
    "job_hang_interval": "--job-hang-interval",
    "startup_timeout_s": "--startup-timeout",
    "enable_job_exit_hang_detection": "--enable-job-exit-hang-detection",
    "job_exit_hang_interval": "--job-exit-hang-interval",
    "stop_grace_period_s": "--stop-grace-period",
}


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a job spec: the same for `run` and `submit`."""
    p.add_argument("-f", "--file", type=Path, help="job spec (YAML)")
    p.add_argument("--job-name", dest="name", help="the job's name")
    p.add_argument("--nproc-per-node", "--nproc", dest="nproc", help="replicas of the command")
    p.add_argument("--framework", help=f"{', '.join(RULES)} (default pytorch)")
    p.add_argument("--groups", help="torchft: replica groups of the command (default 1)")
    p.add_argument(
        "--nproc-per-group", dest="nproc_per_group", help="torchft: ranks per group (default 1)"
    )
    p.add_argument(
        "--allow-partial",
        action="store_const",
        const=True,
        help="batch: a shard that cannot be retried is given up and listed; the rest finish",
    )
    p.add_argument("--success-policy", help="chief (default) or all")
    p.add_argument(
        "--progress-pattern",
        dest="progress_pattern",
        help="read the step from output lines matching this regex: (?P<step>\\d+), and "
        "optional named groups of metrics, e.g. 'it (?P<step>\\d+) loss (?P<loss>\\S+)'",
    )
    p.add_argument(
        "--no-progress",
        dest="no_progress",
        action="store_const",
        const=True,
        help="do not read progress from the replicas' output (SDK reports only)",
    )
    p.add_argument(
        "--from-checkpoint",
        dest="initial_checkpoint",
        metavar="PATH",
        help="checkpoint.initial: start a new job from this checkpoint folder",
    )
    p.add_argument("--gpus", help="gpu_inventory: the GPU ids to use here, e.g. 0,1,2,3")
    p.add_argument(
        "--inject",
        action="append",
        dest="fault_injection",
        metavar="SPEC",
        help="fault_injection: e.g. signal:worker-1:SIGKILL@20s, stop:worker-0@step=50, master@30s",
    )
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="replica env")
    p.add_argument(
        "--retryable-error",
        action="append",
        dest="retryable_errors",
        metavar="REGEX",
        help="fault_tolerance.retryable_errors: a log text worth a retry (repeatable)",
    )
    for field, flag in _FT_FLAGS.items():
        p.add_argument(flag, dest=field, help=f"fault_tolerance.{field}")
    p.add_argument("--ft-args", help='AIMaster arguments, e.g. "--job-execution-mode=Sync ..."')
    p.add_argument(
        "--preload",
        help="preload: more modules for the warm start to import once (it finds torch, "
        "numpy, ... itself), e.g. transformers; `none` turns warm start off",
    )
    p.add_argument(
        "--no-preload",
        action="store_true",
        default=None,
        help="preload: none: every replica starts its own interpreter (no warm start)",
    )
    p.add_argument(
        "--backend",
        help="backend: local (default), ray, or slurm (default inside an allocation, "
        "with --nodes above 1)",
    )
    p.add_argument(
        "--nodes",
        help="slurm: nodes of the allocation the job uses, --nproc-per-node replicas each",
    )
    p.add_argument("--ray-address", help="ray.address: auto, HOST:PORT or ray://HOST:10001")
    p.add_argument("--placement-strategy", help="ray.placement_strategy: spread or pack")
    p.add_argument("--priority", help="queue.priority: higher runs first (server queue)")
    p.add_argument("--max-wait", dest="max_wait_s", help="queue.max_wait_s: then EXPIRED")
    p.add_argument(
        "--wait-for-capacity",
        action="store_true",
        default=None,
        help="queue.wait_for_capacity: wait rather than fail on a capacity shortage",
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before `--`, the replica command after it.

    `--ft-args "--job-execution-mode=Sync ..."` is glued into one token first: its value
    starts with `--`, which argparse would otherwise take for an option of its own.
    """
    head: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return head, argv[i + 1 :]
        if argv[i] == "--ft-args" and i + 1 < len(argv):
            head.append(f"--ft-args={argv[i + 1]}")
            i += 2
            continue
        head.append(argv[i])
        i += 1
    return head, []


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
            nodes = _whole("--nodes", args.nodes)
            per = _whole("--nproc-per-node", args.nproc or 1)
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
        return ["--nproc-per-node: applies to a command, not to a spec's worker_pools"]
    if args.groups is not None:
        return ["--groups: applies to a command, not to a spec's worker_pools"]
    return []


def _torchft_only(data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    if (args.framework or data.get("framework")) == "torchft":
        return []
    flags = (("--groups", args.groups), ("--nproc-per-group", args.nproc_per_group))
    return [f"{flag}: applies to --framework torchft only" for flag, v in flags if v is not None]


def _torchft_groups(data: dict[str, Any], args: argparse.Namespace) -> int | str:
    """The worker replicas of `--framework torchft --groups G --nproc-per-group N`: G*N
    (`--nproc-per-node K` alone: K groups of one rank); or what is wrong."""
    if args.groups is not None and args.nproc is not None:
        return "--groups and --nproc-per-node: give one of them (groups x --nproc-per-group)"
    counts: list[int] = []
    for flag, value in (
        ("--groups", args.groups or args.nproc),
        ("--nproc-per-group", args.nproc_per_group),
    ):
        n = _whole(flag, value if value is not None else 1)
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
            problems.append(f"--env: must be KEY=VALUE, got {shown(item)}")
        extra[key] = value
    data["worker_pools"] = [
        {**p, "env": {**p.get("env", {}), **extra}} if isinstance(p, dict) else p
        for p in data["worker_pools"]
    ]
    return problems


def _fault_tolerance(data: dict[str, Any], args: argparse.Namespace) -> None:
    ft: dict[str, Any] = dict(data.get("fault_tolerance") or {})
    if args.ft_args:
        ft.update(parse_ft_args(args.ft_args))
    for field in _FT_FLAGS:
        value = getattr(args, field)
        if value is not None:
            ft[field] = value
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
        raise SpecError([f"--from-checkpoint: {e}"]) from None
    if not files:
        raise SpecError([f"--from-checkpoint: {shown(str(path))} holds no file"])


def _the_rest(data: dict[str, Any], args: argparse.Namespace) -> None:
    for key in ("name", "framework", "success_policy", "allow_partial"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.initial_checkpoint is not None:
        path = Path(args.initial_checkpoint)
        if not path.is_dir():
            raise SpecError([f"--from-checkpoint: not a folder: {shown(args.initial_checkpoint)}"])
        _a_checkpoint(path)
        data["checkpoint"] = {**(data.get("checkpoint") or {}), "initial": str(path.resolve())}
    if args.fault_injection:
        data["fault_injection"] = [*data.get("fault_injection", []), *args.fault_injection]
    _merged(
        data, "ray", args, {"address": "ray_address", "placement_strategy": "placement_strategy"}
    )
    if args.preload is not None and args.no_preload:
        raise SpecError(["--preload and --no-preload: give one of them"])
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
    if args.gpus is not None:
        data["gpu_inventory"] = [g.strip() for g in args.gpus.split(",") if g.strip()]


def _whole(flag: str, value: object) -> int | str:
    """A count from 1 to MAX_REPLICAS from a flag, or what is wrong with it."""
    text = str(value).strip()
    if not text.lstrip("-").isdecimal():
        return f"{flag}: must be a whole number, got {shown(text)}"
    n = int(text) if len(text) <= 20 else MAX_REPLICAS + 1  # int() refuses 4300 digits
    if not 1 <= n <= MAX_REPLICAS:
        return f"{flag}: must be 1 to {MAX_REPLICAS}, got {shown(text)}"
    return n


def _many_nodes(data: dict[str, Any]) -> bool:
    nodes = (data.get("slurm") or {}).get("nodes")
    return isinstance(nodes, int) and nodes > 1


def _progress(data: dict[str, Any], args: argparse.Namespace) -> None:
    if args.progress_pattern is not None and args.no_progress:
        raise SpecError(["--progress-pattern and --no-progress: give one of them"])
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
    """`fault_tolerance.max_num_of_job_restart: ...` also names the flag that set it."""
    flags = {f"fault_tolerance.{f}": flag for f, flag in _FT_FLAGS.items()}
    flags.update(name="--job-name", framework="--framework", success_policy="--success-policy")
    flags["allow_partial"] = "--allow-partial"
    flags["gpu_inventory"] = "--gpus"
    flags.update({"queue.priority": "--priority", "queue.max_wait_s": "--max-wait"})
    flags.update({"backend": "--backend", "ray.placement_strategy": "--placement-strategy"})
    flags["preload"] = "--preload"
    flags["progress.pattern"] = "--progress-pattern"
    flags["slurm.nodes"] = "--nodes"
    field = line.split(":", 1)[0]
    for prefix, dest, flag in (
        ("fault_injection", "fault_injection", "--inject"),
        ("fault_tolerance.retryable_errors", "retryable_errors", "--retryable-error"),
    ):
        if field.startswith(prefix) and getattr(args, dest, None):
            return f"{line} (from {flag})"
    if ".env" in field and _from_env_flag(field, line, args.env):
        return f"{line} (from --env)"
    dest = {"progress.pattern": "progress_pattern"}.get(field, field.rsplit(".", 1)[-1])
    if field in flags and getattr(args, dest, None) is not None:
        return f"{line} (from {flags[field]})"
    return line


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
