"""The Ray test cluster itself: three nodes on loopback, placement by node, and node loss."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import raycluster
from conftest import alive, wait_for
from raycluster import LOOPBACK, RayCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ray_cluster = raycluster.ray_cluster  # the module's cluster


@pytest.fixture
def ray(ray_cluster: RayCluster) -> Iterator[Any]:
    """This test process as the cluster's driver, for one test."""
    ray_cluster.connect()
    import ray

    try:
        yield ray
    finally:
        ray.shutdown()


def probe(ray: Any, node: raycluster.RayNode) -> Any:
    """An actor on `node` that says where it runs and starts a command there, as a replica
    host does. Defined in here so that Ray pickles it whole: its workers can't import tests."""

    @ray.remote(num_cpus=1)
    class Probe:
        def where(self) -> tuple[str, int]:
            return ray.get_runtime_context().get_node_id(), os.getpid()

        def spawn(self) -> int:
            return subprocess.Popen(["sleep", "600"], start_new_session=True).pid

    return Probe.options(resources={node.resource: 0.01}).remote()  # type: ignore[attr-defined]


def test_three_nodes_on_loopback(ray_cluster: RayCluster, ray: Any) -> None:
    nodes = ray.nodes()
    assert len(nodes) == 3
    assert all(n["Alive"] and n["NodeManagerAddress"] == LOOPBACK for n in nodes), nodes
    assert [n["index"] for n in sorted(ray_cluster.nodes(), key=lambda n: n["index"])] == [0, 1, 2]
    for node in ray_cluster.all_nodes:
        resources = next(n["Resources"] for n in nodes if n["NodeID"] == node.node_id)
        assert resources["CPU"] == 2 and resources[node.resource] == 1
    assert ray.get_runtime_context().get_node_id() == ray_cluster.node(0).node_id


def test_actor_placed_on_a_given_node(ray_cluster: RayCluster, ray: Any) -> None:
    for node in ray_cluster.all_nodes:
        actor = probe(ray, node)
        assert ray.get(actor.where.remote())[0] == node.node_id
        ray.kill(actor)


def test_kill_node_takes_the_node_and_its_processes(ray_cluster: RayCluster, ray: Any) -> None:
    victim, survivor = ray_cluster.node(1), ray_cluster.node(2)
    actor = probe(ray, victim)
    _, worker = ray.get(actor.where.remote())
    command = ray.get(actor.spawn.remote())  # in a session of its own, like a replica

    seconds = ray_cluster.kill_node(1)

    assert seconds < 5
    assert {n["index"] for n in ray_cluster.nodes()} == {0, 2}
    dead = next(n for n in ray.nodes() if n["NodeID"] == victim.node_id)
    assert not dead["Alive"]
    wait_for(lambda: not alive(worker) and not alive(command), 5, "the node's processes to die")
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.where.remote(), timeout=30)
    assert ray.get(probe(ray, survivor).where.remote())[0] == survivor.node_id

    started = time.monotonic()
    ray_cluster.heal()
    assert len(ray_cluster.nodes()) == 3 and time.monotonic() - started < 15
