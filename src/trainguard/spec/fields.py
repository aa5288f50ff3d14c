"""The one table of what a flag sets: each row's spec path, CLI flag, AIMaster spelling,
older spellings a spec may still use, and help.

The `run`/`submit` flags (cli.spec_flags), the `--ft-args` names (aimaster_flags), the
spec's accepted aliases (models) and the error lines that name the flag that set a value
are all made from it, so renaming a field or adding a flag is one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices

from trainguard.spec.frameworks import RULES

Action = Literal["value", "switch", "repeat", "file"]
"""How the CLI takes it: a value; a switch (set or absent, never False); a value per
repetition; a file's path."""


@dataclass(frozen=True)
class SpecField:
    path: str
    """Where the value goes in a spec (`fault_tolerance.job_hang_interval_s`); "" for a
    flag that shapes several places (the command's pools) or none."""
    flags: tuple[str, ...] = ()
    """The CLI's option strings, as --help lists them; error lines name the first long
    one. (): no flag."""
    help: str = ""
    """Empty: the path, which says what the flag sets."""
    dest: str = ""
    """argparse's name of it; "": the path's last part."""
    action: Action = "value"
    metavar: str | None = None
    aimaster: str = ""
    """AIMaster's name of it in `--ft-args` (`job-hang-interval`); "": none."""
    aliases: tuple[str, ...] = ()
    """Older spellings a spec may still use: trainguard's and AIMaster's, before the name
    carried its unit."""

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def section(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        return self.dest or self.name

    @property
    def flag(self) -> str:
        return next((f for f in self.flags if f.startswith("--")), "")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def _ft(
    name: str, flag: str = "", aimaster: str = "", aliases: tuple[str, ...] = (), *more: str
) -> SpecField:
    """A `fault_tolerance` field: --help shows its path; a duration's value is SECONDS;
    `more`: other spellings of the flag (torchrun's)."""
    return SpecField(
        f"fault_tolerance.{name}",
        (flag, *more) if flag else (),
        metavar="SECONDS" if name.endswith("_s") else None,
        aimaster=aimaster,
        aliases=aliases,
    )


FIELDS: tuple[SpecField, ...] = (
    SpecField("", ("-f", "--file"), "job spec (YAML)", dest="file", action="file"),
    SpecField("name", ("--job-name",), "the job's name"),
    SpecField(
        "",
        ("--nproc-per-node", "--nproc_per_node", "--nproc"),
        "replicas of the command",
        dest="nproc",
    ),
    SpecField("framework", ("--framework",), f"{', '.join(RULES)} (default pytorch)"),
    SpecField(
        "", ("--groups",), "torchft: replica groups of the command (default 1)", dest="groups"
    ),
    SpecField(
        "torchft.nproc_per_group", ("--nproc-per-group",), "torchft: ranks per group (default 1)"
    ),
    SpecField(
        "allow_partial",
        ("--allow-partial",),
        "batch: a shard that cannot be retried is given up and listed; the rest finish",
        action="switch",
    ),
    SpecField("success_policy", ("--success-policy",), "chief (default) or all"),
    SpecField(
        "progress.pattern",
        ("--progress-pattern",),
        "read the step from output lines matching this regex: (?P<step>\\d+), and "
        "optional named groups of metrics, e.g. 'it (?P<step>\\d+) loss (?P<loss>\\S+)'",
        dest="progress_pattern",
    ),
    SpecField(
        "progress.read",
        ("--no-progress",),
        "do not read progress from the replicas' output (SDK reports only)",
        dest="no_progress",
        action="switch",
    ),
    SpecField(
        "checkpoint.initial",
        ("--from-checkpoint",),
        "checkpoint.initial: start a new job from this checkpoint folder",
        dest="initial_checkpoint",
        metavar="PATH",
    ),
    SpecField(
        "gpu_inventory",
        ("--gpus",),
        "gpu_inventory: the GPU ids to use here, e.g. 0,1,2,3",
        dest="gpus",
    ),
    SpecField(
        "fault_injection",
        ("--inject",),
        "fault_injection: e.g. signal:worker-1:SIGKILL@20s, stop:worker-0@step=50, master@30s",
        action="repeat",
        metavar="SPEC",
    ),
    SpecField("", ("--env",), "replica env", dest="env", action="repeat", metavar="K=V"),
    SpecField(
        "fault_tolerance.retryable_errors",
        ("--retryable-error",),
        "fault_tolerance.retryable_errors: a log text worth a retry (repeatable)",
        action="repeat",
        metavar="REGEX",
    ),
    _ft("execution_mode", "--execution-mode", "job-execution-mode"),
    _ft("fault_tolerant_policy", "--fault-tolerant-policy", "fault-tolerant-policy"),
    _ft("enable_job_restart", "--enable-job-restart", "enable-job-restart"),
    _ft("max_num_of_job_restart", "--max-restarts", "max-num-of-job-restart", (), "--max_restarts"),
    _ft("max_replica_restarts", "--max-replica-restarts"),
    _ft("max_transient_restarts", "--max-transient-restarts"),
    _ft("max_uncertain_restarts", "--max-uncertain-restarts"),
    _ft("retry_uncertain", "--retry-uncertain"),
    _ft("enable_repeat_detection", "--enable-repeat-detection"),
    _ft("max_num_of_same_error", "--max-num-of-same-error", "max-num-of-same-error"),
    _ft("max_tolerated_failure_rate", "--max-tolerated-failure-rate", "max-tolerated-failure-rate"),
    _ft("enable_job_hang_detection", "--enable-job-hang-detection", "enable-job-hang-detection"),
    _ft(
        "job_hang_interval_s",
        "--job-hang-interval",
        "job-hang-interval",
        aliases=("job_hang_interval",),
    ),
    _ft("startup_timeout_s", "--startup-timeout"),
    _ft(
        "enable_job_exit_hang_detection",
        "--enable-job-exit-hang-detection",
        "enable-job-exit-hang-detection",
    ),
    _ft(
        "job_exit_hang_interval_s",
        "--job-exit-hang-interval",
        "job-exit-hang-interval",
        aliases=("job_exit_hang_interval",),
    ),
    _ft("stop_grace_period_s", "--stop-grace-period"),
    # AIMaster's switch for Alibaba Cloud's C4D detector: no flag, and the spec refuses
    # it turned on (models.FaultTolerance says why).
    _ft("enable_c4d_hang_detection", aimaster="enable-c4d-hang-detection"),
    SpecField(
        "",
        ("--ft-args",),
        'AIMaster arguments, e.g. "--job-execution-mode=Sync ..."',
        dest="ft_args",
    ),
    SpecField(
        "preload",
        ("--preload",),
        "preload: more modules for the warm start to import once (it finds torch, "
        "numpy, ... itself), e.g. transformers; `none` turns warm start off",
    ),
    SpecField(
        "preload",
        ("--no-preload",),
        "preload: none: every replica starts its own interpreter (no warm start)",
        dest="no_preload",
        action="switch",
    ),
    SpecField(
        "backend",
        ("--backend",),
        "backend: local (default), ray, or slurm (default inside an allocation, "
        "with --nodes above 1)",
    ),
    SpecField(
        "slurm.nodes",
        ("--nodes",),
        "slurm: nodes of the allocation the job uses, --nproc-per-node replicas each",
    ),
    SpecField(
        "slurm.agents",
        ("--node-agents",),
        "slurm.agents / ray.agents (the default): one agent per node forks its ranks "
        "(on Slurm, a step per node; on Ray, an actor per node)",
        action="switch",
    ),
    SpecField(
        "slurm.agents",
        ("--no-node-agents",),
        "slurm.agents: false: each rank its own srun step, supervised from this host "
        "(ray.agents: false: an actor per rank)",
        dest="no_node_agents",
        action="switch",
    ),
    SpecField(
        "ray.address",
        ("--ray-address",),
        "ray.address: auto, HOST:PORT or ray://HOST:10001",
        dest="ray_address",
    ),
    SpecField(
        "ray.placement_strategy",
        ("--placement-strategy",),
        "ray.placement_strategy: spread or pack",
    ),
    SpecField(
        "queue.priority", ("--priority",), "queue.priority: higher runs first (server queue)"
    ),
    SpecField("queue.max_wait_s", ("--max-wait",), "queue.max_wait_s: then EXPIRED"),
    SpecField(
        "queue.wait_for_capacity",
        ("--wait-for-capacity",),
        "queue.wait_for_capacity: wait rather than fail on a capacity shortage",
        action="switch",
    ),
)

FLAGGED: dict[str, SpecField] = {f.key: f for f in FIELDS if f.flags}
"""The rows with a CLI flag, by argparse name."""

FT_FLAGGED: tuple[SpecField, ...] = tuple(
    f for f in FIELDS if f.flags and f.section == "fault_tolerance" and f.action == "value"
)
"""The `fault_tolerance` fields a flag sets as given (the spec validates the value)."""

AIMASTER: dict[str, SpecField] = {f.aimaster: f for f in FIELDS if f.aimaster}
"""AIMaster's `--ft-args` names."""

_BY_PATH: dict[str, SpecField] = {f.path: f for f in FIELDS if f.path}
"""The rows by spec path (`preload`'s two flags: the latter; neither has older spellings)."""


def flag(key: str) -> str:
    """The flag an error line names for argparse's `key` (`nodes` -> `--nodes`)."""
    return FLAGGED[key].flag


def spelled(path: str) -> AliasChoices:
    """Every spelling a spec may use for the field at `path` (its name first)."""
    return AliasChoices(*_BY_PATH[path].spellings)


def set_field(section: dict[str, object], path: str, value: object) -> None:
    """`section[name] = value`, dropping the field's other spellings (a flag beats a
    spec file's `job_hang_interval`, which would otherwise be the same field twice)."""
    row = _BY_PATH[path]
    for word in row.aliases:
        section.pop(word, None)
    section[row.name] = value


def unspelled(defaults: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """The `defaults` whose field `section` gives under none of its spellings (a preset's
    default must not meet a spec's older spelling of the same field)."""
    given = set(section)
    for row in _BY_PATH.values():
        if row.aliases and given & set(row.spellings):
            given |= set(row.spellings)
    return {k: v for k, v in defaults.items() if k not in given}
