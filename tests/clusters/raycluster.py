"""A real multi-node Ray cluster on this machine, on loopback, for the Ray backend's tests.

`ray_cluster` (module scope) starts a head and two worker nodes, each a process tree of its
own, like a machine: a launcher (this file run as a script) builds a `ray._private.node.Node`
with `node_ip_address="127.0.0.1"`, the way `ray.cluster_utils.Cluster` does. Not `ray start`:
it rewrites 127.0.0.1 to the machine's network address, and not `Cluster` itself: its nodes
would be children of pytest, not separate trees. Every node listens on 127.0.0.1 only, has
2 CPUs, a custom resource `node_<i>` naming it, its own temp dir under a short
/tmp/ray-tg-* root (Unix socket paths must stay under 108 bytes), and no dashboard or usage
stats. The GCS health check runs fast, so a SIGKILLed raylet is declared dead in 1-2 s
instead of Ray's ~15 s.

Each node's processes (Ray's workers included) stay in its launcher's session, and carry
MARKER in their environment, as do the commands actors start: that is how `kill_node` and
`stop` find them all, without `ray stop` (that kills every Ray process on the machine,
other people's clusters included). Node 0 is the head: it holds the GCS and the raylet a
driver in this process attaches to, so `kill_node` refuses it.

A missing `ray` fails the tests (`pip install ray`) rather than skipping them: a skipped
test would let the Ray backend go untested unnoticed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hosts import env_value

from trainguard.backends.guardian import TOKEN_ENV as GUARDIAN_TOKEN
from trainguard.backends.net import free_port

if TYPE_CHECKING:
    from hosts import Host, Hosts

LOOPBACK = "127.0.0.1"
# A SIGKILLed raylet fails each check at once (connection refused), so it is declared dead
# ~1.5 s after the kill; a raylet merely slowed by a busy machine gets 3 s of grace.
FAST_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's floor is 75 MiB; its default, 30% of RAM
MARKER = "TRAINGUARD_RAY_TEST_NODE"  # in the environment of a node's processes: its temp dir
# Ray also rewrites 127.0.0.1 in `ray.init(address=..., _node_ip_address=...)` to the
# machine's address, where nothing listens. This flag (meant for one-machine clusters on
# macOS and Windows) keeps 127.0.0.1. Ray reads it at import: a driver in a child process
# needs it in its environment (the fixture puts it in os.environ while it runs).
DRIVER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def require_ray() -> Any:
    """`import ray`, or fail the test naming the fix (never skip: see the module doc)."""
    try:
        import ray
    except ImportError as e:
        pytest.fail(f"the Ray tests need Ray: pip install ray ({e})", pytrace=False)
    return ray


def _session_of(pid: int) -> int | None:
    """The session id of a live process; None for a zombie (dead, awaiting its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[3])


def _processes(session: int, temp_dir: str) -> list[int]:
    """A node's live processes: those of its launcher's session, and those carrying MARKER,
    which finds what actors started in sessions of their own; and what the node's
    guardians watch (a node agent's replicas get the master's environment, not the
    node's: they carry their guardian's token instead)."""
    found, tokens, marked = [], set(), {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            in_session = _session_of(pid)
            if in_session is None:
                continue
            if in_session == session or env_value(pid, MARKER) == temp_dir:
                found.append(pid)
                tokens.add(_guardian_token(pid))
            elif (token := env_value(pid, GUARDIAN_TOKEN)) is not None:
                marked[pid] = token
    return found + [pid for pid, token in marked.items() if token in tokens]


def _guardian_token(pid: int) -> str | None:
    """The token a guardian process watches for (its command line names it), else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    names = [a.decode(errors="replace") for a in argv]
    if GUARDIAN_TOKEN in names and names.index(GUARDIAN_TOKEN) + 1 < len(names):
        return names[names.index(GUARDIAN_TOKEN) + 1]
    return None


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@dataclass
class RayNode:
    """One node: its launcher, and what the launcher reported once Ray was up."""

    index: int
    temp_dir: Path
    launcher: subprocess.Popen[bytes]
    node_id: str = ""
    raylet_pid: int = 0
    alive: bool = True

    @property
    def resource(self) -> str:
        """The custom resource only this node has: `resources={r: 0.01}` pins a task here."""
        return f"node_{self.index}"

    host: Host | None = None  # where it runs, when on hosts that share nothing

    def processes(self) -> list[int]:
        if self.host is not None:  # every process of the host is the node's
            return self.host.processes()
        return _processes(self.launcher.pid, str(self.temp_dir))

    def seen(self, path: Path) -> Path:
        """Where the test reads a file the node writes at `path`."""
        return path if self.host is None else self.host.outside(path)


class RayCluster:
    """Ray nodes on this machine, each a process tree of its own: all on 127.0.0.1, or
    node i on `hosts[i]` (tests/clusters/hosts.py), at that host's address, in its own /tmp."""

    def __init__(
        self,
        root: Path,
        num_cpus: int | Sequence[int] = 2,
        num_nodes: int = 3,
        system_config: dict[str, Any] | None = None,
        hosts: Hosts | None = None,
        num_gpus: int = 0,
    ) -> None:
        """`num_gpus`: GPUs each node says it has (Ray's logical resource: none need be
        there, and Ray still hands out their ids)."""
        self.root = root
        self.num_gpus = num_gpus
        self.hosts = hosts
        self.num_nodes = num_nodes if hosts is None else hosts.count
        self.num_cpus = num_cpus
        self.system_config = FAST_HEALTH_CHECK if system_config is None else system_config
        self.port = free_port()
        self.all_nodes: list[RayNode] = []  # every node started, in order, dead ones too
        self._state: Any = None

    def _host(self, index: int) -> Host | None:
        return None if self.hosts is None else self.hosts[index % self.hosts.count]

    def ip(self, index: int) -> str:
        host = self._host(index)
        return LOOPBACK if host is None else host.ip

    @property
    def address(self) -> str:
        """The GCS address, for `ray.init(address=...)` and `--ray-address`."""
        return f"{self.ip(0)}:{self.port}"

    def start(self, timeout: float = 60) -> None:
        self._wait_up(self._launch(), timeout)
        workers = [self._launch() for _ in range(self.num_nodes - 1)]
        for node in workers:  # launched together, they come up in parallel
            self._wait_up(node, timeout)

    def add_node(self, timeout: float = 60) -> RayNode:
        """Start one more worker node; return it once Ray lists it alive."""
        node = self._launch()
        self._wait_up(node, timeout)
        return node

    def heal(self) -> None:
        """Add nodes until `num_nodes` are alive, for a test after one that killed some;
        on hosts, a new node on each host whose node is dead (its cable mended first)."""
        if self.hosts is None:
            while len(self.nodes()) < self.num_nodes:
                self.add_node()
            return
        for host in self.hosts.hosts:  # Ray may list a node cut off alive for ~30 s
            mine = [n for n in self.all_nodes if n.host is host]
            if not any(n.alive for n in mine):
                host.kill()  # what the cut-off node left running
                if host.cut_off:
                    host.mend()
                for n in mine:
                    n.alive = False
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        n.launcher.wait(timeout=10)
                self._wait_up(self._launch(host), 60)

    def _launch(self, host: Host | None = None) -> RayNode:
        index = len(self.all_nodes)
        host = host or self._host(index)
        # On a host, the node's folder is in that host's own /tmp (the test reads it there).
        temp_dir = self.root / str(index) if host is None else Path(f"/tmp/ray-node-{index}")
        if host is None:
            temp_dir.mkdir(parents=True)
        params: dict[str, Any] = {
            "node_ip_address": LOOPBACK if host is None else host.ip,
            "node_name": f"node_{index}",
            "num_cpus": (
                self.num_cpus
                if isinstance(self.num_cpus, int)
                else self.num_cpus[host.index if host else index]
            ),
            "num_gpus": self.num_gpus,
            "resources": {f"node_{index}": 1},
            "object_store_memory": OBJECT_STORE_BYTES,
            "temp_dir": str(temp_dir),
            "include_dashboard": False,
            "dashboard_host": LOOPBACK,
            # Random ports throughout: other Ray clusters may run on this machine.
            "dashboard_agent_listen_port": None,  # not Ray's fixed 52365
            "min_worker_port": 0,
            "max_worker_port": 0,
            "node_manager_port": 0,
        }
        if index == 0:
            params |= {
                "gcs_server_port": self.port,
                "dashboard_port": free_port(),  # a stub runs even without the dashboard
                "_system_config": self.system_config,
            }
        else:
            params["gcs_address"] = self.address
        spec = json.dumps({"head": index == 0, "params": params})
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, __file__, spec]
        with open(self.root / f"launcher-{index}.log", "wb") as log:
            launcher = subprocess.Popen(
                argv if host is None else [*host.prefix(), *argv],
                env={**os.environ, **DRIVER_ENV, MARKER: str(temp_dir)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node = RayNode(index, temp_dir, launcher, host=host)
        self.all_nodes.append(node)
        return node

    def _wait_up(self, node: RayNode, timeout: float) -> None:
        ready = node.seen(node.temp_dir / "node.json")
        deadline = time.monotonic() + timeout
        while not ready.exists():
            self._check_launcher(node, deadline, "did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        node.node_id, node.raylet_pid = info["node_id"], info["raylet_pid"]
        while node.node_id not in {n["node_id"] for n in self.nodes()}:
            self._check_launcher(node, deadline, "did not join the cluster")
            time.sleep(0.05)

    def _check_launcher(self, node: RayNode, deadline: float, what: str) -> None:
        if node.launcher.poll() is None and time.monotonic() < deadline:
            return
        log = self.root / f"launcher-{node.index}.log"
        said = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        pytest.fail(f"Ray node {node.index} {what}:\n{said}", pytrace=False)

    def _gcs(self) -> Any:
        """The GCS reader behind `ray.nodes()`: works whether or not this process is a driver."""
        if self._state is None:
            ray = require_ray()
            options = ray._raylet.GcsClientOptions.create(
                self.address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False
            )
            self._state = ray._private.state.GlobalState()
            self._state._initialize_global_state(options)
        return self._state

    def node_table(self) -> list[dict[str, Any]]:
        """What `ray.nodes()` says, dead nodes included."""
        return list(self._gcs().node_table())

    def nodes(self) -> list[dict[str, Any]]:
        """The alive nodes, as {"node_id", "ip", "name", "resources", "index"} dicts."""
        index = {n.node_id: n.index for n in self.all_nodes}
        return [
            {
                "node_id": n["NodeID"],
                "ip": n["NodeManagerAddress"],
                "name": n["NodeName"],
                "resources": n["Resources"],
                "index": index.get(n["NodeID"]),
            }
            for n in self.node_table()
            if n["Alive"]
        ]

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every alive node has all its CPUs free: an earlier test's actors give theirs
        back a moment after they end, and a job that needs the whole cluster would not fit."""
        deadline = time.monotonic() + timeout
        while True:
            state = self._gcs()
            total, free = state.total_resources_per_node(), state.available_resources_per_node()
            busy = {n: r.get("CPU", 0) - free.get(n, {}).get("CPU", 0) for n, r in total.items()}
            if not any(busy.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"CPUs still held {timeout}s after the last test: {busy}")
            time.sleep(0.1)

    def node(self, index: int) -> RayNode:
        return self.all_nodes[index]

    def kill_node(self, index: int, *, raylet_only: bool = False, timeout: float = 10) -> float:
        """SIGKILL node `index`'s raylet, then the rest of the node as a machine loss would:
        Ray's other processes, the actors' workers, and what those started (replicas).
        Return the seconds from the kill until Ray listed the node dead.

        `raylet_only` leaves the rest to Ray: the workers exit by themselves ~1 s later,
        taking their direct children with them; Ray's agents may linger until `stop`.
        """
        node = self.all_nodes[index]
        if index == 0:
            raise ValueError("node 0 is the head: it holds the GCS and the driver's raylet")
        if not node.alive:
            raise ValueError(f"node {index} is already dead")
        rest = [] if raylet_only else node.processes()
        start = time.monotonic()
        _kill(node.raylet_pid)
        for pid in rest:
            _kill(pid)
        node.alive = False
        while any(n["NodeID"] == node.node_id and n["Alive"] for n in self.node_table()):
            if time.monotonic() - start > timeout:
                raise AssertionError(f"Ray still lists node {index} alive {timeout}s after")
            time.sleep(0.02)
        elapsed = time.monotonic() - start
        node.launcher.wait(timeout=30)
        return elapsed

    def leftovers(self) -> list[int]:
        """Live processes of every node started, dead nodes included."""
        return [pid for node in self.all_nodes for pid in node.processes()]

    def stop(self, timeout: float = 20) -> None:
        """Stop every node, kill what outlives its node, and fail if anything is left."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()  # before the GCS goes: a driver that loses it exits the process
        for node in reversed(self.all_nodes):  # workers first, the head last
            if node.launcher.poll() is None:
                node.launcher.terminate()
        deadline = time.monotonic() + timeout
        for node in self.all_nodes:
            try:
                node.launcher.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.launcher.kill()
                node.launcher.wait()
            node.alive = False
        deadline = time.monotonic() + 10
        while left := self.leftovers():  # e.g. agents of a dead raylet, actors' children
            if time.monotonic() > deadline:
                raise AssertionError(f"Ray processes left after stop: {left}")
            for pid in left:
                _kill(pid)
            time.sleep(0.1)
        self._state = None
        shutil.rmtree(self.root, ignore_errors=True)

    def connect(self, **init_kwargs: Any) -> Any:
        """Make this process a driver of the cluster (`ray.init`); `ray.shutdown()` or
        `stop` ends that. It attaches to the head's raylet: Ray prefers the head among the
        nodes of one address. Returns Ray's context."""
        ray = require_ray()
        os.environ.update(DRIVER_ENV)
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # if imported before DRIVER_ENV
        init_kwargs.setdefault("logging_level", "WARNING")
        return ray.init(address=self.address, _node_ip_address=LOOPBACK, **init_kwargs)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    ray = require_ray()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in DRIVER_ENV.items():
            patch.setenv(name, value)
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        cluster = RayCluster(Path(tempfile.mkdtemp(prefix="ray-tg-", dir="/tmp")))
        try:
            cluster.start()
            table = cluster.node_table()
            ips = {n["NodeName"]: n["NodeManagerAddress"] for n in table}
            assert len(cluster.nodes()) == cluster.num_nodes, table
            assert set(ips.values()) == {LOOPBACK}, f"Ray nodes off loopback: {ips}"
            yield cluster
        finally:
            cluster.stop()


def _node_main(spec: dict[str, Any]) -> None:
    """Run one Ray node (this file as a script): start it, report it, and end it with its
    raylet, as `ray start --block` does, or with the test process, taking all of it along."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    parent = os.getppid()
    stopping = False

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    params = spec["params"]
    node = Node(RayParams(**params), head=spec["head"], shutdown_at_exit=False, spawn_reaper=True)
    signal.signal(signal.SIGTERM, on_sigterm)
    raylet = node.all_processes["raylet"][0].process
    ready = Path(params["temp_dir"]) / "node.json"
    ready.with_suffix(".tmp").write_text(
        json.dumps({"node_id": node.node_id, "raylet_pid": raylet.pid})
    )
    ready.with_suffix(".tmp").rename(ready)
    while not stopping and not node.dead_processes():  # type: ignore[no-untyped-call]
        if os.getppid() != parent:  # the test process is gone: nobody will call stop()
            stopping = True
        time.sleep(0.1)
    node.kill_all_processes(check_alive=False, allow_graceful=stopping, wait=True)
    if stopping:
        for pid in _processes(os.getpid(), params["temp_dir"]):
            _kill(pid)


if __name__ == "__main__":
    _node_main(json.loads(sys.argv[1]))
