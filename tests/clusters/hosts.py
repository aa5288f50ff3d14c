"""Hosts that share nothing, on this one machine: the multi-host tests' harness (issue 17).

Each host is a Linux network namespace with its own address on a bridge the harness
creates and its own loopback, and a mount namespace with its own /tmp, /dev/shm and
/etc/hosts (which names every host) and its own host name. Only the folders a test names
as visible (the repository with its venv, a "shared storage" folder) are common: a path
anywhere else under /tmp that one host writes, no other host sees. A process "on" a host
runs through `nsenter` into the namespaces held by that host's keeper process, so a
host's processes are exactly those in its network namespace: `kill` takes every one of
them (a machine that dies), `cut` takes its link down (a cable pulled; the processes go
on, unreachable).

Traffic stays between these namespaces: the bridge's own address (the test's side, which
reads Ray's node table) is the only other end on it, and it has no route anywhere.

Needs root (CI runs as root), iproute2 (`ip`) and util-linux (`unshare`, `nsenter`):
`require_hosts()` fails the test naming what is missing rather than skipping it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_TOOLS = ("ip", "unshare", "nsenter")


def require_hosts() -> None:
    """Fail (never skip) where the harness cannot run: a skipped test hides a broken part."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"the multi-host tests need {', '.join(missing)} (iproute2, util-linux)")
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests need root: they create network namespaces")


def _sh(*argv: str) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10/8 that no address or route of this machine touches."""
    used = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True)
    used_addr = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True)
    taken = (used.stdout + used_addr.stdout).decode()
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if str(net.network_address).rsplit(".", 1)[0] + "." not in taken:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test hosts")


def env_value(pid: int, name: str) -> str | None:
    """The value of `name` in a process's environment (None: not set, or the process is
    gone): how the cluster harnesses find the processes of their own test."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{name}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def _net_ns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass
class Host:
    """One host: its namespaces (held by `keeper`), its address, its private folder."""

    index: int
    netns: str  # the network namespace's name (`ip netns`)
    hostname: str
    ip: str
    link: str  # the bridge's end of its cable
    root: Path  # its private folder, as the test sees it: its /tmp is root/"tmp"
    visible: tuple[Path, ...]  # the paths under /tmp it shares with the test
    keeper: subprocess.Popen[bytes] | None = None
    net_id: str = ""  # /proc/PID/ns/net of its processes
    cut_off: bool = False

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command on this host."""
        assert self.keeper is not None
        return ["nsenter", f"--target={self.keeper.pid}", "--mount", "--net", "--uts", "--"]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen([*self.prefix(), *argv], **kwargs)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run([*self.prefix(), *argv], **kwargs)

    def outside(self, path: str | Path) -> Path:
        """Where the test finds a file this host names `path`."""
        p = Path(path)
        tmp = Path("/tmp")
        if not p.is_relative_to(tmp) or any(p.is_relative_to(v) for v in self.visible):
            return p
        return self.root / "tmp" / p.relative_to(tmp)

    def processes(self) -> list[int]:
        """Every live process on this host but its keeper."""
        mine = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                pid = int(entry.name)
                if pid != (self.keeper.pid if self.keeper else -1) and _net_ns_of(pid) == (
                    self.net_id
                ):
                    mine.append(pid)
        return mine

    def kill(self) -> int:
        """SIGKILL every process on this host (the machine dies); returns how many."""
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def cut(self) -> None:
        """Pull its cable: the link from the bridge goes down; its processes run on."""
        _sh("ip", "link", "set", self.link, "down")
        self.cut_off = True

    def mend(self) -> None:
        _sh("ip", "link", "set", self.link, "up")
        self.cut_off = False


@dataclass
class Hosts:
    """`count` hosts on a bridge; `shared` is the one folder every host (and the test) sees."""

    count: int = 3
    visible: tuple[Path, ...] = ()
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tg-hosts-")))
    hosts: list[Host] = field(default_factory=list)
    tag: str = field(default_factory=lambda: str(os.getpid()))  # names: tgb<pid>, tg<pid>h<i>

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    @property
    def bridge(self) -> str:
        return f"tgb{self.tag}"

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def start(self) -> None:
        require_hosts()
        sweep()
        net = _free_subnet()
        addrs = list(net.hosts())
        self.shared.mkdir(parents=True, exist_ok=True)
        visible = tuple(sorted({*self.visible, self.shared, _repo(), Path(sys.prefix)}))
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{addrs[0]}/{net.prefixlen}", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        self.observer_ip = str(addrs[0])
        for i in range(self.count):
            host = Host(
                index=i,
                netns=f"tg{self.tag}h{i}",
                hostname=f"tg-host-{i}",
                ip=str(addrs[10 + i]),
                link=f"tgv{self.tag}h{i}",
                root=self.base / f"host-{i}",
                visible=visible,
            )
            self.hosts.append(host)
            self._make(host, net.prefixlen)
        for host in self.hosts:
            self._keep(host)

    def _make(self, host: Host, prefixlen: int) -> None:
        _sh("ip", "netns", "add", host.netns)
        _sh(
            "ip",
            "link",
            "add",
            host.link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.netns,
        )
        _sh("ip", "link", "set", host.link, "master", self.bridge, "up")
        inside = ("ip", "-n", host.netns)
        _sh(*inside, "addr", "add", f"{host.ip}/{prefixlen}", "dev", "eth0")
        _sh(*inside, "link", "set", "eth0", "up")
        _sh(*inside, "link", "set", "lo", "up")

    def _keep(self, host: Host) -> None:
        """Start the process that holds the host's mount and UTS namespaces, and wait until
        its /tmp, /dev/shm and /etc/hosts are its own."""
        tmp = host.root / "tmp"
        tmp.mkdir(parents=True)
        names = "".join(f"{h.ip} {h.hostname}\n" for h in self.hosts)
        (host.root / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        binds = []
        for path in host.visible:
            if path.is_relative_to("/tmp"):
                inner = tmp / path.relative_to("/tmp")
                binds.append(f"mkdir -p {inner} && mount --rbind {path} {inner}")
        ready = tmp / ".host-ready"  # written from inside, once its /tmp is its own
        script = " && ".join(
            [
                f"hostname {host.hostname}",
                *binds,
                f"mount --bind {host.root / 'hosts'} /etc/hosts",
                f"mount --rbind {tmp} /tmp",
                "mount -t tmpfs -o size=2g tmpfs /dev/shm",
                "touch /tmp/.host-ready",
                f"exec {sys.executable} -c 'import signal; signal.pause()'",
            ]
        )
        enter = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts"]
        host.keeper = subprocess.Popen(
            [*enter, "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while not ready.exists():
            if host.keeper.poll() is not None or time.monotonic() > deadline:
                err = host.keeper.stderr.read().decode() if host.keeper.stderr else ""
                raise RuntimeError(f"host {host.index} did not come up: {err.strip()}")
            time.sleep(0.02)
        host.net_id = _net_ns_of(host.keeper.pid) or ""

    def stop(self) -> None:
        """Kill every process on every host, then remove the namespaces, links and folders;
        fails if a process outlives its host."""
        left: list[int] = []
        for host in self.hosts:
            if host.cut_off:
                with contextlib.suppress(RuntimeError):
                    host.mend()
            host.kill()
        deadline = time.monotonic() + 10
        while (left := [p for h in self.hosts for p in h.processes()]) and (
            time.monotonic() < deadline
        ):
            for host in self.hosts:
                host.kill()
            time.sleep(0.05)
        for host in self.hosts:
            if host.keeper is not None and host.keeper.poll() is None:
                host.keeper.kill()
                host.keeper.wait()
            if host.keeper is not None and host.keeper.stderr is not None:
                host.keeper.stderr.close()
            with contextlib.suppress(RuntimeError):
                _sh("ip", "netns", "delete", host.netns)
            with contextlib.suppress(RuntimeError):
                _sh("ip", "link", "delete", host.link)
        with contextlib.suppress(RuntimeError):
            _sh("ip", "link", "delete", self.bridge)
        shutil.rmtree(self.base, ignore_errors=True)
        if left:
            raise AssertionError(f"processes outlived their test hosts: {left}")

    def leftovers(self) -> list[str]:
        """What of this harness is still on the machine: namespaces, links, the folder."""
        out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found = [w for w in (self.bridge, *(h.link for h in self.hosts)) if f" {w}" in out]
        found += [h.netns for h in self.hosts if h.netns in ns]
        return found + ([str(self.base)] if self.base.exists() else [])


_NAME = re.compile(r"^(?:tgb(\d+)|tgv?(\d+)h\d+)$")  # a bridge, a netns or a link


def sweep() -> list[str]:
    """Remove what a harness killed before its teardown left (its namespaces and links
    carry its pid, which is gone); returns what it removed."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [w.split("@")[0] for w in ns] + [
        line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line
    ]
    gone = []
    for name in names:
        m = _NAME.match(name)
        if m and not Path(f"/proc/{m[1] or m[2]}").exists():
            kind = "netns" if name in ns else "link"
            with contextlib.suppress(RuntimeError):
                _sh("ip", kind, "delete", name)
                gone.append(name)
    return gone


def _repo() -> Path:
    return Path(__file__).resolve().parents[2]  # tests/clusters/ is two below the root


@contextlib.contextmanager
def hosts_on_a_bridge(count: int = 3, visible: Sequence[Path] = ()) -> Iterator[Hosts]:
    hosts = Hosts(count, tuple(visible))
    try:
        hosts.start()
        yield hosts
    finally:
        hosts.stop()
