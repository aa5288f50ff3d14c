"""The `store` replica of a torchft job (torch's word: a TCPStore, not trainguard's store
of records): one TCPStore per replica group, held for the job's life.

torchft's Manager is a client of a TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's
agent hosts it); trainguard hosts one per group, at addresses that never change, so a
group restarted alone finds its store where it was. Run as
`python -m trainguard.frameworks.torchft_tcpstore HOST:PORT ...`; it prints one line when
every store listens and then waits to be stopped.
"""

from __future__ import annotations

import signal
import sys
import time
from datetime import timedelta
from typing import Any


def main(addresses: list[str]) -> int:
    if not addresses:
        print("torchft_tcpstore: name at least one HOST:PORT to listen on", file=sys.stderr)
        return 2
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
    except ImportError as exc:
        print(f"torchft_tcpstore: torch.distributed does not import: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    stores: list[Any] = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            store = TCPStore(
                host.strip("[]"), int(port), None, True, timedelta(hours=1), wait_for_workers=False
            )
        except (RuntimeError, ValueError) as exc:
            print(f"torchft_tcpstore: cannot listen on {address}: {exc}", file=sys.stderr)
            return 1
        stores.append(store)
    print(
        f"torchft_tcpstore: {len(stores)} group stores listen at {' '.join(addresses)}", flush=True
    )
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
