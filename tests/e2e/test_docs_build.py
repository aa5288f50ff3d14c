"""The documentation site builds with `mkdocs build --strict` (issue 41): every page in the
nav exists, every internal link and anchor resolves, the generated reference renders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice of its successor
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    pages = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("index.html", "getting-started/index.html", "reference/spec/index.html"):
        assert page in pages, sorted(pages)[:20]
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert "max_num_of_job_restart" in spec  # generated at build time from the models
