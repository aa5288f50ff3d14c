"""A real server refuses a job whose backend it cannot run (issue 37): `--backend slurm`
where the server is outside an allocation, `--backend ray` where its Python cannot import
ray. The API answers 422 in one line, the CLI exits 2 with one line, nothing is stored."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from conftest import TG
from test_server import Server

pytestmark = pytest.mark.slow  # a real server process

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def _server_without_ray_or_allocation(tg: TG, tmp_path: Path) -> Server:
    stub = tmp_path / "stub" / "ray"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no ray in this python (a stub)')\n")
    tg.env["PYTHONPATH"] = str(stub.parent)
    for var in SLURM_VARS:
        tg.env.pop(var, None)
    return Server(tg).start()


def _refused_over_http(srv: Server, backend: str) -> str:
    spec: dict[str, Any] = {
        "name": "x",
        "backend": backend,
        "worker_pools": [{"command": ["true"], "replicas": 1}],
    }
    with pytest.raises(urllib.error.HTTPError) as err:
        srv.http("POST", "/api/jobs", {"spec": spec, "cwd": str(srv.tg.home.parent)})
    assert err.value.code == 422
    body = json.loads(err.value.read())
    err.value.close()
    assert len(body["problems"]) == 1 and "\n" not in body["problems"][0], body
    return str(body["problems"][0])


def test_a_server_refuses_a_backend_it_cannot_run(tg: TG, tmp_path: Path) -> None:
    srv = _server_without_ray_or_allocation(tg, tmp_path)
    try:
        said = _refused_over_http(srv, "ray")
        assert said.startswith("backend ray needs Ray, and `import ray` fails here"), said
        assert "runs inside an allocation" in _refused_over_http(srv, "slurm")
        for backend, says in (("ray", "pip install trainguard[ray]"), ("slurm", "allocation")):
            res = srv.cli("submit", "--backend", backend, "--", "true")
            assert res.returncode == 2, res.stderr
            assert res.stderr.startswith("trainguard: ") and res.stderr.count("\n") == 1
            assert says in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert srv.json("jobs") == []  # nothing stored
        ok = srv.submit("--", "true")  # the local backend still runs here
        assert srv.wait_state(ok, "SUCCEEDED") == "SUCCEEDED"
    finally:
        srv.stop()
