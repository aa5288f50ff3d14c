"""A replica killed in the middle of `sdk.report(checkpoint=...)`'s copy (issue 37).

    ckpt_killed_mid_copy.py FOLDER MARKER hang|die [KILLS]

After the copy of the checkpoint's first file: `hang` writes MARKER and sleeps until it is
killed; `die` SIGKILLs itself while TRAINGUARD_ATTEMPT < KILLS (later attempts report the
checkpoint to the end).
"""

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from trainguard import sdk

folder, marker, mode = sys.argv[1:4]
kills = int(sys.argv[4]) if len(sys.argv) > 4 else 0
real_copy = shutil.copy


def copy_then_stop(src, dst, **kw):  # type: ignore[no-untyped-def]
    out = real_copy(src, dst, **kw)
    if mode == "hang":
        Path(marker).write_text(str(os.getpid()))
        while True:
            time.sleep(60)
    if int(os.environ.get("TRAINGUARD_ATTEMPT", "0")) < kills:
        os.kill(os.getpid(), signal.SIGKILL)
    return out


shutil.copy = copy_then_stop
sdk.report({"step": 1}, checkpoint=folder)
