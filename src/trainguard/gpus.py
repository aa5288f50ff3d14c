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
