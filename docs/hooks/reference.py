"""MkDocs hook: the reference pages, generated from the code at build time.

A page holds a marker such as `<!-- reference: spec -->`; the hook replaces it with what
the generator of that name renders from the code itself (the spec's models, the CLI's
grammar, the server's OpenAPI schema, the failure catalogue, the launches' environment),
so nothing in the reference is written twice. The generators live beside this file, one
module each; MkDocs puts this folder on `sys.path` while it loads a hook, which is how
they import (a test loads this file the same way).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import ref_cli
import ref_env
import ref_failures
import ref_http
import ref_spec
import ref_states
from mkdocs.exceptions import PluginError

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

GENERATORS: dict[str, Callable[[], str]] = {
    "spec": ref_spec.render,
    "cli": ref_cli.render,
    "http-api": ref_http.render,
    "failures": ref_failures.render,
    "environment": ref_env.render,
    "job-moves": ref_states.render_jobs,
    "replica-moves": ref_states.render_replicas,
}
"""Marker name -> the function that renders its Markdown."""

MARKER = re.compile(r"^<!--\s*reference:\s*([\w-]+)\s*-->\s*$", re.MULTILINE)


def expand(markdown: str, where: str = "page") -> str:
    """`markdown` with each marker replaced by its generated reference."""

    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            known = ", ".join(GENERATORS)
            raise PluginError(f"{where}: unknown reference {name!r} (known: {known})")
        return GENERATORS[name]().rstrip() + "\n"

    return MARKER.sub(generated, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return expand(markdown, page.file.src_uri)
