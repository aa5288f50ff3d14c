"""GPU hand-out on one machine (R-JOB-6, R-HANG-5): CUDA_VISIBLE_DEVICES per replica.

Pure: from an inventory of GPU ids, the ids isolated so far (a hardware fault, a rank
that hangs again and again) and each replica's need, which ids each replica gets.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence


class NotEnoughGpus(Exception):
    """The healthy GPUs left cannot cover what the replicas need."""


def assign_gpus(
    needs: Sequence[tuple[str, int]], inventory: Sequence[int], isolated: set[int]
) -> dict[str, tuple[int, ...]]:
    """Each replica (in rank order) takes the next free healthy ids it needs."""
    free = [g for g in inventory if g not in isolated]
    wanted = sum(n for _, n in needs)
    if wanted > len(free):
        bad = f"; isolated: {sorted(isolated)}" if isolated else ""
        raise NotEnoughGpus(
            f"the replicas need {wanted} GPU(s) but {len(free)} of {len(inventory)} are usable{bad}"
        )
    out: dict[str, tuple[int, ...]] = {}
    for replica, n in needs:
        out[replica], free = tuple(free[:n]), free[n:]
    return out


def detect_inventory() -> list[int]:
    """This machine's GPU ids as nvidia-smi lists them; none where it is absent."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(x) for x in out.split() if x.strip().isdigit()]


class GpuPool:
    """This job's GPUs: who holds which in the current attempt, and which are isolated."""

    def __init__(self, needs: Sequence[tuple[str, int]], inventory: Sequence[int] | None) -> None:
        self.needs = [(name, n) for name, n in needs if n > 0]
        self.inventory = list(inventory) if inventory is not None else []
        if self.needs and inventory is None:
            self.inventory = detect_inventory()
        self.isolated: dict[int, str] = {}  # GPU id -> why it was taken out
        self.held: dict[str, tuple[int, ...]] = {}
        self._hang_culprits: dict[str, int] = {}

    def assign(self) -> None:
        """Hand out GPUs for a new attempt; raises NotEnoughGpus with the reasons."""
        if not self.needs:
            return
        try:
            self.held = assign_gpus(self.needs, self.inventory, set(self.isolated))
        except NotEnoughGpus as exc:
            why = "; ".join(f"GPU {g}: {r}" for g, r in sorted(self.isolated.items()))
            raise NotEnoughGpus(
                f"Not enough GPUs for the next attempt: {exc}."
                + (f" Isolated: {why}." if why else "")
            ) from None

    def visible_devices(self, replica: str) -> str | None:
        ids = self.held.get(replica)
        return ",".join(map(str, ids)) if ids else None

    def isolate_after(self, replica: str, hardware: bool, rule: str, hang: bool) -> str | None:
        """Take a replica's GPUs out of the next attempts (R-HANG-5), if it earned it:
        a hardware-class failure, or being the culprit of a second hang."""
        why: str | None = None
        if hardware:
            why = f"hardware fault on {replica} ({rule})"
        elif hang:
            n = self._hang_culprits[replica] = self._hang_culprits.get(replica, 0) + 1
            if n >= 2:
                why = f"{replica} was the culprit of {n} hangs"
        gpus = self.held.get(replica, ())
        if why is None or not gpus:
            return None
        for g in gpus:
            self.isolated[g] = why
        return f"GPU {','.join(map(str, gpus))} isolated: {why}"
