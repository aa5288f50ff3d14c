"""A training state through a snapshot file and back: tensors copied as bytes, all else
pickled; what comes back equals what went in, dtype, shape and sharing included."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.storage import snapshot_state, snapshots

torch: Any = pytest.importorskip("torch")  # the torch extra; a base install skips this file


def _round_trip(tmp_path: Path, state: object) -> object:
    form, skeleton, parts = snapshot_state.parts(state)
    w = snapshots.Writer(tmp_path, 0)
    w.write(1, 0, 1, parts, form, skeleton)
    w.close()
    found = snapshots.load(snapshots.step_dir(tmp_path, 1), 0)
    assert found is not None and found[0].format == form == "tensors"
    return snapshot_state.state_of(found[0].format, found[0].skeleton, found[1])


def test_tensors_of_every_kind_come_back_equal(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    shared = torch.arange(6.0)
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "dtypes": [
            torch.tensor([1, 2], dtype=torch.int64),
            torch.tensor([True, False]),
            torch.randn(3).to(torch.bfloat16),
            torch.randn(2, dtype=torch.complex64).conj(),  # a lazy conjugate
            torch.tensor(3.5),  # 0-dim
            torch.empty(0, 5),
            torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        ],
        "shared": (shared, shared),
        "param": torch.nn.Parameter(torch.ones(2)),
        "rng": torch.get_rng_state(),
        "other": {"epoch": 3, "name": "x", "none": None},
    }
    back: Any = _round_trip(tmp_path, state)
    assert back["other"] == state["other"]
    assert back["optim"]["param_groups"] == state["optim"]["param_groups"]
    pairs = [
        *zip(back["model"].values(), state["model"].values(), strict=True),
        *zip(back["dtypes"], state["dtypes"], strict=True),
        (
            back["optim"]["state"][0]["momentum_buffer"],
            state["optim"]["state"][0]["momentum_buffer"],
        ),
        (back["param"], state["param"]),
        (back["rng"], state["rng"]),
    ]
    for got, want in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want.resolve_conj())
    assert back["shared"][0] is back["shared"][1]
    assert isinstance(back["param"], torch.nn.Parameter) and back["param"].requires_grad
    model.load_state_dict(back["model"])  # what training does with it


def test_without_torch_a_state_is_a_plain_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    form, skeleton, parts = snapshot_state.parts({"w": [1.0]})
    assert form == "pickle" and len(parts) == 1 and parts[0][0] == skeleton
    data = pickle.dumps({"w": [1.0]}, protocol=pickle.HIGHEST_PROTOCOL)
    assert snapshot_state.state_of(form, skeleton, bytearray(data)) == {"w": [1.0]}
    with pytest.raises(ValueError, match="format"):
        snapshot_state.state_of("zip", 0, bytearray())
