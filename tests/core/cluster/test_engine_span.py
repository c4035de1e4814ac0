"""Engines larger than a node: which bundles an engine spans, on which nodes, what the engine
is told of them, and the one-line refusal for an engine that cannot run so. Fake placements
(no Ray): the two-node run is tests/e2e/test_multinode.py."""

from __future__ import annotations

import pytest

from plugrl.cluster import engines as engines_module
from plugrl.cluster.engines import (
    check_spans_nodes,
    group_by_node,
    make_engine_group,
    span_nodes,
)
from plugrl.errors import PluginError
from plugrl.parts.context import EngineSpan, SpanNode
from plugrl.plugin.manager import PluginManager
from plugrl.recipe import build_recipe


class _Nodes:
    """A placement of ``nodes`` nodes of ``per_node`` one-device bundles, bundle ``b`` on node
    ``b // per_node``; ``order`` reorders them as Ray's PACK may."""

    placement_group = "pg"
    devices_per_bundle = 1
    share = 0.5  # the actor's and the engines' shares of each bundle

    def __init__(self, nodes: int, per_node: int, order: list[int] | None = None) -> None:
        self.where = {}
        for slot, bundle in enumerate(order or range(nodes * per_node)):
            self.where[bundle] = (f"node{slot // per_node}", [str(slot % per_node)])

    def bundle_devices(self, role, bundles):
        return [self.where[b] for b in bundles]

    def actor_options(self, role, bundle):
        return {"bundle": bundle}


class _NoSpan:
    spans_nodes = False


class _Spans:
    spans_nodes = True


def test_an_engine_of_two_nodes_devices_is_grouped_by_node_its_own_first():
    placement = _Nodes(2, 2)
    assert span_nodes(placement, "rollout", [[0, 1], [2, 3]]) == [
        [("node0", [0, 1], ["0", "1"])],
        [("node1", [2, 3], ["0", "1"])],
    ]
    # tp 4 over two nodes of two: one engine, its actor on node0 (bundle 0's)
    assert span_nodes(placement, "rollout", [[0, 1, 2, 3]]) == [
        [("node0", [0, 1], ["0", "1"]), ("node1", [2, 3], ["0", "1"])]
    ]
    # Ray may pack bundles out of order: the node of the span's first bundle comes first
    mixed = _Nodes(2, 2, order=[2, 0, 3, 1])
    assert span_nodes(mixed, "rollout", [[0, 1, 2, 3]]) == [
        [("node0", [0, 2], ["1", "0"]), ("node1", [1, 3], ["1", "0"])]
    ]


def test_grouping_keeps_the_order_the_span_reaches_each_node():
    where = {0: ("b", []), 1: ("a", []), 2: ("b", []), 3: ("c", [])}
    assert group_by_node([0, 1, 2, 3], where) == [
        ("b", [0, 2], []),
        ("a", [1], []),
        ("c", [3], []),
    ]


def test_an_engine_that_cannot_span_nodes_is_refused_in_one_line_naming_its_devices():
    one_node = [("8a51982ff101aaaa", [0, 1], ["0", "1"])]
    two_nodes = [("8a51982ff101aaaa", [0, 1], ["0", "1"]), ("778ffeba26a4bbbb", [2, 3], ["0", "1"])]
    check_spans_nodes("tiny", _NoSpan, 0, one_node)
    check_spans_nodes("tiny", _Spans, 0, two_nodes)
    with pytest.raises(PluginError) as info:
        check_spans_nodes("tiny", _NoSpan, 1, two_nodes)
    assert str(info.value) == (
        "the tiny rollout engine cannot run over several Ray nodes, and engine 1 spans 4 "
        "devices (bundles 0..3) on 2 nodes (node 8a51982ff101: devices 0,1; node "
        "778ffeba26a4: devices 0,1); use an engine that can (vllm, hf), or engines of "
        "one node's devices: a rollout.tensor_model_parallel_size that divides the devices "
        "per node"
    )
    cpu = [("n1", [0], []), ("n2", [1], [])]
    with pytest.raises(PluginError, match=r"\(node n1: 1 bundle\(s\) of no device ids; node n2"):
        check_spans_nodes("tiny", _NoSpan, 0, cpu)


def test_the_engine_is_told_each_node_of_its_span_and_how_to_place_a_worker_there():
    group = object.__new__(engines_module.RayEngineGroup)
    group.placement = _Nodes(2, 1)
    group.role = "rollout"
    group.env = {"A": "1"}
    span = group._engine_span(
        [("node0", [0], ["0"]), ("node1", [1], ["0"])], "CUDA_VISIBLE_DEVICES"
    )
    assert span == EngineSpan(
        nodes=(
            SpanNode(node_id="node0", bundles=(0,), devices=("0",)),
            SpanNode(node_id="node1", bundles=(1,), devices=("0",)),
        ),
        device_share=0.5,
    )
    assert span.bundles == (0, 1) and span.placement_group == "pg"
    assert span.nodes[1].actor_options == {
        "bundle": 1,
        "runtime_env": {
            "env_vars": {
                "A": "1",
                "CUDA_VISIBLE_DEVICES": "0",
                "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
            }
        },
    }


@pytest.fixture
def recorded(monkeypatch):
    """make_engine_group's placement and group arguments, with neither built."""
    from plugrl.cluster import ray_group

    calls: dict[str, dict] = {}

    class Placement:
        def __init__(self, cluster, **kwargs):
            calls["placement"] = kwargs

        def close(self):
            pass

    def group(recipe, **kwargs):
        calls["group"] = {k: v for k, v in kwargs.items() if k in ("span", "owns_placement")}
        return "group"

    monkeypatch.setattr(ray_group, "RayPlacement", Placement)
    monkeypatch.setattr(engines_module, "RayEngineGroup", group)
    return calls


@pytest.fixture(scope="module")
def plugins():
    manager = PluginManager()
    manager.load_entry_points()
    return manager


def _own_devices(plugins, tp, nnodes, per_node):
    return build_recipe(
        {
            "cluster": {"mode": "ray"},
            "rollout": {
                "colocate": False,
                "tensor_model_parallel_size": tp,
                "nnodes": nnodes,
                "n_gpus_per_node": per_node,
            },
        },
        plugins,
    )


def test_engines_of_their_own_devices_larger_than_a_node_take_bundles_of_one_device(
    plugins, recorded
):
    # two engines of 16 over four nodes of 8: 32 bundles of one device, 16 to an engine
    make_engine_group(_own_devices(plugins, 16, 4, 8), device_name="cpu", plugins=plugins)
    assert recorded["placement"]["world_size"] == 32
    assert recorded["placement"]["devices_per_bundle"] == 1
    assert recorded["group"] == {"span": 16, "owns_placement": True}
    # an engine of at most one node's devices stays one bundle of them
    make_engine_group(_own_devices(plugins, 4, 1, 8), device_name="cpu", plugins=plugins)
    assert recorded["placement"]["world_size"] == 2
    assert recorded["placement"]["devices_per_bundle"] == 4
    assert recorded["group"] == {"span": 1, "owns_placement": True}
