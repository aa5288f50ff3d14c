"""The screenshots the docs show (issue 41), taken in Debian's headless Chromium from a
real server with a real job, so they show what the product shows today.

One job of two replicas: on attempt 0 worker-1 stalls outside any collective while worker-0
waits in "all_reduce" (a hang: stacks are taken, worker-1 named the culprit); on attempt 1
worker-1 prints an NVIDIA Xid and exits 1 (a hardware fault: the node ledger blames the
machine, which the job's spec puts on probation at the first one); attempt 2 runs through.
Running this file rewrites docs/images/*.png (only once every one is taken and checked:
a failed run leaves the old set); each is checked to be a real picture of its
view (the element was visible and said what it should; the PNG decodes and is not small).
"""

from __future__ import annotations

import re
import shutil
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from test_web import Server, browser, page, servers  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

IMAGES = Path(__file__).parents[2] / "docs" / "images"
VIEWPORT = {"width": 1280, "height": 800}
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."

TRAIN = f"""\
import os, sys, time
from trainguard import sdk

rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TRAINGUARD_RESTART_COUNT", "0"))


def all_reduce_gradients():
    time.sleep(60)


def load_next_batch():
    time.sleep(60)


print(f"worker {{rank}}: attempt {{attempt}}, starting", flush=True)
for step in range(1, 31):
    sdk.report({{"step": step, "loss": round(2.0 / step, 4)}})
    if step % 5 == 0:
        print(f"worker {{rank}}: step {{step}} loss {{2.0 / step:.3f}}", flush=True)
    if attempt == 0 and step == 12:
        print(f"worker {{rank}}: stuck at step {{step}}", flush=True)
        load_next_batch() if rank == 1 else all_reduce_gradients()
    if attempt == 1 and step == 8 and rank == 1:
        print({XID!r}, flush=True)
        sys.exit(1)
    time.sleep(0.1)
if rank == 0:  # the primary ends last (as it would after a final save): all ranks succeed
    time.sleep(0.5)
print(f"worker {{rank}}: done", flush=True)
"""

# one machine-blamed failure puts a node on probation (the default asks 3 from 2 jobs)
SPEC = "fault_tolerance:\n  node_probation:\n    faults: 1\n    jobs: 1\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG that decodes: its IDAT inflates to one filter byte and
    width pixels a row, and the rows are not all alike (a blank picture's would be)."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), data[:16]
    length, kind, width, height, depth, colour = struct.unpack(">I4sIIBB", data[8:26])
    assert kind == b"IHDR" and length == 13 and depth == 8, (kind, length, depth)
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    idat, pos = b"", 8
    while pos < len(data):
        n, chunk = struct.unpack(">I4s", data[pos : pos + 8])
        if chunk == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width * channels), (len(raw), width, height)
    stride = 1 + width * channels
    assert len({raw[i : i + stride] for i in range(0, len(raw), stride)}) > height // 10
    return width, height


def shoot(target: Any, path: Path, min_size: tuple[int, int], **how: Any) -> None:
    """Screenshot a page or an element into `path`; check it is a real picture."""
    data = target.screenshot(path=str(path), animations="disabled", **how)
    assert path.read_bytes() == data
    width, height = png_size(data)
    assert width >= min_size[0] and height >= min_size[1], (path.name, width, height)
    assert len(data) > 15_000, (path.name, len(data))


def test_the_docs_screenshots(
    servers: list[Server],  # noqa: F811 (the fixture)
    page: Any,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    server = Server(tmp_path / "home")
    servers.append(server)
    script, spec = tmp_path / "train.py", tmp_path / "job.yaml"
    script.write_text(TRAIN)
    spec.write_text(SPEC)
    job_id = server.submit(
        "-f", str(spec), "--job-name", "train-demo", "--nproc-per-node", "2",
        "--max-restarts", "3", "--job-hang-interval", "2",
        "--", sys.executable, str(script),
    )  # fmt: skip
    shots = tmp_path / "images"  # copied to docs/images once every one is taken and checked
    shots.mkdir()
    page.set_viewport_size(VIEWPORT)
    page.goto(f"{server.url}/#token={server.token}")
    page.goto(f"{server.url}/#/jobs/{job_id}")

    # the job page, once the job has run through: every panel holds its final answer
    expect(page.get_by_test_id("job-state")).to_have_text("SUCCEEDED", timeout=40_000)
    expect(page.get_by_test_id("job-restarts")).to_have_text("2")
    expect(page.get_by_test_id("job-step")).to_have_text("30")
    expect(page.get_by_test_id("replica-row")).to_have_count(2)
    expect(page.get_by_test_id("progress-chart")).to_be_visible()
    expect(page.get_by_test_id("log-tail")).to_contain_text("worker 0: done")
    head = page.get_by_test_id("job-head")
    expect(head).to_contain_text("train-demo")
    expect(head).to_contain_text(job_id)
    page.evaluate("window.scrollTo(0, 0)")
    top = page.locator(".grid2").bounding_box()  # down to goodput and progress
    assert top is not None
    clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": top["y"] + top["height"]}
    shoot(page, shots / "job-page.png", (VIEWPORT["width"], 700), full_page=True, clip=clip)

    # the restart timeline: the hang, then the Xid, each with its decision and phases
    timeline = page.locator("section.card", has=page.locator("#sec-timeline"))
    records = timeline.get_by_test_id("restart-record")
    expect(records).to_have_count(2)
    expect(records.get_by_test_id("restart-replica")).to_have_text(["worker-1", "worker-1"])
    expect(records.nth(0).get_by_test_id("restart-class")).to_have_text("hang")
    expect(records.nth(0)).to_contain_text("stack dump of attempt 0")
    expect(records.nth(1)).to_contain_text("Xid")
    expect(records).to_contain_text(["RestartJob", "RestartJob"])
    expect(timeline).to_contain_text("first output")
    shoot(timeline, shots / "restart-timeline.png", (600, 150))

    # the stacks taken at the hang: worker-1 the culprit, worker-0 waiting in all_reduce
    stacks = page.locator("section.card", has=page.get_by_test_id("stacks"))
    snapshot = stacks.get_by_test_id("snapshot")
    expect(snapshot).to_have_count(1)
    expect(snapshot.get_by_test_id("culprit")).to_have_text("worker-1")
    expect(snapshot.locator("tr.culprit")).to_contain_text("worker-1")
    expect(snapshot.get_by_test_id("snapshot-summary")).to_contain_text("load_next_batch")
    expect(snapshot).to_contain_text("all_reduce_gradients")
    shoot(stacks, shots / "stacks.png", (600, 200))

    # goodput: the productive share against what the hang and the restarts cost
    goodput = page.locator("section.card", has=page.get_by_test_id("goodput"))
    expect(goodput.get_by_test_id("goodput-value")).to_have_text(re.compile(r"^\d+(\.\d)?%$"))
    expect(goodput.locator('rect[data-part="productive"]')).to_have_count(1)
    expect(goodput).to_contain_text("2 failures")
    expect(goodput.locator('[data-testid="goodput-row"][data-part="hang_waiting"]')).to_be_visible()
    shoot(goodput, shots / "goodput.png", (400, 150))

    # the node ledger: this machine on probation after the Xid, its history open
    page.get_by_test_id("nav-nodes").click()
    nodes = page.locator("section.card", has=page.get_by_test_id("nodes"))
    row = nodes.get_by_test_id("node-row")
    expect(row).to_have_count(1)
    expect(row.get_by_test_id("node-state")).to_contain_text("probation")
    expect(row.get_by_test_id("node-release")).to_be_visible()
    row.locator("summary").click()
    expect(row.get_by_test_id("node-event")).to_have_count(2)
    expect(row.get_by_test_id("node-event").first).to_contain_text(job_id)
    expect(row).to_contain_text("GPU has fallen off the bus")
    shoot(nodes, shots / "nodes.png", (600, 150))

    assert page.page_errors == []
    server.note_pids()
    IMAGES.mkdir(parents=True, exist_ok=True)
    for shot in sorted(shots.glob("*.png")):
        shutil.copyfile(shot, IMAGES / shot.name)
