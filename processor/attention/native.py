"""The fused CPU band-attention kernel (``csrc/band_attention.cpp``): its calls and autograd
function. Building and loading it (and its ISA variants) is :mod:`.native_build`; where it is not
built, :func:`native_kernel` returns None and the dispatcher keeps to the Python paths.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType

import torch
from torch import Tensor

from processor.attention.native_build import load
from processor.host import cpu_isa

PROFILE_NAME = "gridshard_band_attention"  # what the profiler calls its calls


def native_kernel() -> ModuleType | None:
    """The ``native`` build (``-march=native``), or None when it is not built for these sources
    and this torch."""
    return load("native")


def native_available() -> bool:
    """Whether the fused CPU kernel is built and loads."""
    return native_kernel() is not None


def native_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    scale: float,
    ids: Tensor | None,
    q_ids: Tensor | None = None,
    variant: str = "native",
    bf16_products: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of queries ``(batch, heads, n_q, head_dim)`` over keys ``(batch, heads, n_k,
    head_dim)`` (any dtype: computed in float32, but for the products under ``bf16_products``);
    query ``i`` at key position ``q_offset + i`` (any integer: the ring's blocks lie apart).
    ``ids`` ``(1 or batch, n_k)`` or None; ``q_ids`` ``(1 or batch, n_q)`` the queries' own (None:
    those of keys ``q_offset + i``).
    ``out`` has q's dtype and strides, ``lse`` ``(batch, heads, n_q)`` float32 (``-inf`` for a
    query that reaches no key, whose output is 0). ``variant``: which build
    (:mod:`.native_build`; the tests run each). ``bf16_products``: the tiles' products in bfloat16
    with float32 accumulation and softmax (None: where q is bfloat16 and the host runs them, see
    :func:`bf16_products_here`). A custom operator (``gridshard::band_attention``, its shapes
    known to ``torch.compile``, which keeps it whole in its graph)."""
    return torch.ops.gridshard.band_attention(
        q, k, v, int(window), int(q_offset), float(scale), ids, q_ids, variant, bf16_products
    )


def native_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    window: int,
    q_offset: int,
    scale: float,
    ids: Tensor | None,
    q_ids: Tensor | None = None,
    variant: str = "native",
    bf16_products: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` given the (possibly merged) ``out`` and ``lse`` of these queries
    (``gridshard::band_attention_backward``)."""
    return torch.ops.gridshard.band_attention_backward(
        grad, q, k, v, out, lse, int(window), int(q_offset), float(scale), ids, q_ids, variant, bf16_products
    )


def bf16_products_here(variant: str = "native") -> bool:
    """Whether this host runs the kernel's bfloat16 products: oneDNN's BRGeMM has a kernel for it
    (AVX-512) and the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX; elsewhere oneDNN would
    convert to float32, no faster than the float32 products)."""
    kernel = load(variant)
    return kernel is not None and _multiplies_bf16() and bool(kernel.bf16_products())


@functools.cache
def _multiplies_bf16() -> bool:
    return bool({"AVX512-BF16", "AMX"} & set(cpu_isa()))


def _products_in_bf16(kernel: ModuleType, q: Tensor, asked: bool | None) -> bool:
    if asked is None:  # oneDNN's kernels are off where the user turned mkldnn off
        asked = q.dtype == torch.bfloat16 and torch.backends.mkldnn.enabled and bf16_products_here()
    return asked and bool(kernel.bf16_serves(q.shape[-1]))


def _warn_of_refusal(kernel: ModuleType, in_bf16: bool) -> None:
    """Once per process: oneDNN refused the bf16 products (a host the kernel was not tested on),
    so the kernel computed, and goes on computing, in fp32."""
    reason = kernel.bf16_refusal() if in_bf16 else ""
    if reason:
        _warn_once(reason)


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"band attention: oneDNN refused the bf16 products ({reason}); the kernel computes in fp32 from now on. "
        "Please report it with the output of `lscpu`.",
        RuntimeWarning,
        stacklevel=4,
    )


def _float_rows(t: Tensor) -> Tensor:
    """``t`` in float32 with a contiguous last dimension (itself when it is already)."""
    t = t.float()
    return t if t.stride(-1) == 1 else t.contiguous()


def _ids(ids: Tensor | None) -> Tensor | None:
    return None if ids is None else ids.to(torch.int64).contiguous()


# The kernel's calls as operators torch.compile keeps whole in its graph (their shapes known
# without running them). Defined with the low-level library: torch.library.custom_op's wrapper
# cost about 100 us a call here, most of the kernel's time on a small grid.
_OPERATORS = torch.library.Library("gridshard", "DEF")
_OPERATORS.define(
    "band_attention(Tensor q, Tensor k, Tensor v, int window, int q_offset, float scale, Tensor? ids, "
    "Tensor? q_ids, str variant, bool? bf16_products) -> (Tensor, Tensor)"
)
_OPERATORS.define(
    "band_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int window, "
    "int q_offset, float scale, Tensor? ids, Tensor? q_ids, str variant, bool? bf16_products) "
    "-> (Tensor, Tensor, Tensor)"
)


def _forward_op(q, k, v, window, q_offset, scale, ids, q_ids, variant, bf16_products):  # the schema types it
    kernel = load(variant)
    assert kernel is not None, f"the {variant} band-attention kernel is not built"
    in_bf16 = _products_in_bf16(kernel, q, bf16_products)
    q32, k32, v32 = (_float_rows(t) for t in (q, k, v))
    with profiled(PROFILE_NAME):
        out, lse = kernel.forward(q32, k32, v32, window, q_offset, scale, _ids(ids), _ids(q_ids), in_bf16)
    _warn_of_refusal(kernel, in_bf16)
    return out.to(q.dtype), lse


def _forward_shapes(q, k, v, window, q_offset, scale, ids, q_ids, variant, bf16_products):
    return _like_rows(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_op(grad, q, k, v, out, lse, window, q_offset, scale, ids, q_ids, variant, bf16_products):
    kernel = load(variant)
    assert kernel is not None, f"the {variant} band-attention kernel is not built"
    in_bf16 = _products_in_bf16(kernel, q, bf16_products)
    tensors = [_float_rows(t) for t in (grad, q, k, v, out)]
    args = (lse.float(), window, q_offset, scale, _ids(ids), _ids(q_ids), in_bf16)
    with profiled(PROFILE_NAME + "_backward"):
        dq, dk, dv = kernel.backward(*tensors, *args)
    _warn_of_refusal(kernel, in_bf16)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward_shapes(grad, q, k, v, out, lse, window, q_offset, scale, ids, q_ids, variant, bf16_products):
    return _like_rows(q), _like_rows(k), _like_rows(v)


def profiled(name: str) -> AbstractContextManager:
    """A profiler range while a profiler records; else nothing (a range costs ~25 us even then)."""
    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else nullcontext()


def _like_rows(t: Tensor) -> Tensor:
    """An empty tensor laid out as the kernel lays out its result for ``t`` (:func:`_float_rows`)."""
    return torch.empty_like(t) if t.stride(-1) == 1 else t.new_empty(t.shape)


_OPERATORS.impl("band_attention", _forward_op, "CPU")
_OPERATORS.impl("band_attention_backward", _backward_op, "CPU")
torch.library.register_fake("gridshard::band_attention", _forward_shapes, lib=_OPERATORS)
torch.library.register_fake("gridshard::band_attention_backward", _backward_shapes, lib=_OPERATORS)


class NativeBandAttention(torch.autograd.Function):
    """The fused kernel with its own backward; saves q, k, v, out and lse. ``torch.compile``
    traces it whole (its calls are the operators above)."""

    @staticmethod
    def forward(ctx, q, k, v, window: int, q_offset: int, scale: float, ids):  # type: ignore[override]
        out, lse = native_forward(q, k, v, window, q_offset, scale, ids)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geometry = (window, q_offset, scale, ids)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = native_backward(grad, q, k, v, out, lse, *ctx.geometry)
        return dq, dk, dv, None, None, None, None
