"""A graph-transformer mapper: each destination point attends over its source edges.

As anemoi-models' ``GraphTransformerForwardMapper`` / ``BackwardMapper`` blocks are built:
pre-norm of both sides; per head, the query of destination ``i`` against the keys of its
sources ``j``, each key and value the source's projection *plus a projection of the edge's
features* (its length and its direction in the destination's east/north frame), so that
where a source lies is part of what it says; a softmax over each destination's edges; the
heads' sum, plus a projection of the destination itself, projected back and added to the
destination (residual); then a pre-norm MLP with its own residual. The edge attention runs
in the fused CPU kernel (:mod:`processor.attention.edge`: one pass over the edges, no
``(edges, batch, C)`` tensors) where it is built and the tensors are on the CPU, else on
torch_geometric (``MessagePassing``, ``torch_geometric.utils.softmax``); edges may come in any
order.

A destination's edges all live on the rank that holds it (graphs are sliced by destination,
:mod:`training.model.graphs`), so the softmax and the sum never cross ranks: the mapper is
exact under any split for free, once the source rows have arrived by halo.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import softmax

from processor.attention.edge import EdgeLists, fused_edge_attention, fused_edge_attention_serves
from processor.matmul import Linear
from training.model.generated_sources import remove_generated_source_at_exit


class GraphTransformerMapper(MessagePassing):
    """``(b, n_src, C)`` sources and ``(b, n_dst, C)`` destinations -> updated destinations.

    Args:
        channels: ``C``, on both sides.
        edge_dim: features per edge.
        num_heads: attention heads (``C`` divisible by it).
        mlp_ratio: the MLP's hidden width, in multiples of ``C``.
        fused_edges: the edge attention in the fused CPU kernel where it serves (False: always
            torch_geometric's message passing; the two give the same numbers).
    """

    def __init__(
        self, channels: int, edge_dim: int, num_heads: int, mlp_ratio: float = 2.0, fused_edges: bool = True
    ) -> None:
        super().__init__(aggr="add", node_dim=0)  # points first: see forward
        remove_generated_source_at_exit(type(self))
        if channels % num_heads:
            raise ValueError(f"mapper: channels ({channels}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim = num_heads, channels // num_heads
        self.fused_edges = fused_edges
        self.norm_src, self.norm_dst = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.lin_query = Linear(channels, channels)
        self.lin_key = Linear(channels, channels)
        self.lin_value = Linear(channels, channels)
        self.lin_edge = Linear(edge_dim, channels)
        self.lin_self = Linear(channels, channels)
        self.projection = Linear(channels, channels)
        hidden = int(channels * mlp_ratio + 0.5)
        self.norm_mlp = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(Linear(channels, hidden), nn.GELU(), Linear(hidden, channels))
        self.carry_signal()

    @torch.no_grad()
    def carry_signal(self) -> None:
        """Initialise the path a source's values take (value, edge and output projections) to
        keep their size (weights of variance ``1 / fan_in``, zero biases) rather than shrink it
        by ``1/sqrt(3)`` a layer, torch's default: a destination then hears its sources from the
        first step (``python -m benchmarks.mapper_sensitivity`` measures it)."""
        for linear in (self.lin_value, self.lin_edge, self.projection):
            nn.init.normal_(linear.weight, std=linear.in_features**-0.5)
            nn.init.zeros_(linear.bias)

    def forward(
        self, x_src: Tensor, x_dst: Tensor, edge_index: Tensor, edge_attr: Tensor, lists: EdgeLists | None = None
    ) -> Tensor:
        """``edge_index`` ``(2, E)`` (source row, destination row), ``edge_attr`` ``(E, edge_dim)``,
        shared across the batch; ``lists``: the same edges as the fused kernel reads them (built
        here when None; a graph's own, :class:`training.model.graphs.LocalGraph`, are built once).
        ``(b, n_dst, C)``."""
        src, dst = self.norm_src(x_src), self.norm_dst(x_dst)
        if self.fused_edges and fused_edge_attention_serves(x_src, x_dst):
            if lists is None:
                lists = EdgeLists.from_index(edge_index, x_src.shape[-2], x_dst.shape[-2])
            query, key, value = self.lin_query(dst), self.lin_key(src), self.lin_value(src)
            heads = fused_edge_attention(query, key, value, self.lin_edge(edge_attr), lists, self.num_heads)
        else:
            heads = self._propagate(src, dst, edge_index, edge_attr)
        x = x_dst + self.projection(heads + self.lin_self(dst))
        return x + self.mlp(self.norm_mlp(x))

    def _propagate(self, src: Tensor, dst: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        """The edge attention on torch_geometric: normed ``(b, n_src, C)`` sources and ``(b,
        n_dst, C)`` destinations -> the heads' sums ``(b, n_dst, C)``.

        The edge work runs points first, ``(points, b, C)`` and ``(E, b, C)``: the scatters onto
        the destinations (``index_add_``, ``scatter_reduce_``) run 2-2.6x faster on a CPU along the
        first axis than along the second, where torch_geometric's ``node_dim=-2`` puts them
        (docs/benchmarks/training_step_xeon-amx_2026-11-27.md); with one sample the layouts are
        the same memory."""
        size = (src.shape[-2], dst.shape[-2])
        return self.propagate(
            edge_index,
            query=self.lin_query(dst).transpose(0, 1),
            key=self.lin_key(src).transpose(0, 1),
            value=self.lin_value(src).transpose(0, 1),
            edge=self.lin_edge(edge_attr).unsqueeze(1),  # (E, 1, C): the same for every sample
            size=size,
        ).transpose(0, 1)

    def message(  # type: ignore[override]
        self, query_i: Tensor, key_j: Tensor, value_j: Tensor, edge: Tensor, index: Tensor, size_i: int | None
    ) -> Tensor:
        """Per edge ``(E, b, C)``: its source's value (with the edge's) weighted per head by the
        softmax, over the destination's edges, of query . key (with the edge's)."""
        shape = (*key_j.shape[:-1], self.num_heads, self.head_dim)
        key = (key_j + edge).view(shape)
        value = (value_j + edge).view(shape)
        scores = (query_i.view(shape) * key).sum(-1) / math.sqrt(self.head_dim)  # (E, b, heads)
        weights = softmax(scores, index, num_nodes=size_i, dim=0)
        return (weights.unsqueeze(-1) * value).flatten(-2)
