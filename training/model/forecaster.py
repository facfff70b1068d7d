"""Encoder–processor–decoder forecaster: data grid -> hidden grid -> data grid.

Only the processor is model-parallel in the sense of attention, but every part runs on this
rank's blocks: each rank encodes into its own hidden points (data rows of its neighbours
arrive by halo), runs the sharded processor, and decodes its own data points (hidden rows
arrive by halo). Every exchange is :func:`processor.distributed.halo_pad`, so gradients
through the shard boundaries are exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from processor import TransformerProcessor
from processor.distributed import (
    GroupLike,
    HaloConfig,
    ShardLayout,
    Transport,
    halo_pad,
    process_group_of,
    shard_offsets,
    shard_sizes,
)
from processor.geometry import unit_vectors
from processor.grids import Grid
from processor.matmul import Linear
from training.data.batches import Batches
from training.data.samples import Sample
from training.model.field_forecast import FieldForecast
from training.model.graph_transformer import GraphTransformerMapper
from training.model.graphs import EDGE_FEATURES, LocalGraph, knn_graph, node_features, shard_graph
from training.model.hidden_grid import HiddenGrid
from training.model.linear_baseline import LinearBaseline
from training.model.mapper import GraphMapper
from training.model.node_parameters import NodeParameters

# The encoder's and decoder's kinds, and the edge features each reads.
MAPPERS = {"graph_transformer": "local_frame", "mean_mlp": "chord"}


@dataclass(frozen=True)
class ShardedGrids:
    """This rank's blocks of the data grid and the hidden grid, and its graph slices."""

    data_layout: ShardLayout
    hidden_layout: ShardLayout
    encoder: LocalGraph
    decoder: LocalGraph
    data_features: Tensor  # (local data points, 4)
    hidden_features: Tensor  # (local hidden points, 4)
    mapper: str = "graph_transformer"  # the mapper kind whose edge features the graphs carry

    @classmethod
    def build(
        cls,
        data_lat: np.ndarray,
        data_lon: np.ndarray,
        hidden: HiddenGrid | Grid,
        ranks: int,
        rank: int,
        encoder_k: int,
        decoder_k: int,
        mapper: str = "graph_transformer",
    ) -> ShardedGrids:
        """This rank's part; ``mapper`` (:data:`MAPPERS`) decides the edges' features."""
        data_xyz = unit_vectors(data_lat, data_lon)
        hidden_xyz = unit_vectors(hidden.latitudes, hidden.longitudes)
        data_sizes, hidden_sizes = shard_sizes(len(data_xyz), ranks), shard_sizes(len(hidden_xyz), ranks)
        features = MAPPERS[mapper]
        enc = shard_graph(*knn_graph(data_xyz, hidden_xyz, encoder_k, features), data_sizes, hidden_sizes, rank)
        dec = shard_graph(*knn_graph(hidden_xyz, data_xyz, decoder_k, features), hidden_sizes, data_sizes, rank)
        d0, h0 = shard_offsets(data_sizes)[rank], shard_offsets(hidden_sizes)[rank]
        data_f = node_features(data_lat, data_lon)[d0 : d0 + data_sizes[rank]]
        hidden_f = node_features(hidden.latitudes, hidden.longitudes)[h0 : h0 + hidden_sizes[rank]]
        return cls(
            ShardLayout(tuple(data_sizes), rank),
            ShardLayout(tuple(hidden_sizes), rank),
            enc,
            dec,
            torch.from_numpy(data_f),
            torch.from_numpy(hidden_f),
            mapper,
        )

    def to(self, device: torch.device | str) -> ShardedGrids:
        """These grids with their graphs and node features on ``device``."""
        return dataclasses.replace(
            self,
            encoder=self.encoder.to(device),
            decoder=self.decoder.to(device),
            data_features=self.data_features.to(device),
            hidden_features=self.hidden_features.to(device),
        )


def make_mapper(kind: str, channels: int, num_heads: int) -> nn.Module:
    """An encoder or decoder of ``kind`` (:data:`MAPPERS`)."""
    edge_dim = EDGE_FEATURES[MAPPERS[kind]]
    if kind == "graph_transformer":
        return GraphTransformerMapper(channels, edge_dim, num_heads)
    return GraphMapper(channels, edge_dim)


class Forecaster(nn.Module):
    """Predicts the next state from the current one (and ``multistep - 1`` before it): ``(b, data
    points, multistep x num_variables + forcings)`` -> ``(b, data points, num_variables +
    diagnostics)``.

    The input's first ``multistep`` blocks of ``num_variables`` channels are the prognostic
    states, oldest first; the output's first ``num_variables`` are the next state, predicted as
    an increment of the latest input's. ``forcings`` more input channels are given and never
    predicted, ``diagnostics`` more outputs are predicted outright and never given.
    ``mapper``: the encoder's and decoder's kind (:data:`MAPPERS`), ``mapper_heads`` the graph
    transformer's heads. ``normalise_increments``: the head predicts the increment in units of
    its own statistics (:meth:`set_increment_statistics`), not the field's. ``node_parameters``:
    ``(data points, hidden points, size)``, learned features of each point of both grids beside
    its coordinates (anemoi's ``trainable_size``), zero at first; each rank keeps its blocks
    after :meth:`split_node_parameters`. ``baseline_inputs``: each step is learned over a linear
    baseline (:meth:`set_linear_baseline`), whose forecast the network is also given as inputs:
    undoing it where it is wrong is then a linear map of what the network sees, not a per-point
    one. ``field_input``: it is given the whole-field forecast too (:meth:`set_field_forecast`)."""

    def __init__(
        self,
        num_variables: int,
        num_channels: int,
        processor: TransformerProcessor,
        mapper: str = "graph_transformer",
        mapper_heads: int = 4,
        forcings: int = 0,
        diagnostics: int = 0,
        multistep: int = 1,
        node_parameters: tuple[int, int, int] = (0, 0, 0),
        normalise_increments: bool = False,
        baseline_inputs: bool = False,
        field_input: bool = False,
    ) -> None:
        super().__init__()
        self.mapper = mapper
        self.num_prognostic = num_variables
        self.multistep = multistep
        data_points, hidden_points, size = node_parameters
        # None without any: a model of trainable_size 0 has the parameters (and checkpoints) it had before
        self.data_nodes = NodeParameters(data_points, size) if size else None
        self.hidden_nodes = NodeParameters(hidden_points, size) if size else None
        self.baseline_inputs = (num_variables + diagnostics) * (int(baseline_inputs) + int(field_input))
        self.field_input = field_input
        inputs = num_variables * multistep + forcings + self.baseline_inputs
        self.data_embed = Linear(inputs + 4 + size, num_channels)
        self.hidden_embed = Linear(4 + size, num_channels)
        self.encoder = make_mapper(mapper, num_channels, mapper_heads)
        self.processor = processor
        self.decoder = make_mapper(mapper, num_channels, mapper_heads)
        self.head = nn.Sequential(nn.LayerNorm(num_channels), Linear(num_channels, num_variables + diagnostics))
        if normalise_increments:  # buffers: checkpoints keep the statistics a model was trained with
            self.register_buffer("increment_mean", torch.zeros(num_variables))
            self.register_buffer("increment_stdev", torch.ones(num_variables))
        self.linear_baseline: LinearBaseline | None = None  # model.baseline=linear_regression: set_linear_baseline
        self.field_forecast: FieldForecast | None = None  # model.field_input: set_field_forecast

    @torch.no_grad()
    def set_increment_statistics(self, mean: np.ndarray, stdev: np.ndarray) -> None:
        """The increment's statistics ``(num_variables,)`` (normalised units,
        :func:`training.data.tendencies.tendency_statistics`): the head's prognostic outputs are
        the increment in units of ``stdev``, less ``mean``."""
        self.increment_mean.copy_(torch.as_tensor(mean))
        self.increment_stdev.copy_(torch.as_tensor(stdev))

    def set_linear_baseline(self, baseline: LinearBaseline) -> None:
        """Learn each step as what ``baseline`` (this rank's points, fitted on the training dates)
        leaves, rather than as an increment over the latest state."""
        self.linear_baseline = baseline.to_device(self.head[1].weight.device)

    def set_field_forecast(self, field: FieldForecast) -> None:
        """Give each step ``field``'s forecast too (every point on this rank, fitted on the training dates)."""
        self.field_forecast = field.to_device(self.head[1].weight.device)

    def out_of_fold(self, samples: Sequence[Sample], given: Tensor | None = None) -> AbstractContextManager[None]:
        """Within: a training step on ``samples`` (their inputs ``given``), whose field forecast is
        each sample's out-of-fold one (:meth:`FieldForecast.out_of_fold`)."""
        return nullcontext() if self.field_forecast is None else self.field_forecast.out_of_fold(samples, given)

    def remember_field_forecasts(self, batches: Batches, samples: list[Sample]) -> None:
        """Keep the field forecast of the training ``samples``' inputs (:meth:`FieldForecast.remember`)."""
        if self.field_forecast is not None:
            self.field_forecast.remember(batches, samples)

    def forward(
        self, x: Tensor, grids: ShardedGrids, group: GroupLike, *, transport: Transport | None = None
    ) -> Tensor:
        """``x``: this rank's data points ``(b, local data points, inputs)``, normalised.
        ``group``: the model-parallel group, or what ``processor.build_groups`` made of it.
        ``transport``: what sends the halos' and the processor's bytes (e.g. counted)."""
        if grids.mapper != self.mapper:
            raise ValueError(
                f"the grids' graphs carry the edge features of mapper {grids.mapper!r}, this forecaster's "
                f"is {self.mapper!r}: build them with ShardedGrids.build(..., mapper={self.mapper!r})"
            )
        b, model_group, group = x.shape[0], group, process_group_of(group)
        transport = transport or Transport()
        data_nodes = _with_nodes(grids.data_features, self.data_nodes, grids.data_layout)
        hidden_nodes = _with_nodes(grids.hidden_features, self.hidden_nodes, grids.hidden_layout)
        base = self._baseline(x)  # (b, local points, outputs), or None
        given = x if base is None else torch.cat([x, base.to(x.dtype), *self._field(x)], dim=-1)
        data = self.data_embed(torch.cat([given, data_nodes.expand(b, -1, -1)], dim=-1))
        hidden = self.hidden_embed(hidden_nodes).expand(b, -1, -1)
        src = _with_halo(data, grids.encoder.halo, grids.data_layout, group, transport)
        hidden = self.encoder(src, hidden, grids.encoder.edge_index, grids.encoder.edge_attr, grids.encoder.lists)
        # The hidden split is known here: passing it keeps the ranks agreeing once per layout.
        hidden = self.processor(hidden, group=model_group, shard_sizes=grids.hidden_layout.sizes, transport=transport)
        src = _with_halo(hidden, grids.decoder.halo, grids.hidden_layout, group, transport)
        data = self.decoder(src, data, grids.decoder.edge_index, grids.decoder.edge_attr, grids.decoder.lists)
        out = self.head(data)
        n, latest = self.num_prognostic, (self.multistep - 1) * self.num_prognostic
        increment = out[..., :n]
        if hasattr(self, "increment_stdev"):
            increment = increment * self.increment_stdev.to(out.dtype) + self.increment_mean.to(out.dtype)
        if base is not None:
            return torch.cat([base[..., :n] + increment, base[..., n:] + out[..., n:]], dim=-1)
        if out.shape[-1] == n == x.shape[-1]:
            return x + increment
        return torch.cat([x[..., latest : latest + n] + increment, out[..., n:]], dim=-1)

    def _baseline(self, x: Tensor) -> Tensor | None:
        """The linear baseline's forecast of ``x``'s next step, None without one."""
        if self.linear_baseline is None:
            if self.baseline_inputs:
                raise RuntimeError("this forecaster learns over a linear baseline: call set_linear_baseline first")
            return None
        return self.linear_baseline(x)

    def _field(self, x: Tensor) -> list[Tensor]:
        """The field forecast of ``x``'s next step as the network's input, none without one."""
        if not self.field_input:
            return []
        if self.field_forecast is None:
            raise RuntimeError("this forecaster is given a field forecast: call set_field_forecast first")
        return [self.field_forecast(x).to(x.dtype)]

    def split_node_parameters(self, grids: ShardedGrids) -> None:
        """Keep this rank's blocks of the node parameters (of ``grids``' layouts)."""
        for nodes, layout in ((self.data_nodes, grids.data_layout), (self.hidden_nodes, grids.hidden_layout)):
            if nodes is not None:
                nodes.split(layout)


def _with_nodes(features: Tensor, nodes: NodeParameters | None, layout: ShardLayout) -> Tensor:
    """``(local points, 4 [+ size])``: the coordinate features, and the node parameters if any."""
    return features if nodes is None else nodes(features, layout)


def _with_halo(
    x: Tensor, width: int, layout: ShardLayout, group: dist.ProcessGroup | None, transport: Transport
) -> Tensor:
    if group is None or layout.world_size == 1:
        return x
    return halo_pad(x, HaloConfig(width=width, dim=1), layout, group, transport)
