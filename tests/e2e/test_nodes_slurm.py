"""The node ledger across jobs on a real Slurm cluster (R-EVID-4; tests/clusters/slurmcluster.py: 3
nodes on hosts that share nothing, one store on their shared folder).

Three jobs each lose a replica on tg-host-0 to a GPU that fell off the bus (the driver's
Xid 79 line, which the catalogue reads as hardware); a fourth fails with a bug there, which
counts against no node. The third machine fault, from the third job, puts tg-host-0 on
probation: a notification fires, Slurm drains it (the spec allows), and the fifth job, in an
allocation that holds tg-host-0 again (resumed in Slurm, still on probation in trainguard's
ledger), is placed on another node. `trainguard nodes` shows it; `nodes release` forgives it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import slurmcluster
from conftest import TG
from slurmcluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster

TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))
BAD = "tg-host-0"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."

# Fails its first attempt on the bad node, as the job's argument says: with the driver's
# Xid line (the machine's fault), or with a KeyError (the job's own bug).
SCRIPT = f"""\
import os, socket, sys
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
attempt = os.environ.get("TRAINGUARD_ATTEMPT", "0")
print(f"on {{node}}, attempt {{attempt}}", flush=True)
if node == {BAD!r} and attempt == "0":
    if sys.argv[1] == "xid":
        print({XID!r}, flush=True)
        sys.exit(1)
    raise KeyError("lr")
"""


def _run_job(slurm: SlurmCluster, shared: Path, name: str, how: str, drain: bool) -> str:
    """One job of one replica in a 3-node allocation, to its end; its stderr."""
    script = shared / "fails.py"
    script.write_text(SCRIPT)
    notes = shared / "notes.jsonl"
    spec = shared / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nbackend: slurm\nslurm: {{nodes: 1}}\n"
        f"fault_tolerance: {{node_probation: {{drain: {str(drain).lower()}}}}}\n"
        "notifications:\n"
        "  - sink: command\n    events: [node_probation]\n"
        f"    command: [sh, -c, 'cat >> {notes}; echo >> {notes}']\n"
        "worker_pools:\n  - role: worker\n    replicas: 1\n"
        f"    command: [{sys.executable}, {script}, {how}]\n"
    )
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    argv = ["salloc", "-N3", "--no-kill", TRAINGUARD, "run", "--plain", "-f", str(spec)]
    res = slurm.run(argv, env=env, cwd=shared, timeout=180)
    return res.stderr


def test_one_host_failing_three_jobs_is_put_on_probation_and_avoided(
    slurm_cluster: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    slurm = slurm_cluster
    slurm.heal()
    shared = slurm.hosts.shared / request.node.name
    shared.mkdir(parents=True)
    tg = TG(shared / "home")
    try:
        for i, (how, drain) in enumerate((("xid", False), ("bug", False), ("xid", False))):
            err = _run_job(slurm, shared, f"job{i}", how, drain)
            status = tg.json("status", f"job{i}")
            want = ("SUCCEEDED", 2) if how == "xid" else ("FAILED", 1)  # a bug: stopped
            assert (status["state"], status["attempts"]) == want, err[-3000:]
            assert status["replicas"][0]["node"] == BAD, status  # it ran there again
        rows = {r["node"]: r for r in tg.json("nodes", "--json")}
        assert list(rows) == [BAD]  # the bug counted against no node
        assert rows[BAD]["state"] == "ok" and (rows[BAD]["faults"], rows[BAD]["jobs"]) == (2, 2)

        err = _run_job(slurm, shared, "job3", "xid", True)  # the third machine fault
        rows = {r["node"]: r for r in tg.json("nodes", "--json")}
        bad = rows[BAD]
        assert bad["state"] == "probation" and bad["needs_check"], (bad, err[-3000:])
        assert (bad["faults"], bad["jobs"]) == (3, 3)
        assert "3 machine-blamed failures within 24 h from 3 jobs" in bad["reason"]
        faults = [h for h in bad["history"] if h["kind"] == "fault"]
        assert [h["job_id"] for h in faults] == [
            tg.json("status", f"job{i}")["id"] for i in (0, 2, 3)
        ]
        assert {h["rule"] for h in faults} == {"gpu-xid"} and faults[0]["matched_line"] == XID
        assert f"node {BAD} is on probation" in err
        (note,) = [json.loads(n) for n in (shared / "notes.jsonl").read_text().split("\n\n") if n]
        assert note["event"] == "node_probation" and note["node"] == BAD
        assert "DRAIN" in slurm.node_state(BAD)  # the spec allowed it
        assert "Reason=trainguard: 3 machine-blamed" in slurm.scontrol("show", "node", BAD)
        slurm.scontrol("update", f"nodename={BAD}", "state=resume")  # Slurm forgets

        err = _run_job(slurm, shared, "job4", "xid", False)  # trainguard does not
        status = tg.json("status", "job4")
        assert status["state"] == "SUCCEEDED" and status["attempts"] == 1, err[-3000:]
        assert status["replicas"][0]["node"] != BAD, status
        assert f"nodes on probation, avoided where a spare is left: {BAD}" in err

        table = tg("nodes").stdout
        assert f"{BAD} " in table and "probation (needs check)" in table
        released = tg("nodes", "release", BAD)
        assert released.returncode == 0 and "released" in released.stdout
        (row,) = tg.json("nodes", "--json")
        assert row["state"] == "ok" and row["faults"] == 0
    finally:  # the next test finds every node in service
        slurm.run(["scontrol", "update", f"nodename={BAD}", "state=resume"])
