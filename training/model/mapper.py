"""Graph message passing from one grid to another (encoder and decoder), with torch_geometric."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

from processor.attention.edge import EdgeLists
from processor.matmul import Linear
from training.model.generated_sources import remove_generated_source_at_exit


def mlp(c_in: int, c_hidden: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(Linear(c_in, c_hidden), nn.SiLU(), Linear(c_hidden, c_out), nn.LayerNorm(c_out))


class GraphMapper(MessagePassing):
    """Update destination nodes from their source neighbours on a bipartite graph.

    ``x_dst + node_mlp([x_dst, mean_j edge_mlp([x_src_j, x_dst, e_j])])``; features
    ``(batch, nodes, channels)`` share one ``edge_index`` across the batch.
    """

    def __init__(self, channels: int, edge_channels: int) -> None:
        super().__init__(aggr="mean", node_dim=-2)
        remove_generated_source_at_exit(type(self))
        self.edge_mlp = mlp(2 * channels + edge_channels, channels, channels)
        self.node_mlp = mlp(2 * channels, channels, channels)

    def forward(
        self, x_src: Tensor, x_dst: Tensor, edge_index: Tensor, edge_attr: Tensor, lists: EdgeLists | None = None
    ) -> Tensor:
        """``x_src`` ``(b, n_src, c)``, ``x_dst`` ``(b, n_dst, c)`` -> ``(b, n_dst, c)``. ``lists``
        (the graph's edges as the fused edge attention reads them) is taken for the mappers' one
        signature and not needed here."""
        size = (x_src.shape[-2], x_dst.shape[-2])
        agg = self.propagate(edge_index, x=(x_src, x_dst), edge_attr=edge_attr, size=size)
        return x_dst + self.node_mlp(torch.cat([x_dst, agg], dim=-1))

    def message(self, x_j: Tensor, x_i: Tensor, edge_attr: Tensor) -> Tensor:
        attr = edge_attr.expand(*x_j.shape[:-1], edge_attr.shape[-1])
        return self.edge_mlp(torch.cat([x_j, x_i, attr], dim=-1))
