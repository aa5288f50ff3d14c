"""A tiny "training" that checkpoints through the SDK: report(..., checkpoint=dir) each
step on rank 0, get_checkpoint() at start. Usage: sdk_train.py STEPS RESULT_FILE"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from trainguard import sdk

steps, result = int(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ.get("RANK", "0"))
start, total = 0, 0
found = sdk.get_checkpoint()
if found:
    state = json.loads((Path(found) / "state.json").read_text())
    start, total = state["step"], state["total"]
    print(f"resumed from {Path(found).name} at step {start}", flush=True)
for step in range(start + 1, steps + 1):
    total += step
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "state.json").write_text(json.dumps({"step": step, "total": total}))
            sdk.report({"step": step, "loss": 1.0 / step}, checkpoint=d)
    else:
        sdk.report({"step": step})
    time.sleep(0.05)
if rank == 0:
    result.write_text(json.dumps({"total": total, "resumed_from": start}))
