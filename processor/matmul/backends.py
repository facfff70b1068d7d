"""The model's linear layers, on the GEMM that runs fastest on this host.

torch's float32 ``F.linear`` on the CPU runs MKL's SGEMM, which takes its AVX2 code on AMD
processors; oneDNN (torch's ``mkldnn`` operators) runs AVX-512 there. On a 2-core AMD EPYC Zen 5
(family 26) oneDNN's float32 linear ran 1.5-1.8x MKL's at this project's sizes (a 2048³ product
106 against 216-243 GFLOP/s, one thread; docs/benchmarks/matmul_zen5_2026-11-29.md). Where MKL runs its
best code (Intel), the two are alike. So the backend is a process-wide choice, like
``torch.backends`` flags, made once per host by measurement (:mod:`.probe`):

- ``aten``: ``F.linear`` (torch's own choice of GEMM), the default;
- ``onednn``: :class:`OneDnnLinear`, oneDNN's float32 product forward and for the input's
  gradient, and for the weight's with the narrower operand transposed (:func:`_onednn_weight_grad`).

Only float32 CPU products outside autocast and ``torch.compile``, of at least
:data:`MIN_MACS_PER_THREAD` multiply-adds a thread, take oneDNN; anything else (CUDA, bfloat16
under autocast, float64, small products) goes to ``F.linear`` whatever the backend. The two
backends agree to float32 rounding (a different summation order), not bitwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from processor.attention.native import native_kernel, profiled

# "copy_" in the name: the step's profile counts it with the copies (training/reporting/step_split.py kind_of)
TRANSPOSE_RANGE = "gridshard_transpose_copy_"

BACKENDS = ("aten", "onednn")
_backend = "aten"


def set_matmul_backend(name: str) -> None:
    """Make ``name`` (one of :data:`BACKENDS`) this process's backend for :func:`linear`."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"matmul backend {name!r} is not one of {list(BACKENDS)}")
    if name == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError("matmul backend 'onednn': this torch build has no oneDNN (mkldnn); use 'aten'")
    _backend = name


def matmul_backend() -> str:
    """This process's backend for :func:`linear` (:data:`BACKENDS`)."""
    return _backend


# Products of fewer multiply-adds per thread stay on torch's GEMM: oneDNN's calls cost tens of
# microseconds more each. A linear's fwd+bwd on Zen 5, oneDNN over MKL: 0.67x at 0.7M a thread
# (340 x 64 -> 64, 2 threads), 0.88x at 1.4M, 1.01x at 2.1M, 1.09-1.11x at 3.3M, 1.33x at 4.2M.
MIN_MACS_PER_THREAD = 3 << 20


def large_enough_for_onednn(macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds has :data:`MIN_MACS_PER_THREAD` for each of
    this process's threads."""
    return macs >= MIN_MACS_PER_THREAD * torch.get_num_threads()


def onednn_serves(x: Tensor, weight: Tensor, macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds with operands ``x`` and ``weight`` goes to
    oneDNN: the ``onednn`` backend, both float32 on the CPU, no CPU autocast (which casts to
    bfloat16 inside ``F.linear``), not under ``torch.compile`` (inductor cannot lower the operator
    with a gradient; it picks its own GEMM), and at least :data:`MIN_MACS_PER_THREAD` per thread."""
    return (
        _backend == "onednn"
        and not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and not torch.is_autocast_enabled("cpu")
        and large_enough_for_onednn(macs)
    )


def _onednn(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight^T + bias`` by oneDNN: x ``(..., in)``, weight ``(out, in)`` (either may be a
    strided view), bias ``(out,)`` or None -> ``(..., out)``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_weight_grad(x_rows: Tensor, grad_rows: Tensor) -> Tensor:
    """``grad_rows^T @ x_rows`` by oneDNN: x_rows ``(rows, in)``, grad_rows ``(rows, out)`` ->
    ``(out, in)``. A reduction over the rows: oneDNN's "source" must hold them contiguous, so the
    narrower operand is transposed (:func:`_transposed`); the wider one goes in as oneDNN's
    "weight", a transposed view that oneDNN packs itself. Measured on Zen 5, 2 threads: 82 against
    143 us at 1,600 x 64 x 64, 139 against 304 at 1,600 x 64 x 192, 529 against 3,220 at
    15,744 x 64 x 64, over both operands transposed by us. At equal widths grad is transposed:
    the product then comes out ``(out, in)``, with no copy to lay it out."""
    if grad_rows.shape[1] > x_rows.shape[1]:
        return _onednn(_transposed(x_rows), grad_rows.t()).t()
    return _onednn(_transposed(grad_rows), x_rows.t())


def _transposed(rows: Tensor) -> Tensor:
    """``rows`` ``(n, k)`` -> its transpose ``(k, n)``, contiguous: by the fused kernels' tiled
    transpose where they are built (``csrc/transpose.cpp``: 5-7x torch's copy of a transposed
    view of a (points, 64) matrix on a Zen 5), else by torch."""
    kernel = native_kernel()
    if kernel is not None and rows.is_contiguous():
        with profiled(TRANSPOSE_RANGE):
            return kernel.transpose(rows)
    return rows.t().contiguous()


def product(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor | None = None) -> Tensor:
    """``x @ weight^T + bias`` (no autograd) on this process's backend: x ``(rows, in)``, weight
    ``(out, in)``, bias ``(out,)`` -> ``(rows, out)``, written into ``out`` when given (a chunk
    of a larger result)."""
    if onednn_serves(x, weight, x.numel() * weight.shape[0]):
        result = _onednn(x, weight, bias)
        return result if out is None else out.copy_(result)
    return torch.addmm(bias, x, weight.t()) if out is None else torch.addmm(bias, x, weight.t(), out=out)


def input_grad(grad: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``grad @ weight`` (no autograd): grad ``(..., out)``, weight ``(out, in)`` -> ``(..., in)``,
    written into ``out`` (rows, in) when given, grad then ``(rows, out)``."""
    if onednn_serves(grad, weight, grad.numel() * weight.shape[1]):
        result = _onednn(grad, weight.t())
        return result if out is None else out.copy_(result)
    return grad @ weight if out is None else torch.mm(grad, weight, out=out)


def weight_grad(x_rows: Tensor, grad_rows: Tensor) -> Tensor:
    """``grad_rows^T @ x_rows`` (no autograd), contiguous: x_rows ``(rows, in)``, grad_rows
    ``(rows, out)`` -> ``(out, in)``: a linear's weight gradient."""
    if onednn_serves(x_rows, grad_rows, x_rows.numel() * grad_rows.shape[1]):
        return _onednn_weight_grad(x_rows, grad_rows).contiguous()
    return torch.mm(grad_rows.t(), x_rows)


class OneDnnLinear(torch.autograd.Function):
    """``F.linear`` on oneDNN, with its own backward on oneDNN (autograd would differentiate into
    ``aten.mm``, MKL's again)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    @once_differentiable  # oneDNN's operator has no derivative of its own: no double backward
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        out_features, in_features = weight.shape
        rows_g = grad.reshape(-1, out_features)
        grad_x = _onednn(grad, weight.t()) if ctx.needs_input_grad[0] else None  # (..., out) @ (out, in)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = _onednn_weight_grad(x.reshape(-1, in_features), rows_g).contiguous()  # forward chose oneDNN
        grad_b = rows_g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


# A few input features over many rows (a graph's edge features: 3 per edge): autograd's weight
# gradient ``grad^T x`` on torch's CPU GEMM, a transposed (out, rows) view times (rows, 3), took
# 595 us at 15,744 rows x 64 outputs on Zen 5 (the default run's decoder edges); the same
# product as ``(x^T grad)^T``, 146 us. Narrow: at most this many input features.
NARROW_FEATURES = 8


class NarrowInputLinear(torch.autograd.Function):
    """``F.linear`` whose weight gradient is taken as ``(x^T grad)^T`` (see :data:`NARROW_FEATURES`)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        rows_g = grad.reshape(-1, weight.shape[0])
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.mm(x.reshape(-1, weight.shape[1]).t(), rows_g).t().contiguous()
        grad_b = rows_g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` on this process's backend (:func:`set_matmul_backend`):
    x ``(..., in)``, weight ``(out, in)``, bias ``(out,)`` or None -> ``(..., out)``."""
    if onednn_serves(x, weight, x.numel() * weight.shape[0]):
        return OneDnnLinear.apply(x, weight, bias)
    if _narrow_input(x, weight):
        return NarrowInputLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def _narrow_input(x: Tensor, weight: Tensor) -> bool:
    """Whether ``linear(x, weight)`` takes :class:`NarrowInputLinear`: a weight being trained, at
    most :data:`NARROW_FEATURES` input features, float32 on the CPU, outside ``torch.compile``."""
    return (
        weight.shape[1] <= NARROW_FEATURES
        and weight.requires_grad
        and torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose product runs on this process's
    backend (:func:`linear`)."""

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias)
