"""The fused edge attention (``csrc/edge_attention.cpp``) against a float64 reference written
with scatters, forward and every gradient, on graphs with edges in any order, destinations
without edges and sources that feed none; each ISA variant built here."""

from __future__ import annotations

import pytest
import torch

from processor.attention.edge import EdgeLists, fused_edge_attention
from processor.attention.native_build import built_variants, load

pytestmark = pytest.mark.skipif(load("native") is None, reason="the fused CPU kernel is not built")
VARIANTS = built_variants() or ["native"]


def _reference(q, k, v, edge, edge_index, heads):
    """Per destination and head, the softmax over its edges of ``q . (k + edge)`` weighing
    ``v + edge``: ``(batch, n_dst, C)``; 0 for a destination without edges."""
    src, dst = edge_index
    b, n_dst, channels = q.shape
    d = channels // heads
    keys = (k[:, src] + edge).view(b, -1, heads, d)
    values = (v[:, src] + edge).view(b, -1, heads, d)
    scores = (q[:, dst].view(b, -1, heads, d) * keys).sum(-1) * d**-0.5  # (b, E, heads)
    index = dst.view(1, -1, 1).expand_as(scores)
    top = scores.new_full((b, n_dst, heads), -torch.inf).scatter_reduce(1, index, scores, "amax")
    weights = (scores - top.gather(1, index)).exp()
    weights = weights / scores.new_zeros((b, n_dst, heads)).scatter_add(1, index, weights).gather(1, index)
    out = q.new_zeros((b, n_dst, heads, d)).index_add(1, dst, weights.unsqueeze(-1) * values)
    return out.view(b, n_dst, channels)


def _case(n_src, n_dst, n_edges, batch, heads, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.stack(
        [torch.randint(0, n_src, (n_edges,), generator=g), torch.randint(0, n_dst, (n_edges,), generator=g)]
    )
    channels = heads * head_dim
    tensors = [
        torch.randn(batch, n_dst, channels, generator=g),
        torch.randn(batch, n_src, channels, generator=g),
        torch.randn(batch, n_src, channels, generator=g),
        torch.randn(n_edges, channels, generator=g),
    ]
    return edge_index, tensors, torch.randn(batch, n_dst, channels, generator=g)


CASES = [  # n_src, n_dst, edges, batch, heads, head_dim
    (30, 20, 70, 1, 4, 16),
    (50, 40, 100, 3, 2, 8),  # destinations without edges, sources feeding none
    (10, 25, 60, 2, 1, 32),
    (7, 5, 40, 1, 8, 4),  # many edges per destination
    (12, 9, 40, 2, 72, 2),  # more heads than one vector register's lanes, and than 64
]


def _assert_close(got, want):
    scale = float(want.detach().abs().max())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * max(scale, 1e-30))


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_match_a_float64_reference(case):
    *sizes, heads, head_dim = case
    edge_index, tensors, cotangent = _case(*sizes, heads, head_dim, seed=sum(case))
    lists = EdgeLists.from_index(edge_index, sizes[0], sizes[1])
    assert lists.order is not None  # random edges: the kernel's order is not the caller's
    inputs = [t.clone().requires_grad_() for t in tensors]
    out = fused_edge_attention(*inputs, lists, heads)
    grads = torch.autograd.grad(out, inputs, cotangent)
    exact = [t.double().requires_grad_() for t in tensors]
    want = _reference(*exact, edge_index, heads)
    want_grads = torch.autograd.grad(want, exact, cotangent.double())
    _assert_close(out, want)
    for got, expected in zip(grads, want_grads):
        _assert_close(got, expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_computes_the_same(variant):
    """Each ISA build's forward and backward against the reference, called directly."""
    kernel = load(variant)
    edge_index, tensors, cotangent = _case(40, 30, 120, 2, 4, 16, seed=7)
    lists = EdgeLists.from_index(edge_index, 40, 30)
    q, k, v, edge = tensors
    sorted_edge = edge[lists.order]
    out, lse = kernel.edge_forward(q, k, v, sorted_edge, lists.src, lists.dst_ptr, 4, 0.25)
    indices = (lists.src, lists.dst_ptr, lists.dst, lists.by_src, lists.src_ptr)
    dq, dk, dv, dedge = kernel.edge_backward(cotangent, q, k, v, sorted_edge, out, lse, *indices, 4, 0.25)
    exact = [t.double().requires_grad_() for t in tensors]
    want = _reference(*exact, edge_index, 4)
    want_grads = torch.autograd.grad(want, exact, cotangent.double())
    _assert_close(out, want)
    dedge_in_callers_order = torch.empty_like(dedge).index_copy_(0, lists.order, dedge)
    for got, expected in zip((dq, dk, dv, dedge_in_callers_order), want_grads):
        _assert_close(got, expected)


def test_a_destination_without_edges_gets_zero_and_no_gradient():
    edge_index = torch.tensor([[0, 1, 2], [0, 0, 2]])  # destination 1 has no edge
    q, k, v = (torch.randn(1, 3, 8, requires_grad=True) for _ in range(3))
    edge = torch.randn(3, 8, requires_grad=True)
    out = fused_edge_attention(q, k, v, edge, EdgeLists.from_index(edge_index, 3, 3), 2)
    assert out[0, 1].abs().max() == 0 and out[0, 0].abs().max() > 0
    out.sum().backward()
    assert q.grad[0, 1].abs().max() == 0 and q.grad[0, 0].abs().max() > 0


def test_the_lists_hold_each_destinations_and_each_sources_edges():
    edge_index = torch.tensor([[2, 0, 1, 2, 0], [1, 0, 1, 0, 2]])
    lists = EdgeLists.from_index(edge_index, 4, 3)
    assert lists.order.tolist() == [1, 3, 0, 2, 4]  # by destination, stable
    assert lists.dst.tolist() == [0, 0, 1, 1, 2] and lists.src.tolist() == [0, 2, 2, 1, 0]
    assert lists.dst_ptr.tolist() == [0, 2, 4, 5] and lists.src_ptr.tolist() == [0, 2, 3, 5, 5]
    assert sorted(lists.src[lists.by_src].tolist()) == lists.src[lists.by_src].tolist()
    assert EdgeLists.from_index(edge_index[:, lists.order], 4, 3).order is None  # sorted already


def test_bad_input_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="outside 3 sources"):
        EdgeLists.from_index(torch.tensor([[3], [0]]), 3, 2)
    lists = EdgeLists.from_index(torch.tensor([[0, 1], [0, 1]]), 2, 2)
    q, k = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="divisible by heads"):
        fused_edge_attention(q, k, k, torch.randn(2, 8), lists, 3)
    with pytest.raises(ValueError, match="edge"):
        fused_edge_attention(q, k, k, torch.randn(3, 8), lists, 2)
    with pytest.raises(ValueError, match="other point counts"):
        fused_edge_attention(torch.randn(1, 3, 8), k, k, torch.randn(2, 8), lists, 2)


def test_the_operators_shapes_are_known_to_torch_compile():
    """The forward and backward operators pass torch's operator checks (schema, fake tensors,
    ``torch.compile``'s tracing)."""
    edge_index, tensors, cotangent = _case(12, 9, 30, 2, 2, 8, seed=3)
    lists = EdgeLists.from_index(edge_index, 12, 9)
    q, k, v, edge = tensors
    edge = edge[lists.order]
    torch.library.opcheck(torch.ops.gridshard.edge_attention.default, (q, k, v, edge, lists.src, lists.dst_ptr, 2))
    out, lse = torch.ops.gridshard.edge_attention(q, k, v, edge, lists.src, lists.dst_ptr, 2)
    indices = (lists.src, lists.dst_ptr, lists.dst, lists.by_src, lists.src_ptr)
    torch.library.opcheck(
        torch.ops.gridshard.edge_attention_backward.default, (cotangent, q, k, v, edge, out, lse, *indices, 2)
    )
