"""The GELU MLP's own backward (processor/mlp.py ``_GeluMLP``) against float64 autograd, on one
chunk (the GELU's output kept from forward) and on several (recomputed chunk by chunk), on both
matmul backends."""

import pytest
import torch
import torch.nn.functional as F

from processor import mlp
from tests.processor.matmul.forced import forced_backend, needs_onednn
from tests.processor.strategies.test_exactness import assert_close


def _float64_reference(layer: mlp.MLP, x: torch.Tensor, cotangent: torch.Tensor) -> list[torch.Tensor]:
    """dx and each parameter's gradient of ``layer`` by float64 autograd, no custom function."""
    params = [p.detach().double().requires_grad_() for p in layer.parameters()]
    x64 = x.double().requires_grad_()
    w1, b1, w2, b2 = params
    out = F.linear(F.gelu(F.linear(x64, w1, b1)), w2, b2)
    return list(torch.autograd.grad(out, [x64, *params], cotangent.double()))


@pytest.mark.parametrize("backend", ["aten", pytest.param("onednn", marks=needs_onednn)])
@pytest.mark.parametrize("chunk_values", [None, 480])  # None: one chunk; 480: 4 chunks of 5 rows
def test_the_gelu_mlp_matches_float64_on_one_chunk_and_on_several(monkeypatch, chunk_values, backend):
    if chunk_values is not None:
        monkeypatch.setattr(mlp, "_CHUNK_VALUES", chunk_values)
    torch.manual_seed(5)
    layer = mlp.MLP(24, 96, "gelu")
    x = torch.randn(2, 10, 24, requires_grad=True)
    cotangent = torch.randn(2, 10, 24)
    assert mlp._chunk_rows(torch.empty(20, 96)) == (20 if chunk_values is None else 5)
    with forced_backend(backend):
        out = layer(x)
        assert type(out.grad_fn).__name__ == "_GeluMLPBackward"
        found = torch.autograd.grad(out, [x, *layer.parameters()], cotangent)
    expected = _float64_reference(layer, x.detach(), cotangent)
    for name, got, ref in zip(["x", "w1", "b1", "w2", "b2"], found, expected):
        assert got.shape == ref.shape and got.is_contiguous()
        assert_close(got.numpy(), ref.numpy(), f"d{name}")
