"""The check one node runs (`python -m trainguard.backends.node_check.worker SPEC`), as
DLRover's node check does (dlrover/trainer/torch/node_check/utils.py: a timed matmul, then a
timed collective in a world of two): a compute kernel with a known answer, then one gloo
all-reduce per world of two it belongs to (NCCL as well where a GPU is), all worlds at
once, each with its own store at its first member's address. It prints one JSON line and
exits by its own deadline, whatever a peer does; only the standard library is needed to
start, torch or numpy where there.

SPEC (JSON): {"index": i, "addrs": [each node's address], "ports": [each world's port],
"pairs": [[a, b], ...], "collective_s": s, "deadline_s": s}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

_N = 192  # the matmul's size: tens of milliseconds on one CPU core
_ROUNDS = 5
_ELEMENTS = 1 << 18  # floats per all-reduce: 1 MiB, so a slow link shows
_REPEATS = 3


def _matrices(n: int) -> tuple[list[list[float]], list[list[float]]]:
    a = [[float((i + j) % 7) for j in range(n)] for i in range(n)]
    b = [[float((i * j) % 5) for j in range(n)] for i in range(n)]
    return a, b


def _known(a: list[list[float]], b: list[list[float]]) -> tuple[float, list[float]]:
    """The product's total and its diagonal, in pure Python (exact: small integers)."""
    n = len(a)
    total = sum(sum(a[i][k] for i in range(n)) * sum(b[k]) for k in range(n))
    diag = [sum(a[i][k] * b[k][i] for k in range(n)) for i in range(n)]
    return total, diag


def compute() -> dict[str, Any]:
    """A fixed product, timed, compared with its known total and diagonal."""
    a, b = _matrices(_N)
    total, diag = _known(a, b)
    try:
        import torch

        ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        c = ta @ tb  # warm-up: the thread pool starts here, untimed
        t0 = time.perf_counter()
        for _ in range(_ROUNDS):
            c = ta @ tb
        seconds = time.perf_counter() - t0
        got_total, got_diag = float(c.sum()), [float(x) for x in c.diagonal()]
        kernel = "torch"
    except ImportError:
        n = 48  # pure Python: a small one
        a, b = _matrices(n)
        total, diag = _known(a, b)
        t0 = time.perf_counter()
        for _ in range(_ROUNDS):
            c2 = [[sum(a[i][k] * b[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
        seconds = time.perf_counter() - t0
        got_total, got_diag = sum(map(sum, c2)), [c2[i][i] for i in range(n)]
        kernel = "python"
    ok = got_total == total and got_diag == diag
    error = "" if ok else f"wrong answer: total {got_total:g}, expected {total:g}"
    return {"compute_ok": ok, "compute_s": seconds, "compute_error": error, "kernel": kernel}


_PRINT = threading.Lock()


def _say(line: dict[str, Any]) -> None:
    """One JSON line, at once: the master reads each as it comes, and may end the check
    before a peer that never joined times out."""
    with _PRINT:
        print(json.dumps(line), flush=True)


def _pair(spec: dict[str, Any], world: int, out: dict[int, dict[str, Any]]) -> None:
    out[world] = _world(spec, world)
    _say({"pair": world, **out[world]})


def _world(spec: dict[str, Any], world: int) -> dict[str, Any]:
    """One world of two: a store at its first member, a gloo group, `_REPEATS` all-reduces
    of a known vector (each member adds rank + 1: the sum must be 3); NCCL too on a GPU."""
    try:
        import torch
        import torch.distributed as distributed
    except ImportError:
        return {"ok": False, "error": "torch is not installed here: no all-reduce"}
    dist: Any = distributed  # its process-group classes are untyped
    a = spec["pairs"][world][0]
    index = spec["index"]
    rank = 0 if index == a else 1
    addrs = spec["addrs"]
    wait = timedelta(seconds=max(1.0, spec["deadline_s"] - time.monotonic()))
    try:
        store = dist.TCPStore(
            addrs[a], spec["ports"][world], 2, rank == 0, timeout=wait, wait_for_workers=False
        )
        store.set(f"joined{rank}", "1")
        store.wait([f"joined{1 - rank}"], wait)
        t0 = time.perf_counter()
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=addrs[index])]
        opts._timeout = timedelta(seconds=spec["collective_s"])
        pg = dist.ProcessGroupGloo(store, rank, 2, opts)
        x = torch.full((_ELEMENTS,), float(rank + 1))
        for _ in range(_REPEATS):
            y = x.clone()
            pg.allreduce([y]).wait()
        if float(y[0]) != 3.0 or float(y[-1]) != 3.0:
            raise RuntimeError(f"all-reduce gave {float(y[0]):g}, expected 3")
        backend = "gloo"
        if torch.cuda.is_available():  # the GPUs' own path: NCCL between the two
            backend = _nccl(store, rank, spec["collective_s"])
        return {"ok": True, "seconds": time.perf_counter() - t0, "backend": backend}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {_short(str(exc))}"}


def _short(text: str) -> str:
    """gloo's message without its source location, to its first sentence."""
    text = text.strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0][:160]


def _nccl(store: Any, rank: int, timeout_s: float) -> str:
    import torch
    import torch.distributed as distributed

    dist: Any = distributed
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    prefix = dist.PrefixStore("nccl", store)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=timeout_s)
    pg = dist.ProcessGroupNCCL(prefix, rank, 2, opts)
    y = torch.full((_ELEMENTS,), float(rank + 1), device=device)
    pg.allreduce([y]).wait()
    torch.cuda.synchronize(device)
    if float(y[0]) != 3.0:
        raise RuntimeError(f"NCCL all-reduce gave {float(y[0]):g}, expected 3")
    return "gloo+nccl"


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    spec["deadline_s"] = time.monotonic() + float(spec["deadline_s"])
    report: dict[str, Any] = {"index": spec["index"]}
    report.update(compute())
    _say({"compute": report})
    out: dict[int, dict[str, Any]] = {}
    mine = [w for w, pair in enumerate(spec["pairs"]) if spec["index"] in pair]
    threads = [threading.Thread(target=_pair, args=(spec, w, out), daemon=True) for w in mine]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, spec["deadline_s"] - time.monotonic()))
    late = {"ok": False, "error": "no answer before the deadline"}
    report["pairs"] = {str(w): dict(out).get(w, late) for w in mine}
    _say(report)
    os._exit(0)  # a thread stuck in a connect must not keep the check alive


if __name__ == "__main__":
    sys.exit(main(sys.argv))
