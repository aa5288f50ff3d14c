"""The replica environment reference: what each framework preset and trainguard itself
set, read from the launches the master would build for a small example job
(`master.launch.LaunchBuilder`, the one place a replica's environment is put together),
and what a backend's placement over nodes changes (`backends.slurm.placement`)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from refmd import bare_environment, code, first_paragraph, module_notes, prose, table

from trainguard.backends.interface import Launch
from trainguard.backends.slurm.placement import layout_env
from trainguard.frameworks import PRESETS, EnvContext, Preset
from trainguard.frameworks.node_env import OWN_DEVICES
from trainguard.frameworks.replica_plan import plan_replicas, replica_env
from trainguard.master.launch import LaunchBuilder
from trainguard.spec.frameworks import RULES
from trainguard.spec.models import validate_spec
from trainguard.storage import env as storage_env

COMMAND = ["python", "train.py"]
REPLICAS = 2
"""The example: `trainguard run --framework NAME --nproc-per-node 2 -- python train.py`."""

NAMED_IN = (
    "trainguard.storage.env",
    "trainguard.backends.interface",
    "trainguard.frameworks.node_env",
)
"""Modules whose constants name the variables trainguard sets, and say what they are."""


@dataclass(frozen=True)
class Example:
    """The launches of one preset's example job, and what of each the preset set."""

    preset: Preset
    launches: tuple[Launch, ...]
    preset_env: Mapping[str, Mapping[str, str]]  # replica -> the preset's variables


def example(name: str) -> Example:
    """The first attempt's launches of the example job under preset `name`, each handed
    the GPU of its rank, built in a bare environment (nothing inherited from the builder's)."""
    preset = PRESETS[name]
    with bare_environment():
        spec = validate_spec(
            {
                "name": "example",
                "framework": name,
                "worker_pools": RULES[name].pools_for(COMMAND, REPLICAS),
            }
        )
        plans = tuple(plan_replicas(spec))
        builder = LaunchBuilder(
            job_id="example",
            preset=preset,
            plans=plans,
            log_dir=Path("JOB/logs"),
            cwd="JOB",
            max_restarts=spec.fault_tolerance.max_num_of_job_restart,
            spec=spec,
        )
        builder.use_tasks({p.name: f"10.0.0.{p.rank + 1}:{29500 + p.rank}" for p in plans})
        rendezvous = ("10.0.0.1", 29400)
        launches = tuple(builder.build(p, 0, 0, rendezvous, {}, str(p.rank)) for p in plans)
        roster = builder.roster
        if roster is None:
            raise RuntimeError("LaunchBuilder.use_tasks gave the builder no roster")
        own = {
            p.name: preset.env(
                EnvContext(p, roster, "example", *rendezvous, 0, builder.max_restarts)
            )
            for p in plans
        }
    return Example(preset, launches, own)


def variable_notes() -> dict[str, str]:
    """variable name -> what the constant that names it says."""
    out: dict[str, str] = {}
    for module in NAMED_IN:
        values = vars(importlib.import_module(module))
        for const, note in module_notes(module).items():
            name = values.get(const)
            if isinstance(name, str) and name.isupper() and note:
                out.setdefault(name, note)
    return out


def own_variables(examples: list[Example]) -> list[str]:
    """trainguard's variables: the SDK's and the storage's (`storage.env`), then what the
    launches add beyond the presets' (`TRAINGUARD_OWN_DEVICES` is taken out by every
    backend before a process sees it)."""
    names = [v for k, v in vars(storage_env).items() if k.startswith("ENV_") and isinstance(v, str)]
    for ex in examples:
        for la in ex.launches:
            names += [k for k in la.env if k not in ex.preset_env[la.replica]]
    return [n for n in dict.fromkeys(names) if n != OWN_DEVICES]


def render_own(examples: list[Example]) -> str:
    notes = variable_notes()
    sample = {k: v for ex in reversed(examples) for la in ex.launches for k, v in la.env.items()}
    rows = [
        [code(n), code(sample[n]) if n in sample else "", prose(notes.get(n, ""))]
        for n in own_variables(examples)
    ]
    precedence = first_paragraph(replica_env.__doc__)
    return "\n".join(
        [
            "## Every replica",
            "",
            f"Set by trainguard whatever the framework. Precedence: {prose(precedence)}",
            "",
            table(["Variable", "Example", "About"], rows),
            "",
        ]
    )


def _about(preset: Preset) -> str:
    module = inspect.getmodule(type(preset))
    return first_paragraph(module.__doc__ if module else "")


def render_preset(name: str, ex: Example) -> str:
    roles = {la.replica: la.replica.rpartition("-")[0] for la in ex.launches}
    order: dict[str, list[str]] = {}
    for la in ex.launches:
        for var in ex.preset_env[la.replica]:
            order.setdefault(var, []).append(la.replica)
    rows = []
    for var, replicas in order.items():
        last = replicas[-1]
        who = sorted({roles[r] for r in replicas}, key=list(roles.values()).index)
        rows.append(
            [
                code(var),
                ", ".join(code(r) for r in who),
                f"{code(ex.preset_env[last][var])} ({last})",
            ]
        )
    job = ", ".join(code(la.replica) for la in ex.launches)
    parts = [f"### {name}", "", prose(_about(ex.preset)), "", f"Example replicas: {job}.", ""]
    if rows:
        parts += [table(["Variable", "Roles", "Example"], rows), ""]
    else:
        own = type(ex.preset).__dict__.get("env")
        why = first_paragraph(own.__doc__) if own is not None and own.__doc__ else ""
        parts += [f"None. {prose(why)}".strip(), ""]
    return "\n".join(parts)


def render_placement(ex: Example) -> str:
    """What the Slurm backend's layout of the pytorch example over two nodes changes."""
    launches = {la.replica: la for la in ex.launches}
    nodes = {r: f"node-{i}" for i, r in enumerate(launches)}
    layout = layout_env(launches, nodes)
    replicas = list(layout)
    names: dict[str, None] = {}
    for changes, task in layout.values():
        names.update(dict.fromkeys([*changes, *task]))
    rows = [
        [code(n), *(code({**layout[r][0], **layout[r][1]}.get(n, "")) for r in replicas)]
        for n in names
    ]
    where = ", ".join(f"{code(r)} on {code(nodes[r])}" for r in replicas)
    return "\n".join(
        [
            "## Placement over nodes",
            "",
            f"Once a backend has placed the ranks, it lays out again what depends on where "
            f"they landed. The pytorch example on Slurm, {where}:",
            "",
            table(["Variable", *(code(r) for r in replicas)], rows),
            "",
        ]
    )


def render() -> str:
    examples = [example(name) for name in PRESETS]
    parts = [render_own(examples), "## Framework presets", ""]
    parts += [render_preset(name, ex) for name, ex in zip(PRESETS, examples, strict=True)]
    parts.append(render_placement(examples[list(PRESETS).index("pytorch")]))
    return "\n".join(parts)
