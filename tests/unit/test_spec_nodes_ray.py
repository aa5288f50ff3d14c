"""`--nodes` (slurm.nodes) with the ray backend: Ray places replicas by its placement
strategy, so a node count would be silently ignored; it is refused with one line that
names the flag (issue 37)."""

from __future__ import annotations

import pytest

from trainguard.cli.parser import build_parser, split_command
from trainguard.cli.spec_flags import build_spec
from trainguard.errors import SpecError
from trainguard.spec.models import validate_spec


def _spec(*argv: str) -> object:
    flags, command = split_command(["run", *argv, "--", "python", "t.py"])
    return build_spec(build_parser().parse_args(flags), command)


@pytest.mark.parametrize("nodes", ["1", "2"])
def test_nodes_with_the_ray_backend_are_refused_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, nodes: str
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(SpecError) as raised:
        _spec("--backend", "ray", "--nodes", nodes)
    assert len(raised.value.problems) == 1
    line = raised.value.problems[0]
    assert "--nodes" in line and "ray.placement_strategy" in line, line


def test_a_ray_spec_with_slurm_nodes_is_refused_and_without_them_accepted() -> None:
    pools = [{"command": ["python", "t.py"], "replicas": 2}]
    with pytest.raises(SpecError, match=r"slurm\.nodes: 2 node"):
        validate_spec({"name": "j", "backend": "ray", "worker_pools": pools, "slurm": {"nodes": 2}})
    ok = validate_spec({"name": "j", "backend": "ray", "worker_pools": pools})
    assert ok.backend == "ray" and ok.slurm.nodes is None
