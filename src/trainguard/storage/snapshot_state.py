"""A training state as a snapshot's parts, and back (issue 16).

`torch.save` pickles a state and then writes every tensor's bytes through a zip archive;
for a snapshot that goes to memory each step that is the cost (`bench/snapshot_cost.py`
shows both). Instead the state is pickled with each tensor replaced by a reference
(`persistent_id`, as torch.save does), and the tensors' bytes are copied by torch straight
into the snapshot file's memory. Without torch loaded the state is a plain pickle.

Torch is never imported here: it is used only when the training process has loaded it.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Sequence
from typing import Any

from trainguard.storage.snapshots import ALIGN, Copy

PICKLE = "pickle"
TENSORS = "tensors"


class _Pickler(pickle.Pickler):
    """Pickles everything but plain dense tensors, which it lists for a direct copy."""

    def __init__(self, file: io.BytesIO, torch: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.torch = torch
        self.tensors: list[Any] = []  # detached, in the order of their offsets
        self.offsets: list[int] = []
        self._seen: dict[int, tuple[object, ...]] = {}  # id -> reference (shared tensors)
        self._size = 0

    def persistent_id(self, obj: object) -> tuple[object, ...] | None:
        torch = self.torch
        if not isinstance(obj, torch.Tensor) or type(obj) not in (
            torch.Tensor,
            torch.nn.Parameter,
        ):
            return None
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            return None  # pickled whole, as torch pickles them
        ref = self._seen.get(id(obj))
        if ref is not None:
            return ref
        t = obj.detach().resolve_conj().resolve_neg()
        self._size = -(-self._size // ALIGN) * ALIGN
        ref = (
            "tensor",
            len(self.tensors),  # its own number: empty tensors share an offset
            self._size,
            str(t.dtype).removeprefix("torch."),
            tuple(t.shape),
            isinstance(obj, torch.nn.Parameter),
            obj.requires_grad,
        )
        self.tensors.append(t)
        self.offsets.append(self._size)
        self._size += t.numel() * t.element_size()
        self._seen[id(obj)] = ref
        return ref


def parts(state: object) -> tuple[str, int, Sequence[tuple[int, Copy]]]:
    """(format, bytes of pickle, parts): what `snapshots.Writer.write` stores."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        return PICKLE, len(data), [(len(data), _fill_bytes(data))]
    buf = io.BytesIO()
    p = _Pickler(buf, torch)
    p.dump(state)
    skeleton = buf.getvalue()
    out: list[tuple[int, Copy]] = [(len(skeleton), _fill_bytes(skeleton))]
    if p.tensors:
        size = p.offsets[-1] + p.tensors[-1].numel() * p.tensors[-1].element_size()
        out.append((size, _fill_tensors(torch, p.tensors, p.offsets)))
    return TENSORS, len(skeleton), out


def _fill_bytes(data: bytes) -> Copy:
    def fill(view: memoryview) -> None:
        view[:] = data

    return fill


def _fill_tensors(torch: Any, tensors: list[Any], offsets: list[int]) -> Copy:
    def fill(view: memoryview) -> None:
        dst = torch.frombuffer(view, dtype=torch.uint8)
        for t, off in zip(tensors, offsets, strict=True):
            n = t.numel() * t.element_size()
            if n:
                src = t.contiguous().reshape(-1).view(torch.uint8)
                dst[off : off + n].copy_(src)
        del dst  # no view of the file's memory outlives the copy

    return fill


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, torch: Any, data: Any) -> None:
        super().__init__(file)
        self.torch, self.data = torch, data
        self._made: dict[int, Any] = {}  # number -> tensor: one object stored twice is one

    def persistent_load(self, pid: Any) -> Any:
        kind, index, off, dtype, shape, param, grad = pid
        if kind != "tensor":
            raise pickle.UnpicklingError(f"unknown reference {kind!r}")
        if index in self._made:
            return self._made[index]
        torch = self.torch
        dt = getattr(torch, dtype)
        n = torch.empty((), dtype=dt).element_size()
        for d in shape:
            n *= d
        t = self.data[off : off + n].view(dt).reshape(shape)
        if param:
            t = torch.nn.Parameter(t, requires_grad=grad)
        elif grad:
            t.requires_grad_(True)
        self._made[index] = t
        return t


def state_of(form: str, skeleton: int, payload: bytearray) -> object:
    """The state `parts` stored. Unpickled: load only what this job stored."""
    if form == PICKLE:
        return pickle.loads(payload)
    if form != TENSORS:
        raise ValueError(f"unknown snapshot format {form!r}")
    import torch

    start = -(-skeleton // ALIGN) * ALIGN
    data = torch.frombuffer(payload, dtype=torch.uint8)[start:].clone()  # aligned, owned
    return _Unpickler(io.BytesIO(payload[:skeleton]), torch, data).load()
