"""The base of every spec model: unknown fields are errors, values are frozen, NaN or
infinity is never a meaningful interval, size or rate, a yes/no is never a number, and a
field is given once, under one of its spellings.

Pydantic (lax) takes `replicas: true` as 1 and `timeout_s: false` as 0.0; a bool where a
count or a duration belongs is a slip (a misplaced line, a wrong key), so it is refused,
for every numeric field of every section, lists and mappings of numbers included.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, model_validator
from pydantic.fields import FieldInfo


def _numeric(annotation: Any) -> bool:
    """True if the type takes numbers but not a bool (int, float, `Limit`, optional ones)."""
    if annotation in (int, float):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _numeric(args[0])
    if origin in (Union, types.UnionType):
        return any(_numeric(a) for a in args) and not any(_admits_bool(a) for a in args)
    return False


def _admits_bool(annotation: Any) -> bool:
    if annotation in (bool, Any):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _admits_bool(args[0])
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    if origin in (Union, types.UnionType):
        return any(_admits_bool(a) for a in args)
    return False


def _spellings(name: str, field: FieldInfo) -> list[str]:
    """The keys a spec may give the field by: its name, or the older spellings its
    `validation_alias` accepts (spec.fields)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [a for a in alias.choices if isinstance(a, str)]
    return [alias] if isinstance(alias, str) else [name]


def _items(annotation: Any, value: Any) -> list[tuple[str, Any, Any]]:
    """(suffix, item, item type) of a list or a mapping field; the value alone otherwise."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _items(args[0], value)
    if origin in (Union, types.UnionType):
        for arg in args:
            if get_origin(arg) in (list, dict) or get_origin(arg) is Annotated:
                return _items(arg, value)
    if get_origin(annotation) is list and args and isinstance(value, list):
        return [(f"[{i}]", item, args[0]) for i, item in enumerate(value)]
    if get_origin(annotation) is dict and len(args) == 2 and isinstance(value, dict):
        return [(f".{k}", item, args[1]) for k, item in value.items()]
    return [("", value, annotation)]


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            given = [key for key in _spellings(name, field) if key in data]
            if len(given) > 1:
                raise ValueError(f"{given[0]}: given twice, also as {given[1]}; give one of them")
            if not given or any(isinstance(m, BeforeValidator) for m in field.metadata):
                continue  # absent, or a field that converts its input itself (`Limit`)
            for suffix, item, kind in _items(field.annotation, data[given[0]]):
                if isinstance(item, bool) and _numeric(kind):
                    raise ValueError(
                        f"{given[0]}{suffix}: must be a number, got {str(item).lower()}"
                    )
        return data
