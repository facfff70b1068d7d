"""q, k and v of the attention's packed projection, q and k normed per head, in one pass of the
fused CPU kernel (``csrc/head_norm.cpp``) forward and backward.

torch's path takes q and k out of the packed ``(b, n, 3, heads, head_dim)`` projection by a copy
each, norms them with ``layer_norm`` (a row of ``head_dim`` values costs it more than the
arithmetic), and in backward stacks dq, dk and dv back by a ``cat`` and a copy. Here one pass
writes q and k, normed, each point-major ``(b, n, heads, head_dim)``, so that attention's output
is laid out so too and merging the heads is a view; v stays a view of the projection, and one
pass writes the projection's gradient. Used where the kernel is built, for float32 on the CPU
without autocast or ``torch.compile`` (which fuses torch's path itself), and only with the norms
(without them q, k and v are views of the projection on torch's path, which is then the faster).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from processor.attention.native import native_kernel, profiled

# "layer_norm", and not "attention", in the name: the step's profile counts it with the norms
# (training/reporting/step_split.py kind_of)
PROFILE_RANGE = "gridshard_qk_layer_norm"


def fused_qk_heads_serve(qkv: Tensor, heads: int, q_norm: nn.Module, k_norm: nn.Module) -> bool:
    """Whether :func:`fused_qk_heads` takes this projection ``(b, n, 3 * heads * head_dim)``
    with these norms: both ``nn.LayerNorm`` over ``head_dim`` with a weight. (Without norms
    torch's path is the faster: q, k and v are views of the projection, and the kernel's
    q and k copies cost more than autograd's stacking of the gradients.)"""
    return (
        qkv.device.type == "cpu"
        and qkv.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and _norms_served(q_norm, k_norm, qkv.shape[-1] // (3 * heads))
        and native_kernel() is not None
    )


def _norms_served(q_norm: nn.Module, k_norm: nn.Module, head_dim: int) -> bool:
    return (
        all(
            type(norm) is nn.LayerNorm
            and norm.elementwise_affine
            and norm.normalized_shape == (head_dim,)
            and norm.weight.dtype == torch.float32
            and norm.weight.device.type == "cpu"
            for norm in (q_norm, k_norm)
        )
        and q_norm.eps == k_norm.eps
    )


def fused_qk_heads(qkv: Tensor, heads: int, q_norm: nn.Module, k_norm: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
    """``(b, n, 3 * heads * head_dim)`` -> q, k, v, each ``(b, heads, n, head_dim)``: q and k
    through their norms (laid out ``(b, n, heads, head_dim)`` in memory), v a view of ``qkv``.
    The same numbers as ``q_norm(q), k_norm(k), v`` by torch, to float32 rounding."""
    return QkHeads.apply(qkv.contiguous(), heads, q_norm.eps, q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias)


class QkHeads(torch.autograd.Function):
    """:func:`fused_qk_heads` with its own backward, which writes the projection's whole gradient
    (dq and dk through the norms, dv in place) in one pass. Once differentiable (no second
    derivative through it, as through the ``native`` attention kernel it feeds), and v, a view
    of its input, may not be written in place."""

    @staticmethod
    def forward(ctx, qkv: Tensor, heads: int, eps: float, q_weight, q_bias, k_weight, k_bias):  # type: ignore[override]
        b, n, channels = qkv.shape
        packed = qkv.view(b * n, 3, heads, channels // (3 * heads))
        with profiled(PROFILE_RANGE):
            q, k, mean, rstd = native_kernel().qk_heads_forward(packed, q_weight, q_bias, k_weight, k_bias, eps)
        ctx.save_for_backward(packed, mean, rstd, q_weight, q_bias, k_weight, k_bias)
        ctx.qkv_shape = qkv.shape
        v = packed.view(b, n, 3, heads, -1)[:, :, 2]
        return (*(t.view(b, n, heads, -1).transpose(1, 2) for t in (q, k, v)),)

    @staticmethod
    @once_differentiable
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor):  # type: ignore[override]
        packed, mean, rstd, q_weight, q_bias, k_weight, k_bias = ctx.saved_tensors
        grads = [g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv)]  # the kernel's layout
        with profiled(PROFILE_RANGE + "_backward"):
            dqkv, *norm_grads = native_kernel().qk_heads_backward(
                *grads, packed, mean, rstd, q_weight, q_bias, k_weight, k_bias
            )
        norm_grads = [None if p is None else g for p, g in zip((q_weight, q_bias, k_weight, k_bias), norm_grads)]
        return dqkv.view(ctx.qkv_shape), None, None, *norm_grads
