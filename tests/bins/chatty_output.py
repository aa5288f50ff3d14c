"""A chatty replica (issue 37): LINE-byte lines at RATE bytes/s for SECONDS, then what it
got out as JSON in OUT. `step` lines say "step N loss L" first (what progress reading
looks for), `plain` lines are filler only.

    chatty_output.py SECONDS RATE OUT [step|plain] [LINE]
"""

import json
import os
import sys
import time

seconds, rate, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
style = sys.argv[4] if len(sys.argv) > 4 else "step"
size = int(sys.argv[5]) if len(sys.argv) > 5 else 1024


def line(i: int) -> bytes:
    head = f"step {i} loss {1.0 / (i + 1):.5f} " if style == "step" else ""
    return (head + "x" * max(0, size - 1 - len(head)) + "\n").encode()


sent = lines = 0
blocked_s = 0.0
start = time.monotonic()
end = start + seconds
while (now := time.monotonic()) < end:
    due = min(int((now - start) * rate) - sent, 64 * 1024)  # at most 64 KiB a write
    if due < size:
        time.sleep(0.001)
        continue
    data = b"".join(line(lines + k) for k in range(due // size))
    w0 = time.monotonic()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
    blocked_s += time.monotonic() - w0
    sent += len(data)
    lines += due // size
with open(out, "w") as fh:
    json.dump({"bytes": sent, "lines": lines, "blocked_s": blocked_s, "seconds": seconds}, fh)
