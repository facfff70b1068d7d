"""Model groups inside nodes (or across them), and lost ranks named by their node."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from processor.runtime import Heartbeat
from processor.runtime.placement import describe_layout, model_groups, nodes_spanned

TWO_BY_TWO = ["node 0 (a)", "node 0 (a)", "node 1 (b)", "node 1 (b)"]


@pytest.mark.parametrize(
    "nodes,mp,placement,groups",
    [
        (TWO_BY_TWO, 2, "within_nodes", [[0, 1], [2, 3]]),
        (TWO_BY_TWO, 2, "across_nodes", [[0, 2], [1, 3]]),
        (TWO_BY_TWO, 4, "within_nodes", [[0, 1, 2, 3]]),
        (TWO_BY_TWO, 1, "across_nodes", [[0], [1], [2], [3]]),
        (["a"] * 4 + ["b"] * 4, 2, "across_nodes", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        (["a"] * 3 + ["b"] * 3, 2, "within_nodes", [[0, 1], [2, 3], [4, 5]]),  # 2 does not divide 3
        (["a", "b", "a", "b"], 2, "within_nodes", [[0, 2], [1, 3]]),  # ranks interleaved over nodes
    ],
)
def test_model_groups_follow_the_nodes(nodes, mp, placement, groups):
    assert model_groups(nodes, mp, placement) == groups
    assert sorted(r for g in groups for r in g) == list(range(len(nodes)))


def test_within_nodes_keeps_each_group_in_one_node_when_it_divides():
    nodes = [f"node {r // 4}" for r in range(16)]
    for mp in (1, 2, 4):
        assert all(nodes_spanned(nodes, g) == 1 for g in model_groups(nodes, mp, "within_nodes"))
        assert all(nodes_spanned(nodes, g) == min(mp, 4) for g in model_groups(nodes, mp, "across_nodes"))
    assert all(nodes_spanned(nodes, g) == 2 for g in model_groups(nodes, 8, "within_nodes"))


def test_the_layout_line_says_where_groups_could_do_better():
    nodes = ["a"] * 3 + ["b"] * 3
    line = describe_layout(nodes, model_groups(nodes, 2, "within_nodes"), "within_nodes")
    assert "6 ranks on 2 node(s) (a: 3, b: 3)" in line and "spanning up to 2 nodes" in line
    assert "does not divide the ranks per node" in line
    line = describe_layout(TWO_BY_TWO, model_groups(TWO_BY_TWO, 2, "within_nodes"), "within_nodes")
    assert "each inside one node" in line and "does not divide" not in line


@pytest.mark.parametrize("mp,placement", [(3, "within_nodes"), (2, "diagonal")])
def test_impossible_layouts_are_refused(mp, placement):
    with pytest.raises(ValueError, match="ranks_per_model = 3 does not divide|placement = 'diagonal'"):
        model_groups(TWO_BY_TWO, mp, placement)


@pytest.mark.parametrize(
    "nodes,lost,message",
    [
        (TWO_BY_TWO, [2, 3], "node 1 (b) (ranks [2, 3]) was lost"),
        (TWO_BY_TWO, [3], "rank 3 of node 1 (b) was lost"),
        (TWO_BY_TWO, [1, 2, 3], "node 1 (b) (ranks [2, 3]) and rank 1 of node 0 (a) were lost"),
        (["a"] * 4, [1, 2], "ranks [1, 2] were lost"),  # one node: no node to name
        (None, [1], "rank 1 was lost"),
    ],
)
def test_lost_ranks_are_named_by_node(nodes, lost, message):
    store = dist.HashStore()
    heartbeat = Heartbeat(store, 0, 4, interval_s=0.01, nodes=nodes)
    for r in set(range(1, 4)) - set(lost):  # the others left, having failed in the collective too
        store.set(f"gridshard/left/{r}", "a collective failed")
    assert heartbeat.explain() == f"{message} (no heartbeat for 0.03 s)"
