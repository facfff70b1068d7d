"""Bipartite k-nearest-neighbour graphs between two grids, and each rank's slice of them.

Every rank builds the same global graph (deterministic from the coordinates), then keeps
the edges whose *destination* is in its block. Their sources may lie in other ranks'
blocks: those rows come in by one :func:`processor.distributed.halo_pad` of width
``halo`` (the same on every rank), and ``src`` indexes the padded block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial import cKDTree

from processor.attention.edge import EdgeLists
from processor.distributed import ShardLayout, halo_extent, shard_offsets


def node_features(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """``(points, 4)``: sin/cos of latitude and longitude."""
    lat, lon = np.radians(lat_deg), np.radians(lon_deg)
    return np.stack([np.sin(lat), np.cos(lat), np.sin(lon), np.cos(lon)], axis=1).astype(np.float32)


EDGE_FEATURES = {"chord": 4, "local_frame": 3}  # features per edge of each kind


def knn_graph(
    src_xyz: np.ndarray, dst_xyz: np.ndarray, k: int, features: str = "chord"
) -> tuple[np.ndarray, np.ndarray]:
    """Edges from the ``k`` nearest source points into every destination point (from all of
    them where the source grid has fewer than ``k``: a point set of a few stations).

    Returns ``edge_index`` ``(2, dst * min(k, src))`` (source, destination; grouped by destination) and
    ``edge_attr`` ``(dst * min(k, src), EDGE_FEATURES[features])``: ``chord``, the source minus the
    destination position and the chord length; ``local_frame``, the chord length and its
    eastward and northward components in the destination's local frame, in units of the
    graph's median edge length (so of order one on any grid).
    """
    k = min(k, len(src_xyz))
    _, src = cKDTree(src_xyz).query(dst_xyz, k=k)
    src = np.asarray(src).reshape(len(dst_xyz), k)
    dst = np.repeat(np.arange(len(dst_xyz)), k)
    src = src.reshape(-1)
    delta = src_xyz[src] - dst_xyz[dst]
    length = np.linalg.norm(delta, axis=1, keepdims=True)
    if features == "chord":
        attr = np.concatenate([delta, length], axis=1)
    elif features == "local_frame":
        east, north = local_frame(dst_xyz[dst])
        along = np.stack([(delta * east).sum(1), (delta * north).sum(1)], axis=1)
        attr = np.concatenate([length, along], axis=1) / max(float(np.median(length)), 1e-12)
    else:
        raise ValueError(f"edge features {features!r}: choose one of {sorted(EDGE_FEATURES)}")
    return np.stack([src, dst]), attr.astype(np.float32)


def local_frame(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit east and north vectors ``(points, 3)`` at positions ``xyz`` on the unit sphere
    (at a pole, east is taken along longitude 0's normal)."""
    lon = np.arctan2(xyz[:, 1], xyz[:, 0])
    lat = np.arcsin(np.clip(xyz[:, 2], -1.0, 1.0))
    east = np.stack([-np.sin(lon), np.cos(lon), np.zeros_like(lon)], axis=1)
    north = np.stack([-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)], axis=1)
    return east, north


@dataclass(frozen=True)
class LocalGraph:
    """This rank's edges: ``src`` into the halo-padded source block, ``dst`` into its own block."""

    edge_index: torch.Tensor  # (2, local edges)
    edge_attr: torch.Tensor  # (local edges, 4)
    halo: int  # rows of source halo each side (same on every rank)
    lists: EdgeLists  # the edges as the fused edge-attention kernel reads them

    def to(self, device: torch.device | str) -> LocalGraph:
        """This graph with its edges on ``device``."""
        return LocalGraph(self.edge_index.to(device), self.edge_attr.to(device), self.halo, self.lists.to(device))


def shard_graph(
    edge_index: np.ndarray, edge_attr: np.ndarray, src_sizes: list[int], dst_sizes: list[int], rank: int
) -> LocalGraph:
    """Slice a global graph for ``rank``, given how sources and destinations are split."""
    src_starts, dst_starts = shard_offsets(src_sizes), shard_offsets(dst_sizes)
    n_src = sum(src_sizes)
    halo = 0
    for r in range(len(dst_sizes)):  # widest reach of any rank, so that every rank agrees
        keep = (edge_index[1] >= dst_starts[r]) & (edge_index[1] < dst_starts[r] + dst_sizes[r])
        if keep.any():
            lo, hi = edge_index[0, keep].min(), edge_index[0, keep].max() + 1
            halo = max(halo, src_starts[r] - lo, hi - src_starts[r] - src_sizes[r])
    left, right = halo_extent(ShardLayout(tuple(src_sizes), rank), min(halo, n_src))
    keep = (edge_index[1] >= dst_starts[rank]) & (edge_index[1] < dst_starts[rank] + dst_sizes[rank])
    src = edge_index[0, keep] - (src_starts[rank] - left)
    dst = edge_index[1, keep] - dst_starts[rank]
    local_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
    return LocalGraph(
        edge_index=local_index,
        edge_attr=torch.from_numpy(edge_attr[keep]),
        halo=int(halo),
        lists=EdgeLists.from_index(local_index, left + src_sizes[rank] + right, dst_sizes[rank]),
    )
