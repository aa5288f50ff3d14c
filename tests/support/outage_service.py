"""A real HTTP data service on 127.0.0.1 that is down (503) for a while, then up (200).

The backoff tests start it in-process (a `ThreadingHTTPServer` on a free port); a replica
(`REPLICA`, a real Python process) fetches from it at start-up with `urllib`, as a data
loader would, and dies of the real `HTTPError` while the service is down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLICA = """\
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    data = r.read().decode()
print("fetched", data, flush=True)
"""


class Outage:
    """The service answers 503 for `down_s` from its first request (so a slow start of
    the job on a busy machine does not shorten the outage), then 200; and who asked when."""

    def __init__(self, down_s: float) -> None:
        self.down_s = down_s
        self.requests: list[tuple[float, int]] = []  # (monotonic time, status answered)
        self.lock = threading.Lock()

    def status(self) -> int:
        now = time.monotonic()
        with self.lock:
            first = self.requests[0][0] if self.requests else now
            code = 503 if now < first + self.down_s else 200
            self.requests.append((now, code))
        return code


@contextmanager
def outage_service(down_s: float) -> Iterator[tuple[str, Outage]]:
    """A URL that answers 503 for `down_s` seconds from its first request, then 200."""
    outage = Outage(down_s)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = outage.status()
            body = b"shard-0" if code == 200 else b"busy"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/data", outage
    finally:
        server.shutdown()
        server.server_close()
