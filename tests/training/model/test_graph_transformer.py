"""The graph-transformer mapper: attention over each destination's edges, geometry in the edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor.attention.edge import fused_edge_attention_serves
from processor.attention.native_build import load
from processor.geometry import unit_vectors
from training.model.graph_transformer import GraphTransformerMapper
from training.model.graphs import knn_graph, local_frame


def _graph(n_src: int = 30, n_dst: int = 12, k: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.stack([torch.randperm(n_src, generator=g)[:k] for _ in range(n_dst)]).reshape(-1)
    dst = torch.arange(n_dst).repeat_interleave(k)
    return torch.stack([src, dst]), torch.randn(n_dst * k, 3, generator=g, dtype=torch.float64)


def _mapper_and_batch(batch: int):
    """A float64 mapper of 16 channels and 4 heads, its graph, and ``batch`` samples of 30 sources
    (tracking gradients) and 12 destinations."""
    torch.manual_seed(0)
    mapper = GraphTransformerMapper(16, 3, num_heads=4).double()
    x_src = torch.randn(batch, 30, 16, dtype=torch.float64, requires_grad=True)
    x_dst = torch.randn(batch, 12, 16, dtype=torch.float64)
    return mapper, *_graph(), x_src, x_dst


def test_edge_order_does_not_matter_and_gradients_reach_every_parameter():
    mapper, edge_index, edge_attr, x_src, x_dst = _mapper_and_batch(2)
    out = mapper(x_src, x_dst, edge_index, edge_attr)
    order = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(mapper(x_src, x_dst, edge_index[:, order], edge_attr[order]), out)
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mapper.parameters())


def test_each_sample_of_a_batch_is_mapped_alone():
    """The edge work runs points first, ``(points, batch, C)``: a batch of three gives each
    sample what it gives alone, and each sample's gradient is its own."""
    mapper, edge_index, edge_attr, x_src, x_dst = _mapper_and_batch(3)
    together = mapper(x_src, x_dst, edge_index, edge_attr)
    (grad,) = torch.autograd.grad(together[1].square().sum(), x_src)
    assert grad[0].abs().max() == 0 and grad[2].abs().max() == 0 and grad[1].abs().max() > 0
    for i in range(3):
        alone = mapper(x_src[i : i + 1], x_dst[i : i + 1], edge_index, edge_attr)
        torch.testing.assert_close(together[i], alone[0], rtol=1e-12, atol=1e-12)


def test_a_destination_hears_only_its_own_sources_weighted_by_a_softmax():
    """Changing a source that feeds no edge of destination 0 leaves destination 0 alone; with one
    edge per destination the softmax weight is 1, so the heads' output is that source's value."""
    torch.manual_seed(0)
    mapper = GraphTransformerMapper(8, 3, num_heads=2).double()
    edge_index = torch.tensor([[3, 5], [0, 1]])
    edge_attr = torch.zeros(2, 3, dtype=torch.float64)
    x_src = torch.randn(1, 6, 8, dtype=torch.float64)
    x_dst = torch.randn(1, 2, 8, dtype=torch.float64)
    out = mapper(x_src, x_dst, edge_index, edge_attr)
    changed = x_src.clone()
    changed[0, 5] += torch.randn(8, dtype=torch.float64)  # feeds destination 1 only (not a constant: LayerNorm)
    again = mapper(changed, x_dst, edge_index, edge_attr)
    torch.testing.assert_close(again[0, 0], out[0, 0])
    assert not torch.allclose(again[0, 1], out[0, 1])
    heads = mapper.propagate(  # points first: (points, batch, C)
        edge_index,
        query=mapper.lin_query(mapper.norm_dst(x_dst)).transpose(0, 1),
        key=mapper.lin_key(mapper.norm_src(x_src)).transpose(0, 1),
        value=mapper.lin_value(mapper.norm_src(x_src)).transpose(0, 1),
        edge=mapper.lin_edge(edge_attr).unsqueeze(1),
        size=(6, 2),
    )
    expected = mapper.lin_value(mapper.norm_src(x_src))[0, [3, 5]] + mapper.lin_edge(edge_attr)
    torch.testing.assert_close(heads[:, 0], expected)


def test_local_frame_features_point_east_and_north():
    lat, lon = np.array([0.0, 0.0, 10.0, 45.0]), np.array([0.0, 5.0, 0.0, 100.0])
    xyz = unit_vectors(lat, lon)
    edge_index, attr = knn_graph(xyz[1:3], xyz[:1], k=2, features="local_frame")
    east_src = np.flatnonzero(edge_index[0] == 0)[0]  # (0, 5): due east of (0, 0)
    north_src = np.flatnonzero(edge_index[0] == 1)[0]  # (10, 0): due north
    assert attr[east_src, 1] > 0 and abs(attr[east_src, 2]) < 1e-6
    assert attr[north_src, 2] > 0 and abs(attr[north_src, 1]) < 1e-6
    east, north = local_frame(xyz[3:])
    dots = [(east * xyz[3:]).sum(), (north * xyz[3:]).sum(), (east * north).sum()]
    np.testing.assert_allclose(dots, 0, atol=1e-12)  # both tangent, and at right angles


def test_a_grid_of_fewer_points_than_neighbours_feeds_every_point_from_all_of_them():
    """Three stations and the encoder's 4 neighbours: each destination takes the 3 there are."""
    xyz = unit_vectors(np.array([40.0, 41.0, 42.5]), np.array([-4.0, -3.0, 0.5]))
    edge_index, attr = knn_graph(xyz, xyz, k=4)
    assert edge_index.shape == (2, 9) and attr.shape == (9, 4)
    for dst in range(3):
        assert sorted(edge_index[0][edge_index[1] == dst]) == [0, 1, 2]


@pytest.mark.skipif(load("native") is None, reason="the fused CPU kernel is not built")
def test_the_fused_edge_attention_gives_torch_geometrics_numbers():
    """In float32 on the CPU the mapper's edge attention runs in the fused kernel; its output and
    every gradient (inputs and parameters) equal torch_geometric's message passing."""
    mapper, edge_index, edge_attr, x_src, x_dst = _mapper_and_batch(2)
    mapper = mapper.float()
    inputs = [x_src.detach().float().requires_grad_(), x_dst.float().requires_grad_()]
    assert fused_edge_attention_serves(*inputs)  # fused_edges=True takes the kernel
    results = []
    for fused in (True, False):
        mapper.fused_edges = fused
        mapper.zero_grad()
        out = mapper(*inputs, edge_index, edge_attr.float())
        grads = torch.autograd.grad(out.square().sum(), [*inputs, *mapper.parameters()])
        results.append((out, grads))
    (fused_out, fused_grads), (pyg_out, pyg_grads) = results
    torch.testing.assert_close(fused_out, pyg_out, rtol=1e-5, atol=1e-5)
    scale = max(float(g.abs().max()) for g in pyg_grads)  # the key's bias has none: a softmax ignores it
    for got, want in zip(fused_grads, pyg_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
