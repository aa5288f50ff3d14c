"""The job spec reference: every field of `JobSpec` and the sections it holds, walked
through pydantic's `model_fields`, with the flag, AIMaster name and help of its row in
`spec.fields` (the one table of what a flag sets)."""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from refmd import code, field_notes, first_paragraph, prose, table, value

from trainguard.spec.fields import FIELDS, SpecField
from trainguard.spec.frameworks import RULES, FrameworkRules
from trainguard.spec.limits import MAX_LIMIT, UNLIMITED, Limit
from trainguard.spec.models import JobSpec

_BOUNDS = (
    ("ge", "≥ {}"),
    ("gt", "> {}"),
    ("le", "≤ {}"),
    ("lt", "< {}"),
    ("min_length", "at least {} long"),
    ("max_length", "at most {} long"),
)


@dataclass(frozen=True)
class Leaf:
    """One field that holds a value (not a section): a row of the reference."""

    path: str  # `worker_pools[].resources.cpus`
    field: FieldInfo
    notes: str  # what the model's source says beside it


@dataclass(frozen=True)
class Section:
    """A model and where it sits in a spec (`` for the top level)."""

    path: str
    model: type[BaseModel]
    leaves: tuple[Leaf, ...]


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> X; `Annotated[X, ...]` -> X."""
    if get_origin(annotation) is Annotated:
        return _unwrap(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _model_in(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds and the path suffix to reach it (`[]` for a list's items,
    `.*` for a mapping's values), or None for a value."""
    kind = _unwrap(annotation)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind, ""
    if get_origin(kind) is list:
        inner = _model_in(get_args(kind)[0])
        return (inner[0], "[]" + inner[1]) if inner else None
    if get_origin(kind) is dict:
        inner = _model_in(get_args(kind)[1])
        return (inner[0], ".*" + inner[1]) if inner else None
    return None


def sections(model: type[BaseModel] = JobSpec, path: str = "") -> list[Section]:
    """`model` and every model under it, depth first, in field order."""
    notes = field_notes(model)
    leaves: list[Leaf] = []
    below: list[Section] = []
    for name, info in model.model_fields.items():
        where = f"{path}.{name}" if path else name
        inner = _model_in(info.annotation)
        if inner is None:
            leaves.append(Leaf(where, info, notes.get(name, "")))
        else:
            below += sections(inner[0], where + inner[1])
    return [Section(path, model, tuple(leaves)), *below]


def type_name(annotation: Any) -> str:
    """A field's type as a spec writer reads it."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _limits(metadata: list[Any], each: str = "") -> list[str]:
    """The bounds the pydantic metadata declares, as Markdown (`each `: a list's items')."""
    out: list[str] = []
    for item in metadata:
        if any(item is mark for mark in get_args(Limit)[1:]):
            out.append(prose(f'{each}0 to {MAX_LIMIT}, or "{UNLIMITED}" (also -1)'))
        for attr, form in _BOUNDS:
            bound = getattr(item, attr, None)
            if bound is not None:
                out.append(prose(each + form.format(bound)))
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"{each}matches {code(pattern)}")
    return out


def bounds(info: FieldInfo) -> str:
    """The field's declared bounds, and its items' (a list of bounded numbers)."""
    out = _limits(info.metadata)
    kind = _unwrap(info.annotation)
    if get_origin(kind) is list:
        inner = get_args(kind)[0]
        if get_origin(inner) is Annotated:
            marks = [m for arg in get_args(inner)[1:] for m in getattr(arg, "metadata", [arg])]
            out += _limits(marks, "each ")
    return "; ".join(out)


def default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    given = info.get_default(call_default_factory=True, validated_data={})
    if given is PydanticUndefined:
        return "required"
    return value(given.value if isinstance(given, enum.Enum) else given)


def kind(info: FieldInfo) -> str:
    """The type, the default and the bounds of a field, a line each."""
    limits = bounds(info)
    given = default(info)
    lines = [code(type_name(info.annotation)), given if given == "required" else f"default {given}"]
    return "<br>".join([*lines, limits] if limits else lines)


def rows_for(path: str) -> list[SpecField]:
    """The rows of `spec.fields` that set the field at `path` (a list's items unnamed)."""
    bare = path.replace("[]", "")
    return [row for row in FIELDS if row.path == bare]


def set_by(leaf: Leaf) -> str:
    """Its flags, its AIMaster `--ft-args` name, and the other spellings a spec may use."""
    out: list[str] = []
    rows = rows_for(leaf.path)
    out += [code(row.flag) for row in rows if row.flag]
    out += [f"AIMaster {code('--' + row.aimaster)}" for row in rows if row.aimaster]
    alias = leaf.field.validation_alias
    name = leaf.path.rpartition(".")[2]
    others = alias.choices if isinstance(alias, AliasChoices) else []
    out += [f"also {code(str(a))}" for a in others if isinstance(a, str) and a != name]
    return "<br>".join(out)


def description(leaf: Leaf) -> str:
    """The model's description, else the flag's help, else the source's comment."""
    if leaf.field.description:
        return prose(leaf.field.description)
    bare = leaf.path.replace("[]", "")
    for row in rows_for(leaf.path):
        text = row.help
        for prefix in (bare, row.name, row.section):  # help that names what it sets
            text = text.removeprefix(f"{prefix}: ")
        if text and text != bare:
            return prose(text)
    return prose(leaf.notes)


def _heading(section: Section) -> str:
    return f"`{section.path}`" if section.path else "Top level"


def render_section(section: Section) -> str:
    intro = first_paragraph(section.model.__doc__)
    rows = [
        [code(leaf.path), kind(leaf.field), set_by(leaf), description(leaf)]
        for leaf in section.leaves
    ]
    heads = ["Field", "Type, default, bounds", "Set by", "Description"]
    parts = [f"## {_heading(section)}", ""]
    parts += [prose(intro), ""] if intro else []
    return "\n".join([*parts, table(heads, rows), ""])


def _own(rules: FrameworkRules, method: str) -> str:
    """The docstring of `method` where the preset overrides it: a default that depends."""
    own = type(rules).__dict__.get(method)
    return first_paragraph(own.__doc__) if own is not None and own.__doc__ else ""


def render_presets() -> str:
    """What each `framework` value implies for the spec: roles, backends, defaults."""
    rows = []
    for name, rules in RULES.items():
        implied = dict(rules.ft_defaults_for([]))
        defaults = [f"{code(f'fault_tolerance.{k}: {v}')}" for k, v in implied.items()]
        if rules.success_policy:
            defaults.append(code(f"success_policy: {rules.success_policy}"))
        if rules.partial_results:
            defaults.append(f"{code('allow_partial')} allowed")
        depends = _own(rules, "ft_defaults_for")
        roles = ", ".join(code(r) for r in sorted(rules.roles)) if rules.roles else "any"
        rows.append(
            [
                code(name),
                roles,
                ", ".join(code(b) for b in sorted(rules.backends)),
                "<br>".join(defaults) + (f"<br>{prose(depends)}" if depends else ""),
            ]
        )
    heads = ["Framework", "Roles", "Backends", "Defaults it sets where the spec does not"]
    return "\n".join(["## Framework presets", "", table(heads, rows), ""])


def render_spellings(leaves: set[str]) -> str:
    """Rows of `spec.fields` with a spec path that is no field: names a spec may give
    (AIMaster's) that the models take apart themselves."""
    rows = [
        [code(row.path), code(row.flag) if row.flag else "", code("--" + row.aimaster)]
        for row in FIELDS
        if row.path and row.path not in leaves
    ]
    if not rows:
        return ""
    heads = ["Name", "Flag", "AIMaster"]
    return "\n".join(["## Names that are not fields", "", table(heads, rows), ""])


def render() -> str:
    parts = [render_section(s) for s in sections()]
    leaves = {leaf.path.replace("[]", "") for s in sections() for leaf in s.leaves}
    parts += [render_presets(), render_spellings(leaves)]
    return "\n".join(p for p in parts if p)
