"""The HTTP API reference: the OpenAPI schema of the server's FastAPI apps, built by
`service.api.create_app` without a server or a store, as Markdown."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI
from refmd import code, first_paragraph, prose, table, value
from starlette.routing import Mount

from trainguard.service.api import create_app

if TYPE_CHECKING:
    from trainguard.service.scheduler import Service

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


@dataclass(frozen=True)
class Api:
    """One FastAPI app of the server: where it is mounted, what guards it, its schema."""

    prefix: str
    guards: tuple[str, ...]  # the names of the dependencies every route of it runs
    schema: dict[str, Any]


def apps() -> list[Api]:
    """The server's app and the apps mounted in it. Building them reads nothing from the
    service (its routes close over it), so a stand-in with no store and no token will do."""
    stand_in = SimpleNamespace(store=None, config=SimpleNamespace(token=None))
    root = create_app(cast("Service", stand_in))
    out = [Api("", _guards(root), root.openapi())]
    for route in root.routes:
        if isinstance(route, Mount) and isinstance(route.app, FastAPI):
            mounted = route.app
            out.append(Api(route.path, _guards(mounted), mounted.openapi()))
    return out


def _guards(app: FastAPI) -> tuple[str, ...]:
    return tuple(getattr(d.dependency, "__name__", "?") for d in app.router.dependencies)


def operations(api: Api) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) of every route of `api`, in the order it declares them."""
    for path, item in api.schema.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                yield method.upper(), api.prefix + path, item[method]


def schema_text(schema: dict[str, Any]) -> str:
    """A JSON schema in a few words: `$ref` names, types, items, bounds."""
    if "$ref" in schema:
        return str(schema["$ref"]).rpartition("/")[2]
    if "anyOf" in schema:
        return " or ".join(schema_text(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {schema_text(schema.get('items', {}))}"
    words = [str(kind) if kind else "any"]
    for key, form in (("minimum", "≥ {}"), ("maximum", "≤ {}"), ("pattern", "matching {}")):
        if key in schema:
            words.append(form.format(schema[key]))
    return ", ".join(words)


def _common_headers(api: Api) -> list[str]:
    """The header parameters every route of `api` takes (its guards'), listed once."""
    sets = [
        {p["name"] for p in op.get("parameters", []) if p.get("in") == "header"}
        for _, _, op in operations(api)
    ]
    return sorted(set.intersection(*sets)) if sets else []


def _parameters(op: dict[str, Any], skip: list[str]) -> str:
    rows = [
        [
            code(p["name"]),
            p.get("in", ""),
            "yes" if p.get("required") else "no",
            code(schema_text(p.get("schema", {}))),
            value(p["schema"]["default"]) if "default" in p.get("schema", {}) else "",
        ]
        for p in op.get("parameters", [])
        if p["name"] not in skip
    ]
    return table(["Parameter", "In", "Required", "Type", "Default"], rows) if rows else ""


def _body(op: dict[str, Any]) -> str:
    body = op.get("requestBody")
    if body is None:
        return ""
    kinds = [
        f"{code(media)}: {code(schema_text(c.get('schema', {})))}"
        + (f" ({code(c['schema']['title'])})" if "title" in c.get("schema", {}) else "")
        for media, c in body.get("content", {}).items()
    ]
    need = "required" if body.get("required") else "optional"
    return f"Request body ({need}): {', '.join(kinds)}"


def _responses(op: dict[str, Any]) -> str:
    rows = []
    for status, answer in op.get("responses", {}).items():
        content = answer.get("content", {})
        bodies = ", ".join(
            f"{code(media)}: {code(schema_text(c.get('schema', {})))}"
            for media, c in content.items()
        )
        rows.append([code(status), prose(answer.get("description", "")), bodies])
    return table(["Status", "Meaning", "Body"], rows)


def render_operation(method: str, path: str, op: dict[str, Any], skip: list[str]) -> str:
    parts = [f"### `{method} {path}`", "", f"**{prose(op.get('summary', ''))}**", ""]
    if op.get("description"):
        parts += [prose(first_paragraph(op["description"])), ""]
    for piece in (_parameters(op, skip), _body(op), _responses(op)):
        parts += [piece, ""] if piece else []
    return "\n".join(parts)


def render() -> str:
    parts: list[str] = []
    for api in apps():
        ops = list(operations(api))
        if not ops:
            continue
        guards = ", ".join(code(g) for g in api.guards)
        parts += [f"## Routes behind {guards}" if guards else "## Open routes", ""]
        headers = _common_headers(api) if api.guards else []
        if headers:
            parts += [f"Each also takes the headers {', '.join(map(code, headers))}.", ""]
        parts += [render_operation(m, p, op, headers) for m, p, op in ops]
    return "\n".join(parts)
