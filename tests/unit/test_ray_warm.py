"""A restart on Ray forks from its node's zygote even when it comes before that zygote has
finished importing (a fresh-clone run under load: the crash at step 20 came first, and
the restart started cold). The node's first attempt still starts cold."""

from __future__ import annotations

import asyncio

import pytest

from trainguard.backends.ray import warm
from trainguard.backends.ray.warm import NodeZygotes


def _importing(zygotes: NodeZygotes, node: str, import_s: float) -> object:
    """A zygote on `node` that finishes importing after `import_s`."""
    actor = object()

    async def warm_up() -> None:
        await asyncio.sleep(import_s)
        zygotes._usable.add(node)

    zygotes._modules = ["torch"]
    zygotes._actors[node] = actor
    zygotes._ready[node] = asyncio.create_task(warm_up())
    return actor


def test_a_restart_waits_for_the_zygote_an_earlier_start_made() -> None:
    async def go() -> tuple[object, object]:
        zygotes = NodeZygotes(["torch"])
        actor = _importing(zygotes, "n0", 0.2)
        return actor, await zygotes.ready("n0", "worker-0")

    actor, got = asyncio.run(go())
    assert got is actor


def test_the_first_attempt_on_a_node_does_not_wait_for_its_zygote() -> None:
    async def go() -> object:
        zygotes = NodeZygotes(["torch"])
        _importing(zygotes, "n0", 5)
        zygotes._fresh = {"n0"}
        got = await zygotes.ready("n0", "worker-0")
        zygotes._ready["n0"].cancel()
        return got

    assert asyncio.run(go()) is None


def test_a_zygote_that_does_not_finish_in_time_leaves_the_replica_cold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm, "WARM_WAIT_S", 0.05)

    async def go() -> tuple[object, list[str], bool]:
        zygotes = NodeZygotes(["torch"])
        _importing(zygotes, "n0", 5)
        got = await zygotes.ready("n0", "worker-1")
        alive = not zygotes._ready["n0"].done()  # the wait did not cancel its import
        zygotes._ready["n0"].cancel()
        return got, zygotes.notes, alive

    got, notes, alive = asyncio.run(go())
    assert got is None and alive
    assert notes == ["worker-1 starts cold: its node's zygote is still importing after 0 s"]
