"""A real 3-node Slurm cluster on hosts that share nothing (tests/clusters/hosts.py), for the Slurm
backend's tests.

Debian's Slurm (slurm-wlm 22.05) and MUNGE, as packaged, started by hand: `slurm_cluster`
(module scope) starts on each of 3 hosts a munged and a slurmd; host 0 also runs
slurmctld, and is the batch host (where a job's batch script or `salloc` shell runs) and
the login node: `SlurmCluster.run` / `popen` run a client (sbatch, salloc, srun, scontrol,
sinfo, squeue, scancel) there, with SLURM_CONF set (`env`).

Layout. A Slurm node is named after its host (`tg-host-<i>`, the host's own host name, so
slurmd needs no `-N`), with `NodeAddr` its address on the bridge. What every host reads is
in a folder they all see (`conf_dir`, in the hosts' shared folder): slurm.conf,
cgroup.conf and the MUNGE key. What is a machine's own is under /tmp/slurm on that host,
that host's own /tmp: the munged socket (`AuthInfo=socket=...`: one path naming each
host's own munged), slurmd's spool, pid and log files, slurmctld's state, each daemon's
output (`<daemon>.out`). `Host.outside` finds them from the test; `logs()` tails them.

Configuration (`slurm_conf`): no cgroups (proctrack/linuxproc, task/none; cgroup.conf
names cgroup/v1 only because 22.05's slurmd loads a cgroup plugin whatever the rest says,
and autodetection fails on some machines: the plugin is then never used), no accounting,
cons_tres with CR_CPU, 4 CPUs a node (more than this machine has:
`SlurmdParameters=config_overrides`), SlurmUser root, and fast failure detection: a node
that stops answering is NOT_RESPONDING ~5 s after and DOWN ~11 s after (SlurmdTimeout=5),
and comes back by itself when its slurmd registers again (ReturnToService=2).

A machine that dies is `kill(i)`: `Host.kill()`, SIGKILL to every process on the host (its
munged, slurmd, slurmstepd and tasks; on host 0 slurmctld and the clients too). `revive(i)`
is the machine rebooted: its munged, slurmd (and slurmctld) start again on the same host
with the state they left on disk; `heal()` revives every dead node and cancels what jobs
are left, for a test after one that killed something.

Every process started here carries MARKER (the test process's pid) in its environment, and
so does what Slurm starts for it (slurmstepd, tasks): `sweep` kills what a test process
killed before its teardown left behind (tests/clusters/hosts.py's own sweep removes namespaces).

Missing Slurm or MUNGE fails the tests (scripts/system_deps.sh installs them), never skips.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hosts import Host, Hosts, env_value, hosts_on_a_bridge, require_hosts

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "salloc", "srun", "scontrol", "sinfo", "squeue", "scancel")
MARKER = "TRAINGUARD_SLURM_TEST"  # in every daemon's environment: the test process's pid
STATE = Path("/tmp/slurm")  # on each host, its own
MUNGE_SOCKET = STATE / "munge" / "munge.socket.2"
CPUS = 4
MEMORY_MB = 2048
PARTITION = "main"
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


def _which(name: str) -> str | None:
    """A program's path: in PATH, or in /usr/sbin where Debian puts the daemons."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def require_slurm() -> None:
    """Fail (never skip) where the cluster cannot run, naming what is missing."""
    require_hosts()
    missing = [t for t in (*DAEMONS, *CLIENTS) if _which(t) is None]
    if missing:
        pytest.fail(
            f"the Slurm tests need {', '.join(missing)}: apt-get install slurm-wlm munge "
            "(scripts/system_deps.sh)",
            pytrace=False,
        )


def _daemon(name: str) -> str:
    path = _which(name)
    if path is None:
        raise RuntimeError(f"{name} not found (require_slurm first)")
    return path


def sweep() -> list[int]:
    """SIGKILL the processes of clusters whose test process is gone; returns their pids."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        owner = env_value(int(entry.name), MARKER)
        if owner and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def slurm_conf(hosts: Hosts, cpus: int = CPUS, memory_mb: int = MEMORY_MB) -> str:
    head = hosts[0]
    nodes = "".join(
        f"NodeName={h.hostname} NodeAddr={h.ip} NodeHostname={h.hostname} CPUs={cpus} "
        f"RealMemory={memory_mb} State=UNKNOWN\n"
        for h in hosts.hosts
    )
    return f"""\
# Written by tests/clusters/slurmcluster.py
ClusterName=trainguard
SlurmctldHost={head.hostname}({head.ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={MUNGE_SOCKET}
StateSaveLocation={STATE}/ctld
SlurmdSpoolDir={STATE}/spool
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd.pid
SlurmctldLogFile={STATE}/slurmctld.log
SlurmdLogFile={STATE}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
SlurmdTimeout=5
MessageTimeout=3
ReturnToService=2
KillWait=2
InactiveLimit=0
JobRequeue=1
MinJobAge=2
Waittime=0
MailProg=/bin/true
{nodes}PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmNode:
    """A Slurm node: its host, and the daemons started on it (the latest of each)."""

    name: str
    host: Host
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    up: bool = False  # its daemons started, and not killed since


class SlurmCluster:
    """Slurm on `hosts`: a node on each, slurmctld on host 0."""

    def __init__(self, hosts: Hosts, cpus: int = CPUS, memory_mb: int = MEMORY_MB) -> None:
        self.hosts = hosts
        self.cpus, self.memory_mb = cpus, memory_mb
        self.conf_dir = hosts.shared / "slurm"
        self.conf = self.conf_dir / "slurm.conf"
        self.key = self.conf_dir / "munge.key"
        self.nodes = [SlurmNode(h.hostname, h) for h in hosts.hosts]
        # What clients and daemons run with: none of the SLURM_* variables of a Slurm job
        # this test may itself run in (srun would take them for its allocation).
        mine = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env = {**mine, "SLURM_CONF": str(self.conf), MARKER: str(os.getpid())}
        self._started: list[subprocess.Popen[bytes]] = []  # every daemon, dead ones too

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def batch_host(self) -> Host:
        return self.hosts[0]

    def node(self, which: int | str) -> SlurmNode:
        """A node by index (its host's) or by name."""
        if isinstance(which, int):
            return self.nodes[which]
        return next(n for n in self.nodes if n.name == which)

    # --- running things ---------------------------------------------------------------

    def run(
        self, argv: Sequence[str], host: Host | None = None, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (a Slurm client) on `host` (host 0), SLURM_CONF set."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return (host or self.batch_host).run(argv, timeout=timeout, **kwargs)

    def popen(
        self, argv: Sequence[str], host: Host | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start a command (a Slurm client) on `host` (host 0), SLURM_CONF set."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return (host or self.batch_host).popen(argv, **kwargs)

    def scontrol(self, *args: str) -> str:
        """`scontrol ARGS` on host 0: its output, or RuntimeError with its stderr."""
        res = self.run(["scontrol", *args], timeout=30)
        if res.returncode:
            raise RuntimeError(f"scontrol {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    # --- state ------------------------------------------------------------------------

    def node_state(self, which: int | str) -> str:
        """The node's State= in `scontrol show node`, e.g. IDLE, ALLOCATED, MIXED,
        IDLE+NOT_RESPONDING, DOWN+NOT_RESPONDING, IDLE+COMPLETING."""
        name = self.node(which).name
        m = re.search(r"\bState=(\S+)", self.scontrol("show", "node", name))
        if not m:
            raise RuntimeError(f"no State= for node {name}")
        return m[1]

    def sinfo(self) -> dict[str, str]:
        """Each node's compact state in sinfo: idle, alloc, mix, down*, idle*, comp..."""
        res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        if res.returncode:
            raise RuntimeError(f"sinfo: {res.stderr.strip()}")
        return dict(line.split() for line in res.stdout.splitlines() if line.strip())

    def wait_idle(self, names: Sequence[str] | None = None, timeout: float = 30) -> float:
        """Wait until sinfo shows `names` (all nodes) idle; returns the seconds it took."""
        want = list(names or self.names)
        start = time.monotonic()
        seen: dict[str, str] = {}
        while time.monotonic() - start < timeout:
            self._check_daemons()
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                seen = self.sinfo()
                if all(seen.get(n) == "idle" for n in want):
                    return time.monotonic() - start
            time.sleep(0.2)
        raise AssertionError(f"nodes {want} not idle after {timeout}s: {seen}\n{self.logs()}")

    def wait_state(
        self, which: int | str, pred: Callable[[str], bool], timeout: float = 30
    ) -> float:
        """Wait until `pred(node_state(which))` holds; returns the seconds it took."""
        start = time.monotonic()
        state = ""
        while time.monotonic() - start < timeout:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                state = self.node_state(which)
                if pred(state):
                    return time.monotonic() - start
            time.sleep(0.2)
        raise AssertionError(f"node {which} still {state} after {timeout}s")

    # --- daemons ----------------------------------------------------------------------

    def _spawn(self, node: SlurmNode, name: str, argv: Sequence[str]) -> None:
        with open(node.host.outside(STATE / f"{name}.out"), "ab") as log:  # the child's now
            proc = node.host.popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        node.daemons[name] = proc
        self._started.append(proc)

    def _start_munged(self, node: SlurmNode, timeout: float = 20) -> None:
        node.host.outside(STATE).mkdir(parents=True, exist_ok=True)
        munge_dir = node.host.outside(MUNGE_SOCKET.parent)
        munge_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        socket = node.host.outside(MUNGE_SOCKET)
        socket.unlink(missing_ok=True)
        self._spawn(
            node,
            "munged",
            [
                _daemon("munged"),
                "--foreground",
                "--force",
                f"--socket={MUNGE_SOCKET}",
                f"--key-file={self.key}",
                f"--pid-file={MUNGE_SOCKET.parent / 'munged.pid'}",
                f"--log-file={MUNGE_SOCKET.parent / 'munged.log'}",
                f"--seed-file={MUNGE_SOCKET.parent / 'munged.seed'}",
                "--num-threads=2",
            ],
        )
        deadline = time.monotonic() + timeout
        while not socket.exists():
            self._check(node, "munged", deadline)
            time.sleep(0.05)

    def _start_slurmd(self, node: SlurmNode) -> None:
        node.host.outside(STATE / "spool").mkdir(parents=True, exist_ok=True)
        self._spawn(node, "slurmd", [_daemon("slurmd"), "-D", "-f", str(self.conf)])
        node.up = True

    def _check(self, node: SlurmNode, name: str, deadline: float) -> None:
        proc = node.daemons[name]
        if proc.poll() is None and time.monotonic() < deadline:
            return
        what = "exited" if proc.poll() is not None else "did not come up"
        pytest.fail(f"{name} on {node.name} {what}:\n{self.logs(node)}", pytrace=False)

    def _check_daemons(self) -> None:
        for node in self.nodes:
            for name, proc in node.daemons.items():
                if node.up and proc.poll() is not None:
                    pytest.fail(
                        f"{name} on {node.name} exited ({proc.returncode}):\n{self.logs(node)}",
                        pytrace=False,
                    )

    def logs(self, node: SlurmNode | None = None, tail: int = 3000) -> str:
        out = []
        for n in [node] if node else self.nodes:
            for name in ("munged.out", "munge/munged.log", "slurmd.out", "slurmd.log"):
                out.append(self._tail(n.host, STATE / name, tail))
        out.append(self._tail(self.batch_host, STATE / "slurmctld.out", tail))
        out.append(self._tail(self.batch_host, STATE / "slurmctld.log", tail))
        return "\n".join(o for o in out if o)

    @staticmethod
    def _tail(host: Host, path: Path, tail: int) -> str:
        seen = host.outside(path)
        if not seen.exists():
            return ""
        return f"--- {host.hostname}:{path}\n{seen.read_text(errors='replace')[-tail:]}"

    def start(self, timeout: float = 60) -> None:
        """Write the configuration and the MUNGE key, start munged on every host, slurmctld
        on host 0, then slurmd on every host; return once sinfo shows every node idle."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(slurm_conf(self.hosts, self.cpus, self.memory_mb))
        (self.conf_dir / "cgroup.conf").write_text(CGROUP_CONF)
        self.key.write_bytes(os.urandom(1024))
        self.key.chmod(0o600)
        for node in self.nodes:
            self._start_munged(node)
        self._start_slurmctld(timeout)
        for node in self.nodes:
            self._start_slurmd(node)
        self.wait_idle(timeout=timeout)

    def _start_slurmctld(self, timeout: float) -> None:
        head = self.nodes[0]
        head.host.outside(STATE / "ctld").mkdir(parents=True, exist_ok=True)
        self._spawn(head, "slurmctld", [_daemon("slurmctld"), "-D", "-f", str(self.conf)])
        deadline = time.monotonic() + timeout
        while self.run(["scontrol", "ping"], timeout=30).returncode:
            self._check(head, "slurmctld", deadline)
            time.sleep(0.1)

    def kill(self, which: int | str) -> int:
        """The node's machine dies: SIGKILL every process on its host (its munged, slurmd,
        slurmstepd and tasks; on host 0 slurmctld and the clients too); returns how many."""
        node = self.node(which)
        node.up = False
        count = node.host.kill()
        self._reap(node)
        return count

    def cut(self, which: int | str) -> None:
        """The node's cable is pulled: its processes run on, nothing reaches them and no
        connection closes (`revive` mends it, as a reboot)."""
        node = self.node(which)
        node.up = False
        node.host.cut()

    def _reap(self, node: SlurmNode) -> None:
        for proc in node.daemons.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.host.kill()
                proc.wait(timeout=10)

    def revive(self, which: int | str, timeout: float = 30) -> float:
        """The dead node's machine comes back (rebooted: what was left on it is killed, its
        cable mended): munged, slurmctld on host 0, and slurmd start again, with the state
        they had on disk. Returns the seconds until sinfo shows the node idle."""
        node = self.node(which)
        start = time.monotonic()
        if node.host.cut_off:
            node.host.mend()
        node.up = False
        node.host.kill()
        self._reap(node)
        self._start_munged(node)
        if node is self.nodes[0]:
            self._start_slurmctld(timeout)
        self._start_slurmd(node)
        if node is self.nodes[0]:
            # slurmctld came back with the state it last saved: jobs that were running
            # then are listed running still, though their batch scripts and clients
            # died with host 0 (and with InactiveLimit=0 it would wait for them forever).
            self.run(["scancel", "--state=RUNNING"], timeout=30)
            self.run(["scancel", "--state=SUSPENDED"], timeout=30)
            self.wait_idle(timeout=timeout)
        else:
            self.wait_idle([node.name], timeout=timeout)
        return time.monotonic() - start

    def heal(self, timeout: float = 30) -> None:
        """Revive every node an earlier test killed, then wait until all nodes are idle
        (jobs an earlier test left are cancelled)."""
        for node in self.nodes:
            if not node.up:
                self.revive(node.name, timeout)
        self.run(["scancel", "--user=root"], timeout=30)
        self.wait_idle(timeout=timeout)

    def processes(self) -> dict[str, list[str]]:
        """What runs on each host beyond Slurm's and MUNGE's daemons (slurmstepd, tasks,
        clients): {node: ["pid cmdline", ...]}, nodes with none left out."""
        daemons = {p.pid for n in self.nodes for p in n.daemons.values()}
        found: dict[str, list[str]] = {}
        for node in self.nodes:
            for pid in node.host.processes():
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                if pid not in daemons and comm != "slurmscriptd":  # slurmctld's helper
                    found.setdefault(node.name, []).append(f"{pid} {cmd.decode().strip()}")
        return found

    def stop(self) -> None:
        """Kill everything on every host and reap the daemons (the hosts' own teardown
        then checks that nothing is left)."""
        for node in self.nodes:
            node.up = False
            node.host.kill()
        for proc in self._started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    require_slurm()
    sweep()
    with hosts_on_a_bridge(3) as hosts:
        cluster = SlurmCluster(hosts)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
    assert hosts.leftovers() == []
