"""The master's copy of each replica's log, where the nodes do not see the master's files
(Ray): written from the output lines the agents send, while each agent keeps its own copy
under its node's temporary folder. Buffered, and flushed by the backend's watch a few
times a second (as the tee is): a write per message cost a system call per line batch."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from trainguard.backends.interface import Launch
from trainguard.storage.env import ENV_FAULTHANDLER_FILE


class MasterLogs:
    def __init__(self, job: str) -> None:
        self.job = job
        self._files: dict[str, BinaryIO] = {}  # replica -> the master's copy of its log
        self.node_stacks: dict[str, str] = {}  # replica -> its stack dumps' file, relative

    def open(self, launch: Launch) -> Launch:
        """The master's copy of the replica's log opened (a new run: a new file), and the
        launch with the node's copy under the node's own temporary folder (relative)."""
        self.close(launch.replica)
        with contextlib.suppress(OSError):
            launch.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._files[launch.replica] = open(launch.log_path, "ab")  # noqa: SIM115
        at = launch.log_path
        node_dir = Path("trainguard-agent", self.job, at.parent.name)
        env = dict(launch.env)
        if stacks := env.get(ENV_FAULTHANDLER_FILE):
            self.node_stacks[launch.replica] = env[ENV_FAULTHANDLER_FILE] = str(
                node_dir / Path(stacks).name
            )
        return replace(launch, log_path=node_dir / at.name, env=env)

    def write(self, replica: str, segments: Sequence[str]) -> None:
        if (log := self._files.get(replica)) is not None:
            with contextlib.suppress(OSError, ValueError):
                log.write("".join(f"{s}\n" for s in segments).encode(errors="replace"))

    def flush(self) -> None:
        for log in self._files.values():
            with contextlib.suppress(OSError, ValueError):
                log.flush()

    def close(self, replica: str) -> None:
        if (log := self._files.pop(replica, None)) is not None:
            with contextlib.suppress(OSError, ValueError):
                log.close()

    def close_all(self) -> None:
        for replica in list(self._files):
            self.close(replica)
