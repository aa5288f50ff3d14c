"""The generated reference (docs/hooks/reference.py) leaves nothing out: every leaf field
of the spec, every CLI option, every catalogue signature, every HTTP route and every
variable a launch gets appears on its page. What is expected is read here from the code
by another road (pydantic's JSON schema, the parser's actions, the yaml, the routes), so
a generator that drops something fails. In-process: no subprocess, no server."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast
from unittest import mock

import pytest
import yaml
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Mount

from trainguard.cli.parser import INTERNAL, build_parser
from trainguard.frameworks import PRESETS
from trainguard.frameworks.node_env import OWN_DEVICES
from trainguard.service.api import create_app
from trainguard.spec.fields import FIELDS
from trainguard.spec.models import JobSpec
from trainguard.storage import env as storage_env

DOCS = Path(__file__).resolve().parents[2] / "docs"
HOOK = DOCS / "hooks" / "reference.py"


def _load_hook() -> ModuleType:
    """The hook as MkDocs loads it: by path, its folder on sys.path while it runs."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.path.copy()
    sys.path.insert(0, str(HOOK.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return _load_hook()


@pytest.fixture(scope="module")
def pages(hook: ModuleType) -> dict[str, str]:
    return {name: render() for name, render in hook.GENERATORS.items()}


# ------------------------------------------------------------------ the job spec


def _leaves(schema: dict[str, Any], node: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, property schema) of every value of a JSON schema, sections walked."""
    for name, prop in node.get("properties", {}).items():
        where = f"{path}.{name}" if path else name
        target, suffix = prop, ""
        options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
        if len(options) == 1:
            target = options[0]
        if target.get("type") == "array" and "$ref" in target.get("items", {}):
            target, suffix = target["items"], "[]"
        if "$ref" in target:
            ref = schema["$defs"][target["$ref"].rpartition("/")[2]]
            if "properties" in ref:
                yield from _leaves(schema, ref, where + suffix)
                continue
        yield where, prop


def _spec_leaves() -> list[tuple[str, Any]]:
    schema = JobSpec.model_json_schema()
    return list(_leaves(schema, schema, ""))


def _row(page: str, first_cell: str) -> str:
    """The table row whose first cell is `first_cell`."""
    rows = [line for line in page.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"{first_cell}: {len(rows)} rows"
    return rows[0]


def test_every_leaf_field_of_the_spec_has_a_row(pages: dict[str, str]) -> None:
    leaves = _spec_leaves()
    assert len(leaves) > 80  # the walk reached the sections, worker_pools' items included
    for path, _ in leaves:
        _row(pages["spec"], f"`{path}`")
    fields = pages["spec"].split("## Framework presets")[0]
    rows = [line for line in fields.splitlines() if line.startswith("| `")]
    assert len(rows) == len(leaves)


def test_spec_rows_carry_defaults_and_bounds(pages: dict[str, str]) -> None:
    for path, prop in _spec_leaves():
        row = _row(pages["spec"], f"`{path}`")
        if "default" in prop:
            assert f"`{json.dumps(prop['default'])}`" in row, path
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            for option in prop.get("anyOf", [prop]):
                if key in option:
                    assert str(option[key]) in row, (path, key)
        if "pattern" in prop:
            assert prop["pattern"] in row, path
    assert "required" in _row(pages["spec"], "`worker_pools[].command`")
    limit = _row(pages["spec"], "`fault_tolerance.max_num_of_job_restart`")
    assert '"unlimited"' in limit and "1000000000" in limit


def test_spec_rows_name_their_flags_aimaster_names_and_spellings(pages: dict[str, str]) -> None:
    spec = pages["spec"]
    for row in FIELDS:
        if not row.path:
            continue
        assert f"`{row.path}`" in spec, row.path
        if row.flag:
            assert f"`{row.flag}`" in spec, row.flag
        if row.aimaster:
            assert f"`--{row.aimaster}`" in spec, row.aimaster
    hang = _row(spec, "`fault_tolerance.job_hang_interval_s`")
    assert "`--job-hang-interval`" in hang and "also `job_hang_interval`" in hang
    assert "AIMaster `--job-hang-interval`" in hang


def test_spec_descriptions_come_from_the_help_or_the_source(pages: dict[str, str]) -> None:
    spec = pages["spec"]
    assert "the job's name" in _row(spec, "`name`")
    assert "imports and data loading are not a hang" in _row(
        spec, "`fault_tolerance.startup_timeout_s`"
    )
    assert "type: ignore" not in spec


# ------------------------------------------------------------------ the command line


def _grammar() -> argparse.ArgumentParser:
    with mock.patch.dict(os.environ, {}, clear=True):
        return build_parser(None)


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub for name, sub in action.choices.items() if name not in INTERNAL}


def test_every_command_and_option_appears(pages: dict[str, str]) -> None:
    cli = pages["cli"]
    p = _grammar()
    subs = _subparsers(p)
    assert len(subs) > 10
    for name, sub in {"": p, **subs}.items():
        if name:
            assert f"## `trainguard {name}`" in cli, name
        for action in sub._actions:
            for option in action.option_strings:
                assert f"`{option}`" in cli, (name, option)
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert f"`{action.dest}`" in cli, (name, action.dest)
            for choice in action.choices or () if name else ():
                assert str(choice) in cli, (name, choice)
    for internal in INTERNAL:
        assert f"trainguard {internal}" not in cli


def test_options_carry_help_and_defaults(pages: dict[str, str]) -> None:
    cli = pages["cli"]
    assert "| `--limit` | `LIMIT` | `50` |" in cli
    watch = _row(cli, "`-w`, `--watch`")
    assert "`[SECONDS]`" in watch and "until the job ends" in watch
    assert "Not with `--signal`" in _row(cli, "`--exit-code`")


# ------------------------------------------------------------------ the catalogue


def test_every_signature_appears(pages: dict[str, str]) -> None:
    text = resources.files("trainguard.classify").joinpath("signatures.yaml").read_text()
    entries = yaml.safe_load(text)["signatures"]
    assert len(entries) > 40
    page = pages["failures"]
    for entry in entries:
        sid = entry["id"]
        row = _row(page, f"[`{sid}`](#{sid})")
        assert f"`{entry['class']}`" in row
        assert ("| yes |" if entry["retryable"] else "| no |") in row
        assert f"| {float(entry.get('confidence', 0.9)):g} |" in row
        assert f"### {sid} {{ #{sid} }}" in page
        assert entry["reason"].split()[0] in page


def test_the_default_decision_is_the_policys(pages: dict[str, str]) -> None:
    page = pages["failures"]
    assert "| ends the job |" in _row(page, "[`python-bug`](#python-bug)")
    assert "| retried |" in _row(page, "[`preemption-notice`](#preemption-notice)")
    assert "| retried (uncertain) |" in _row(page, "[`gpu-busy`](#gpu-busy)")


def test_most_signatures_show_a_line_of_a_real_log_they_explain(hook: ModuleType) -> None:
    """Each example is a line pasted in the public thread it names, and the catalogue's
    first match for it is its signature."""
    from trainguard.classify.catalogue import builtin_catalogue, first_match

    sigs = builtin_catalogue()
    examples = sys.modules["ref_failures"].real_examples(sigs)
    assert len(examples) >= 0.9 * len(sigs), sorted(s.id for s in sigs if s.id not in examples)
    by_id = {s.id: s for s in sigs}
    for sid, (line, url) in examples.items():
        assert first_match(sigs, line) is by_id[sid] and url.startswith("https://"), sid


def test_patterns_split_into_alternatives_losslessly(hook: ModuleType) -> None:
    split = sys.modules["ref_failures"].alternatives
    assert split(r"a|b(c|d)|[|x]|\|y") == ["a", "b(c|d)", "[|x]", r"\|y"]


# ------------------------------------------------------------------ the HTTP API


def _routes() -> list[tuple[str, str]]:
    stand_in = SimpleNamespace(store=None, config=SimpleNamespace(token=None))
    root = create_app(cast(Any, stand_in))
    apps: list[tuple[str, FastAPI]] = [("", root)]
    apps += [
        (r.path, r.app) for r in root.routes if isinstance(r, Mount) and isinstance(r.app, FastAPI)
    ]
    return [
        (method, prefix + route.path)
        for prefix, app in apps
        for route in app.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in sorted(route.methods or ())
    ]


def test_every_route_appears(pages: dict[str, str]) -> None:
    routes = _routes()
    assert len(routes) > 15
    for method, path in routes:
        assert f"### `{method} {path}`" in pages["http-api"], (method, path)
    page = pages["http-api"]
    jobs = page[page.index("### `GET /api/jobs`") :]
    assert "| `limit` | query | no | `integer, ≥ 1, ≤ 10000` | `50` |" in jobs
    assert "Request body (required)" in page[page.index("### `POST /api/jobs`") :]


# ------------------------------------------------------------------ the environment


def test_every_variable_of_every_launch_appears(hook: ModuleType, pages: dict[str, str]) -> None:
    env_ref = sys.modules["ref_env"]
    page = pages["environment"]
    for name in PRESETS:
        assert f"### {name}" in page
        for launch in env_ref.example(name).launches:
            for var in launch.env:
                if var != OWN_DEVICES:
                    assert f"`{var}`" in page, (name, var)
    for const, var in vars(storage_env).items():
        if const.startswith("ENV_"):
            assert f"`{var}`" in page
    assert f"`{OWN_DEVICES}`" not in page
    for var in ("RANK", "TF_CONFIG", "SHARD_INDEX", "TORCHFT_LIGHTHOUSE", "SLURM_PROCID"):
        assert f"`{var}`" in page


def test_the_builders_environment_does_not_leak_in(hook: ModuleType) -> None:
    with mock.patch.dict(os.environ, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}):
        page = hook.GENERATORS["environment"]()
    assert "| `TORCH_NCCL_ASYNC_ERROR_HANDLING` | `worker` | `1` (worker-1) |" in page


# ------------------------------------------------------------------ the states


def test_every_move_of_the_transitions_table_is_on_the_page(pages: dict[str, str]) -> None:
    from trainguard.states import JOB_MOVES, REPLICA_MOVES

    for name, graph in (("job-moves", JOB_MOVES), ("replica-moves", REPLICA_MOVES)):
        page = pages[name]
        for state, targets in graph.items():
            row = _row(page, f"`{state.value}`")
            assert all(f"`{t.value}`" in row for t in targets), (state, row)
            assert row.count("`") == 2 * (1 + len(targets)), row  # no move it does not make
    assert "(final)" in _row(pages["job-moves"], "`SUCCEEDED`")


# ------------------------------------------------------------------ the hook


def test_reference_pages_hold_known_markers(hook: ModuleType) -> None:
    found = set()
    for page in sorted([*(DOCS / "reference").glob("*.md"), DOCS / "concepts" / "states.md"]):
        names = hook.MARKER.findall(page.read_text())
        assert all(n in hook.GENERATORS for n in names), page.name
        found.update(names)
    assert found == set(hook.GENERATORS)
    assert "::: trainguard.sdk" in (DOCS / "reference" / "sdk.md").read_text()


def test_the_hook_replaces_markers_and_refuses_unknown_ones(hook: ModuleType) -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_uri="reference/x.md"))
    out = hook.on_page_markdown("# X\n\n<!-- reference: failures -->\n", page, None, None)
    assert "<!--" not in out and "### cuda-oom" in out
    with pytest.raises(Exception, match=r"reference/x\.md: unknown reference 'nope'"):
        hook.on_page_markdown("<!-- reference: nope -->\n", page, None, None)
    assert hook.expand("no marker here") == "no marker here"


def test_output_is_deterministic(hook: ModuleType, pages: dict[str, str]) -> None:
    for name, render in hook.GENERATORS.items():
        assert render() == pages[name], name


def test_cells_keep_their_table_whole(hook: ModuleType) -> None:
    refmd = sys.modules["refmd"]
    cell = refmd.prose("a | b *c* <d> `e | f`")
    assert cell == r"a \| b \*c\* &lt;d> `e | f`"
    assert refmd.code("x`y") == "`` x`y ``"
    assert refmd.table(["A", "B"], [["1", ""]]).splitlines()[-1] == "| 1 | — |"
