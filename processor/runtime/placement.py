"""Which ranks form each model-parallel group, given the node every rank runs on.

A model group's collectives run every layer (all-to-alls, halos); a data-parallel group's
once per step (the gradient all-reduce). On a cluster the links inside a node (NVLink, shared
memory) are several times faster than those between nodes, so by default a model group is
kept inside one node:

- ``within_nodes`` (default): ranks are taken node by node, and each model group is the next
  ``ranks_per_model`` of them. A group stays inside one node when ``ranks_per_model`` divides
  every node's rank count; a larger group spans as few nodes as it can.
- ``across_nodes``: a model group takes one rank from each node in turn, so the data-parallel
  groups stay inside nodes instead (for models whose gradients outweigh their activations'
  traffic, e.g. ``shard_sequence`` with a narrow window and a large MLP).

Under torchrun a node is an agent (``GROUP_RANK``); under one launcher every rank is on one node.
"""

from __future__ import annotations

import os
import socket

PLACEMENTS = ("within_nodes", "across_nodes")


def this_node() -> str:
    """A name of this process's node: ``node <GROUP_RANK> (<host>)`` under torchrun, else the host."""
    host = socket.gethostname()
    group_rank = os.environ.get("GROUP_RANK")
    return f"node {group_rank} ({host})" if group_rank is not None else host


def gather_nodes() -> list[str]:
    """The node of every rank of the default group (:func:`this_node`; one ``all_gather_object``,
    every rank calls)."""
    import torch.distributed as dist

    nodes: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(nodes, this_node())
    return nodes


def nodes_in_order(nodes: list[str]) -> dict[str, list[int]]:
    """``{node: its world ranks}``, nodes in the order of their lowest rank."""
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    return by_node


def model_groups(nodes: list[str], ranks_per_model: int, placement: str = "within_nodes") -> list[list[int]]:
    """The world ranks of each model replica, each list ascending (its order is the group's rank
    order, which decides the shard each rank holds). ``nodes[r]`` is rank ``r``'s node."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement = {placement!r} is not one of {list(PLACEMENTS)}")
    world = len(nodes)
    if ranks_per_model < 1 or world % ranks_per_model:
        raise ValueError(f"ranks_per_model = {ranks_per_model} does not divide the world size {world}")
    ordered = [r for ranks in nodes_in_order(nodes).values() for r in ranks]
    replicas = world // ranks_per_model
    if placement == "within_nodes":
        groups = [ordered[d * ranks_per_model : (d + 1) * ranks_per_model] for d in range(replicas)]
    else:
        groups = [ordered[d::replicas] for d in range(replicas)]
    return [sorted(g) for g in groups]


def nodes_spanned(nodes: list[str], group: list[int]) -> int:
    return len({nodes[r] for r in group})


def describe_layout(nodes: list[str], groups: list[list[int]], placement: str) -> str:
    """One line for the log: ranks, nodes, model groups and how many nodes the widest spans."""
    by_node = nodes_in_order(nodes)
    widest = max(nodes_spanned(nodes, g) for g in groups)
    fewest = -(-len(groups[0]) // max(len(r) for r in by_node.values()))  # ceil: the least it could span
    where = "each inside one node" if widest == 1 else f"spanning up to {widest} nodes"
    line = (
        f"{len(nodes)} ranks on {len(by_node)} node(s) ({', '.join(f'{n}: {len(r)}' for n, r in by_node.items())}); "
        f"{len(groups)} model replica(s) of {len(groups[0])} ranks ({placement}): {groups}, {where}"
    )
    if placement == "within_nodes" and widest > fewest:
        line += f" (ranks_per_model = {len(groups[0])} does not divide the ranks per node: could be {fewest})"
    return line
