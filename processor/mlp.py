"""The per-point MLP of a transformer block (plain or gated), and the activations it may use."""

from __future__ import annotations

from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from processor.matmul.backends import Linear, input_grad, linear, product, weight_grad

ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu", "tanh")
MLP_IMPLEMENTATIONS = ("mlp", "glu", "swiglu", "geglu", "reglu")
_GATINGS = MappingProxyType({"glu": nn.Sigmoid, "swiglu": nn.SiLU, "geglu": nn.GELU, "reglu": nn.ReLU})  # anemoi's


def make_activation(name: str) -> nn.Module:
    """The activation called ``name``, one of :data:`ACTIVATIONS`."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "silu":
        return nn.SiLU()
    if name == "relu":
        return nn.ReLU()
    if name == "tanh":
        return nn.Tanh()
    raise ValueError(f"unknown activation {name!r}; choose one of {list(ACTIVATIONS)}")


def make_mlp(num_channels: int, hidden: int, activation: str, implementation: str = "mlp") -> MLP | GatedMLP:
    """A block's MLP: :class:`MLP` with ``activation``, or the :class:`GatedMLP` ``implementation``
    names (one of :data:`MLP_IMPLEMENTATIONS`)."""
    if implementation == "mlp":
        return MLP(num_channels, hidden, activation)
    if implementation not in _GATINGS:
        raise ValueError(f"unknown mlp_implementation {implementation!r}; choose one of {list(MLP_IMPLEMENTATIONS)}")
    return GatedMLP(num_channels, hidden, implementation)


class MLP(nn.Sequential):
    """``(..., C)`` -> ``(..., C)`` through a hidden layer of ``hidden`` channels."""

    def __init__(self, num_channels: int, hidden: int, activation: str) -> None:
        super().__init__(Linear(num_channels, hidden), make_activation(activation), Linear(hidden, num_channels))

    @property
    def widening(self) -> tuple[nn.Linear, ...]:
        """The layers ``C`` -> ``hidden``: the first one."""
        return (self[0],)

    @property
    def narrow(self) -> nn.Linear:
        """The last layer, ``hidden`` -> ``C``; its bias is the output bias."""
        return self[2]

    def forward(self, x: Tensor, add_output_bias: bool = True) -> Tensor:
        """``add_output_bias=False`` leaves out the last layer's bias: for a partial sum that
        ranks add up before the bias is added once (``shard_channels``)."""
        first, act, second = self
        out_bias = second.bias if add_output_bias else torch.zeros_like(second.bias)
        if isinstance(act, nn.GELU) and torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
            return _GeluMLP.apply(x, first.weight, first.bias, second.weight, out_bias, act.approximate)
        return linear(act(first(x)), second.weight, out_bias)


class _GeluMLP(torch.autograd.Function):
    """``linear -> GELU -> linear`` that keeps the input and the pre-activation for backward, and
    on a small grid the GELU's output too.

    Autograd would also keep the post-activation (``hidden`` values per point, as many as the
    pre-activation) and hold three hidden-sized tensors at once in backward. Here, where the
    hidden values are many, forward and backward go through the points in a few chunks; backward
    recomputes the GELU per chunk (one elementwise pass) and runs its backward in place, so the
    temporaries are a chunk's worth of hidden values, not all of them. Where they fit one chunk
    (:func:`_chunk_rows`: at most :data:`_CHUNK_VALUES`, 16 MiB a layer), forward keeps its GELU
    output instead, and backward skips that pass.
    """

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, approximate: str) -> Tensor:  # type: ignore[override]
        pre = linear(x, w1, b1)
        ctx.approximate = approximate
        pre_rows = pre.reshape(-1, pre.shape[-1])
        chunk = _chunk_rows(pre_rows)
        if chunk >= pre_rows.shape[0]:
            kept = F.gelu(pre_rows, approximate=approximate)
            out = product(kept, w2, b2)
        else:
            kept, out = None, x.new_empty(pre_rows.shape[0], w2.shape[0])
            for lo in range(0, pre_rows.shape[0], chunk):
                rows = slice(lo, lo + chunk)
                product(F.gelu(pre_rows[rows], approximate=approximate), w2, b2, out=out[rows])
        ctx.save_for_backward(x, w1, w2, pre, kept)
        return out.view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, w1, w2, pre, kept = ctx.saved_tensors
        x_rows, pre_rows = x.reshape(-1, x.shape[-1]), pre.reshape(-1, pre.shape[-1])
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_x = torch.empty_like(x_rows)
        if kept is not None:
            grad_w1, grad_b1, grad_w2 = _rows_backward(
                x_rows, pre_rows, kept, grad_rows, w1, w2, ctx.approximate, grad_x
            )
        else:
            grad_w1, grad_w2 = torch.zeros_like(w1), torch.zeros_like(w2)
            grad_b1 = pre_rows.new_zeros(pre_rows.shape[-1])
            chunk = _chunk_rows(pre_rows)
            for lo in range(0, x_rows.shape[0], chunk):
                rows = slice(lo, lo + chunk)
                act = F.gelu(pre_rows[rows], approximate=ctx.approximate)
                parts = _rows_backward(
                    x_rows[rows], pre_rows[rows], act, grad_rows[rows], w1, w2, ctx.approximate, grad_x[rows]
                )
                grad_w1 += parts[0]
                grad_b1 += parts[1]
                grad_w2 += parts[2]
        grad_b2 = grad_rows.sum(0) if ctx.needs_input_grad[4] else None  # shard_channels passes zeros
        return grad_x.view_as(x), grad_w1, grad_b1, grad_w2, grad_b2, None


def _rows_backward(
    x_rows: Tensor,
    pre_rows: Tensor,
    act: Tensor,
    grad_rows: Tensor,
    w1: Tensor,
    w2: Tensor,
    approximate: str,
    grad_x: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The MLP's backward over some rows: x_rows ``(rows, C)``, its pre-activation and GELU
    output ``(rows, hidden)``, the output's gradient ``(rows, C)``; writes the rows' dx into
    ``grad_x`` ``(rows, C)`` and returns their shares of dw1 ``(hidden, C)``, db1 ``(hidden,)``
    and dw2 ``(C, hidden)``."""
    grad_w2 = weight_grad(act, grad_rows)
    hidden = input_grad(grad_rows, w2)
    torch.ops.aten.gelu_backward.grad_input(hidden, pre_rows, approximate=approximate, grad_input=hidden)
    input_grad(hidden, w1, out=grad_x)
    return weight_grad(x_rows, hidden), hidden.sum(0), grad_w2


_MLP_CHUNKS = 4
_CHUNK_VALUES = 1 << 22  # hidden values (16 MiB in fp32) below which the points go in one chunk


def _chunk_rows(pre_rows: Tensor) -> int:
    """Rows a chunk of ``pre_rows`` ``(points, hidden)``: at most :data:`_MLP_CHUNKS` chunks, one
    where the hidden values are few (a small grid: each chunk costs its handful of calls)."""
    rows, hidden = pre_rows.shape
    chunks = min(_MLP_CHUNKS, max(1, -(-rows * hidden // _CHUNK_VALUES)))
    return max(1, -(-rows // chunks))


class GatedLayer(nn.Module):
    """anemoi's ``GatedMLPLayer``: ``gating(gate_proj(x)) * value_proj(x)``, ``(..., C)`` -> ``(..., hidden)``."""

    def __init__(self, num_channels: int, hidden: int, implementation: str) -> None:
        super().__init__()
        self.gate_proj = Linear(num_channels, hidden)
        self.value_proj = Linear(num_channels, hidden)
        self.gating = _GATINGS[implementation]()

    def forward(self, x: Tensor) -> Tensor:
        return self.gating(self.gate_proj(x)) * self.value_proj(x)


class GatedMLP(nn.Sequential):
    """``(..., C)`` -> ``(..., C)``: a :class:`GatedLayer` to ``hidden`` channels, then a linear
    back (anemoi's ``MLP`` with ``mlp_implementation`` glu, swiglu, geglu or reglu)."""

    def __init__(self, num_channels: int, hidden: int, implementation: str) -> None:
        super().__init__(GatedLayer(num_channels, hidden, implementation), Linear(hidden, num_channels))

    @property
    def widening(self) -> tuple[nn.Linear, ...]:
        """The layers ``C`` -> ``hidden``: the gate's and the value's projections."""
        return (self[0].gate_proj, self[0].value_proj)

    @property
    def narrow(self) -> nn.Linear:
        """The last layer, ``hidden`` -> ``C``; its bias is the output bias."""
        return self[1]

    def forward(self, x: Tensor, add_output_bias: bool = True) -> Tensor:
        """As :meth:`MLP.forward`."""
        gated, second = self
        return linear(gated(x), second.weight, second.bias if add_output_bias else None)
