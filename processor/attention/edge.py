"""Edge attention on a bipartite graph, fused for the CPU: each destination attends over its
incoming edges (a graph transformer mapper's message passing), forward and backward in the C++
kernel ``csrc/edge_attention.cpp``, built into the band-attention module
(:mod:`.native_build`).

Per head ``h`` and edge ``e = (j -> i)``: ``s_e = scale * q_i . (k_j + edge_e)``, ``p`` the
softmax of ``s`` over ``i``'s edges, ``out_i = sum_e p_e (v_j + edge_e)``; the edge features
are shared by the batch, and a destination without edges gets 0. This is what
``torch_geometric``'s message passing computes in a dozen gathers, scatters and elementwise
passes over ``(edges, batch, channels)`` tensors; the kernel makes one pass over the edges
forward and two backward, and keeps only the output and its log-sum-exp for the backward.

Batch first: ``q`` ``(batch, n_dst, C)``, ``k`` and ``v`` ``(batch, n_src, C)``,
``edge`` ``(E, C)``, ``C = heads x head_dim``. :class:`EdgeLists` holds the graph's index lists
in the orders the kernel reads (by destination, and by source for the backward), built once per
graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from processor.attention.native import profiled
from processor.attention.native_build import load

PROFILE_NAME = "gridshard_edge_attention"  # what the profiler calls its calls


@dataclass(frozen=True)
class EdgeLists:
    """A graph's edges as the kernel reads them, from ``edge_index`` ``(2, E)`` (source row,
    destination row) in any order.

    ``order`` ``(E,)``: the edges sorted by destination (stably), as positions in
    ``edge_index``; None where they already are. ``src`` ``(E,)``, ``dst`` ``(E,)``: each sorted
    edge's source and destination; ``dst_ptr`` ``(n_dst + 1,)``: destination ``i``'s edges are
    ``dst_ptr[i]:dst_ptr[i + 1]``; ``by_src`` ``(E,)``, ``src_ptr`` ``(n_src + 1,)``: the sorted
    edges grouped by source, likewise."""

    order: Tensor | None
    src: Tensor
    dst: Tensor
    dst_ptr: Tensor
    by_src: Tensor
    src_ptr: Tensor

    @classmethod
    def from_index(cls, edge_index: Tensor, n_src: int, n_dst: int) -> EdgeLists:
        """The lists of ``edge_index`` between ``n_src`` sources and ``n_dst`` destinations."""
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must be (2, edges), got {tuple(edge_index.shape)}")
        src, dst = edge_index.to(torch.int64)
        inside = len(src) == 0 or (
            0 <= int(src.min()) and int(src.max()) < n_src and 0 <= int(dst.min()) and int(dst.max()) < n_dst
        )
        if not inside:
            raise ValueError(f"edge_index points outside {n_src} sources and {n_dst} destinations")
        order = None
        if len(dst) > 1 and bool((dst[1:] < dst[:-1]).any()):
            order = torch.sort(dst, stable=True).indices
            src, dst = src[order], dst[order]
        by_src = torch.sort(src, stable=True).indices
        return cls(
            order=order,
            src=src.contiguous(),
            dst=dst.contiguous(),
            dst_ptr=_offsets(dst, n_dst),
            by_src=by_src,
            src_ptr=_offsets(src, n_src),
        )

    def to(self, device: torch.device | str) -> EdgeLists:
        """These lists on ``device``."""
        order = None if self.order is None else self.order.to(device)
        tensors = (self.src, self.dst, self.dst_ptr, self.by_src, self.src_ptr)
        return EdgeLists(order, *(t.to(device) for t in tensors))


def _offsets(rows: Tensor, n: int) -> Tensor:
    """``(n + 1,)`` offsets of each row's run in ``rows`` sorted (or grouped) by row."""
    counts = torch.bincount(rows, minlength=n)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def fused_edge_attention_serves(*tensors: Tensor) -> bool:
    """Whether the fused kernel runs these tensors: on the CPU, float32 or narrower (it computes
    in float32), with the kernel built; else the caller's own message passing runs."""
    return all(t.device.type == "cpu" and t.dtype in _SERVED for t in tensors) and load("native") is not None


_SERVED = (torch.float32, torch.bfloat16, torch.float16)


def fused_edge_attention(q: Tensor, k: Tensor, v: Tensor, edge: Tensor, lists: EdgeLists, heads: int) -> Tensor:
    """``(batch, n_dst, C)``: each destination's attention over its edges (the module's
    docstring), ``scale = head_dim ** -0.5``; ``edge`` in ``edge_index``'s order. Computed in
    float32, returned in ``q``'s dtype; gradients to ``q``, ``k``, ``v`` and ``edge``."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[::2] != k.shape[::2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected (batch, points, C)")
    if len(lists.dst_ptr) != q.shape[1] + 1 or len(lists.src_ptr) != k.shape[1] + 1:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}: the graph's lists are for other point counts")
    if edge.shape != (len(lists.src), q.shape[2]):
        raise ValueError(f"edge {tuple(edge.shape)}: expected ({len(lists.src)}, {q.shape[2]})")
    if q.shape[2] % heads:
        raise ValueError(f"channels ({q.shape[2]}) must be divisible by heads ({heads})")
    if lists.order is not None:
        edge = edge[lists.order]
    return _EdgeAttention.apply(q, k, v, edge, lists, heads)


class _EdgeAttention(torch.autograd.Function):
    """The kernel with its own backward; saves q, k, v, edge, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, edge, lists: EdgeLists, heads: int):  # type: ignore[override]
        out, lse = torch.ops.gridshard.edge_attention(q, k, v, edge, lists.src, lists.dst_ptr, heads)
        ctx.save_for_backward(q, k, v, edge, out, lse)
        ctx.lists, ctx.heads = lists, heads
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        lists = ctx.lists
        indices = (lists.src, lists.dst_ptr, lists.dst, lists.by_src, lists.src_ptr)
        dq, dk, dv, dedge = torch.ops.gridshard.edge_attention_backward(grad, *ctx.saved_tensors, *indices, ctx.heads)
        return dq, dk, dv, dedge, None, None


# As operators torch.compile keeps whole in its graph (see native.py: the low-level library,
# for its small cost a call).
_OPERATORS = torch.library.Library("gridshard", "FRAGMENT")
_OPERATORS.define(
    "edge_attention(Tensor q, Tensor k, Tensor v, Tensor edge, Tensor src, Tensor dst_ptr, int heads) "
    "-> (Tensor, Tensor)"
)
_OPERATORS.define(
    "edge_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor edge, Tensor out, Tensor lse, "
    "Tensor src, Tensor dst_ptr, Tensor dst, Tensor by_src, Tensor src_ptr, int heads) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


def _float(t: Tensor) -> Tensor:
    return t.float().contiguous()


def _kernel():
    kernel = load("native")
    assert kernel is not None, "the native kernel (edge attention) is not built"
    return kernel


def _forward_op(q, k, v, edge, src, dst_ptr, heads):
    scale = (q.shape[2] // heads) ** -0.5
    with profiled(PROFILE_NAME):
        out, lse = _kernel().edge_forward(_float(q), _float(k), _float(v), _float(edge), src, dst_ptr, heads, scale)
    return out.to(q.dtype), lse


def _forward_shapes(q, k, v, edge, src, dst_ptr, heads):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (q.shape[1], q.shape[0], heads), dtype=torch.float32
    )


def _backward_op(grad, q, k, v, edge, out, lse, src, dst_ptr, dst, by_src, src_ptr, heads):
    scale = (q.shape[2] // heads) ** -0.5
    floats = [_float(t) for t in (grad, q, k, v, edge, out, lse)]
    with profiled(PROFILE_NAME + "_backward"):
        dq, dk, dv, dedge = _kernel().edge_backward(*floats, src, dst_ptr, dst, by_src, src_ptr, heads, scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dedge.to(edge.dtype)


def _backward_shapes(grad, q, k, v, edge, out, lse, src, dst_ptr, dst, by_src, src_ptr, heads):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v, edge))


_OPERATORS.impl("edge_attention", _forward_op, "CPU")
_OPERATORS.impl("edge_attention_backward", _backward_op, "CPU")
torch.library.register_fake("gridshard::edge_attention", _forward_shapes, lib=_OPERATORS)
torch.library.register_fake("gridshard::edge_attention_backward", _backward_shapes, lib=_OPERATORS)
