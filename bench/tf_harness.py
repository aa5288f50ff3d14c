"""What the TensorFlow checks (bench/tf_check.py) share: TF_CONFIG, the task processes and
their timed output, step parsing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
STEP_RE = re.compile(r"^step (\d+) loss ([0-9.naninf]+)(?: task (\S+))? t=([0-9.]+)", re.M)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


RPC_LAYER = "grpc"  # --rpc-layer; "" leaves the key out (TensorFlow then uses grpc too)


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    conf: dict = {"cluster": cluster, "task": {"type": task_type, "index": index}}
    if RPC_LAYER:
        conf["rpc_layer"] = RPC_LAYER
    return json.dumps(conf)


class Task:
    def __init__(self, name: str, script: str, conf: str, args: list[str], logdir: Path):
        self.name, self.script, self.conf, self.args = name, script, conf, args
        self.logdir = logdir
        self.attempt = 0
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.log = logdir / f"{name}.0.log"
        self.lines: list[tuple[float, str]] = []

    def start(self) -> None:
        self.log = self.logdir / f"{self.name}.{self.attempt}.log"
        env = dict(
            os.environ,
            TF_CONFIG=self.conf,
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONUNBUFFERED="1",
            TRAINGUARD_RESTART_COUNT=str(self.attempt),
        )
        env.pop("TRAINGUARD_CHECKPOINT_DIR", None)
        self.proc = subprocess.Popen(
            [PY, str(ROOT / "examples" / self.script), *self.args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines = []  # (time this script read the line, line): every line gets a time
        self.reader = threading.Thread(
            target=self._read, args=(self.proc, self.lines, self.log), daemon=True
        )
        self.reader.start()
        self.started = time.time()
        self.attempt += 1

    @staticmethod
    def _read(proc: subprocess.Popen, lines: list, log: Path) -> None:
        assert proc.stdout is not None
        with open(log, "w") as out:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append((time.time(), line))
                out.write(line + "\n")
                out.flush()
        proc.wait()
        Task._ended[id(proc)] = time.time()

    _ended: ClassVar[dict[int, float]] = {}

    @property
    def ended(self) -> float | None:
        return Task._ended.get(id(self.proc))

    def poll(self) -> int | None:
        """The exit status of the current attempt (None: running, or never started)."""
        return self.proc.poll() if self.proc else None

    def text(self) -> str:
        return "\n".join(ln for _, ln in list(self.lines))

    def first_seen(self, pattern: str) -> float | None:
        """When this script first read a line of this attempt matching the pattern."""
        for t, ln in list(self.lines):
            if re.search(pattern, ln):
                return t
        return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait()
        if self.proc:
            self.reader.join(timeout=5)

    def cpu_s(self) -> float | None:
        """The process's user+system CPU seconds (None once it is gone)."""
        if not self.proc:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None


def steps_of(text: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(4))) for m in STEP_RE.finditer(text)]


def wait_for(pred, timeout: float, poll: float = 0.05) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(poll)
    return False


def first_t(text: str, pattern: str) -> float | None:
    m = re.search(r"(?:" + pattern + r").*? t=([0-9.]+)", text)
    return float(m.group(1)) if m else None


def rel(t: float | None, base: float | None) -> float | None:
    return round(t - base, 3) if t and base else None


def exit_time(t: Task) -> float | None:
    """About when the task's process ended (its reader saw the end of its output)."""
    if t.poll() is None:
        return None
    t.reader.join(timeout=5)
    return t.ended


def import_s(text: str) -> float | None:
    m = re.search(r"imported in ([0-9.]+)s", text)
    return float(m.group(1)) if m else None
