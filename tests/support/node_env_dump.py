"""What tests/e2e/test_node_env_e2e.py (Slurm) and tests/e2e/test_node_env_ray.py share: the
program each rank runs (it writes its whole environment to a file), and the comparison of
trainguard's ranks with real torchrun's."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# What torchrun sets that is its own, not the layout's: the rendezvous port (fresh for
# every attempt under trainguard), the error file under its own log folder, who hosts the
# store (its agent; trainguard's rank 0 or store keeper), the signals its agent handles,
# the thread count (both set OMP_NUM_THREADS=1 where there are several ranks, torchrun by
# the node's count, trainguard by the job's), and the shell's own (SHLVL, `_`) from the
# `bash -c` that starts it.
NOT_THE_LAYOUT = frozenset(
    {
        "MASTER_PORT",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_SIGNALS_TO_HANDLE",
        "OMP_NUM_THREADS",
        "SHLVL",
        "_",
    }
)
DUMP = """\
import json, os, sys, time
tag, out = sys.argv[1], sys.argv[2]
key = {"tg": "RANK", "torchrun": "RANK", "srun": "SLURM_PROCID"}.get(tag, "SLURM_NODEID")
key = "TG_NODE" if tag == "base" and "TG_NODE" in os.environ else key
path = os.path.join(out, f"{tag}-{os.environ[key]}.json")
with open(path + ".part", "w") as f:
    json.dump(dict(os.environ), f)
os.replace(path + ".part", path)
if tag == "tg" and os.environ["RANK"] == "0":  # the job ends with rank 0: wait for the rest
    files = [os.path.join(out, f"tg-{r}.json") for r in range(int(os.environ["WORLD_SIZE"]))]
    deadline = time.monotonic() + 120
    while not all(map(os.path.exists, files)) and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def dumps(out: Path, tag: str, count: int) -> list[dict[str, str]]:
    """The environments the program wrote under `tag`, by rank (or node)."""
    return [json.loads((out / f"{tag}-{i}.json").read_text()) for i in range(count)]


def set_by_torchrun(ref: Sequence[dict[str, str]], base: Sequence[dict[str, str]]) -> set[str]:
    """What torchrun's workers have that their agent's own environment did not."""
    return {k for r in ref for k, v in r.items() if base[int(r["GROUP_RANK"])].get(k) != v}


def differences(
    got: Sequence[dict[str, str]], want: Sequence[dict[str, Any]], keys: Iterable[str]
) -> list[str]:
    out = []
    keys = list(keys)
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        for k in keys:
            if g.get(k) != w.get(k):
                out.append(f"rank {rank} {k}: trainguard {g.get(k)!r}, reference {w.get(k)!r}")
    return out
