"""The linear layers' oneDNN backend: forward and every gradient against a float64 reference,
the processor's MLP on it, the cases it leaves to ``F.linear``, and a sharded processor on it
equal to one rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import processor.matmul.backends as backends_module
from processor import ProcessorConfig, TransformerProcessor
from processor.attention.native_build import built_variants, load
from processor.matmul import Linear, linear, set_matmul_backend
from processor.matmul.backends import onednn_serves
from tests.processor.matmul.forced import forced_backend, needs_onednn
from tests.processor.strategies.test_exactness import assert_close, one_rank_run, sharded_run

RTOL = 1e-5
pytestmark = needs_onednn


def _grads(x, weight, bias, out, backend_name):
    with forced_backend(backend_name):
        y = linear(x, weight, bias)
    inputs = [t for t in (x, weight, bias) if t is not None]
    return y, torch.autograd.grad(y, inputs, out)


@pytest.mark.parametrize(
    "x_shape,out_features,bias,weight_rows",
    [
        ((2, 300, 24), 96, True, None),  # widening (out > in): dW in one orientation
        ((300, 96), 24, True, None),  # narrowing: dW in the other
        ((2, 150, 32), 32, True, None),  # as wide: the narrowing's orientation
        ((3, 5, 7), 9, False, None),
        ((1, 40, 16), 32, False, slice(16, 48)),  # a slice of a packed weight (q of qkv)
    ],
)
def test_forward_and_gradients_match_float64(x_shape, out_features, bias, weight_rows):
    g = torch.Generator().manual_seed(sum(x_shape) + out_features)
    in_features = x_shape[-1]
    full_rows = 64 if weight_rows is not None else out_features
    x = torch.randn(x_shape, generator=g, requires_grad=True)
    w_full = torch.randn(full_rows, in_features, generator=g, requires_grad=True)
    weight = w_full[weight_rows] if weight_rows is not None else w_full
    b = torch.randn(out_features, generator=g, requires_grad=True) if bias else None
    cotangent = torch.randn(*x_shape[:-1], out_features, generator=g)

    y, grads = _grads(x, weight, b, cotangent, "onednn")
    _assert_float64s(y, grads, x, weight, b, cotangent)


def _assert_float64s(y, grads, x, weight, bias, cotangent) -> None:
    """``y = linear(x, weight, bias)`` and its gradients ``(dx, dW[, db])`` for ``cotangent``
    equal to float64's ``F.linear``, each gradient shaped and laid out as its tensor."""
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    y64 = F.linear(x64, w64, b64)
    want = torch.autograd.grad(y64, [t for t in (x64, w64, b64) if t is not None], cotangent.double())
    assert_close(y.detach().numpy(), y64.detach().numpy(), "output", tol=RTOL)
    for name, got, ref in zip(("dx", "dW", "db"), grads, want):
        assert got.shape == ref.shape and got.is_contiguous()
        assert_close(got.numpy(), ref.numpy(), name, tol=RTOL)


@pytest.mark.parametrize("bias", [True, False])
def test_a_narrow_input_takes_its_own_weight_gradient_and_matches_float64(bias):
    """Edge features (3 a row): the weight's gradient as ``(x^T grad)^T``, every gradient float64's."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 500, 3, generator=g, requires_grad=True)
    weight = torch.randn(16, 3, generator=g, requires_grad=True)
    b = torch.randn(16, generator=g, requires_grad=True) if bias else None
    cotangent = torch.randn(2, 500, 16, generator=g)
    y = linear(x, weight, b)
    assert isinstance(y.grad_fn, backends_module.NarrowInputLinear._backward_cls)
    inputs = [t for t in (x, weight, b) if t is not None]
    _assert_float64s(y, torch.autograd.grad(y, inputs, cotangent), x, weight, b, cotangent)
    with torch.no_grad():  # nothing to differentiate: torch's own
        assert linear(x, weight, b).grad_fn is None
    wide = torch.randn(2, 500, 9, requires_grad=True)
    assert not isinstance(linear(wide, torch.randn(16, 9), b).grad_fn, backends_module.NarrowInputLinear._backward_cls)


def test_the_backends_differ_only_by_rounding_and_the_module_keeps_its_state_dict():
    torch.manual_seed(0)
    layer = Linear(48, 80)
    plain = torch.nn.Linear(48, 80)
    plain.load_state_dict(layer.state_dict())  # same keys, same shapes
    x = torch.randn(4, 100, 48)
    with forced_backend("onednn"):
        fast = layer(x)
    assert_close(fast.detach().numpy(), plain(x).detach().numpy(), "output", tol=RTOL)
    assert isinstance(layer, torch.nn.Linear)


def test_what_onednn_leaves_to_f_linear():
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    macs = 8 * 16 * 4
    with forced_backend("onednn"):
        assert onednn_serves(x, w, macs)
        assert not onednn_serves(x.double(), w.double(), macs)  # float64: torch's
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not onednn_serves(x, w, macs)  # autocast casts inside F.linear
    with forced_backend("aten"):
        assert not onednn_serves(x, w, macs)
    set_matmul_backend("onednn")
    try:  # a small product: oneDNN's per-call cost outweighs its speed
        threads = torch.get_num_threads()
        assert not onednn_serves(x, w, backends_module.MIN_MACS_PER_THREAD * threads - 1)
        assert onednn_serves(x, w, backends_module.MIN_MACS_PER_THREAD * threads)
    finally:
        set_matmul_backend("aten")


def test_a_second_derivative_through_onednn_is_refused():
    x, w = torch.randn(6, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    with forced_backend("onednn"):
        (grad_x,) = torch.autograd.grad(linear(x, w).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|twice"):
        grad_x.sum().backward()


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="'mkl' is not one of"):
        set_matmul_backend("mkl")


def test_the_gelu_mlp_on_onednn_matches_float64():
    """The processor's MLP runs its own backward (processor/mlp.py): its products go through the
    backend's no-autograd helpers."""
    torch.manual_seed(3)
    config = ProcessorConfig(num_layers=1, num_channels=32, num_heads=4, window_size=8, num_chunks=0)
    model = TransformerProcessor(config)
    x = torch.randn(2, 120, 32)
    reference = TransformerProcessor(config).double()
    reference.load_state_dict(model.state_dict())
    with forced_backend("onednn"):
        xr = x.clone().requires_grad_()
        model(xr).square().sum().backward()
    x64 = x.double().requires_grad_()
    reference(x64).square().sum().backward()
    assert_close(xr.grad.numpy(), x64.grad.numpy(), "dx", tol=RTOL)
    for (name, p), p64 in zip(model.named_parameters(), reference.parameters()):
        assert_close(p.grad.numpy(), p64.grad.numpy(), name, tol=RTOL)


def _onednn_sharded_run(group, case: dict) -> dict:
    with forced_backend("onednn"):  # the pool's ranks outlive the case: restored after it
        return sharded_run(group, case)


@pytest.mark.parametrize("strategy", ["shard_sequence", "shard_channels"])
def test_sharded_on_onednn_equals_one_rank(rank_pool, strategy):
    case = dict(points=101, window=9, batch=2, heads=4, seed=5, chunks=1, strategy=strategy)
    parts = rank_pool.run_ok(_onednn_sharded_run, 3, case)
    with forced_backend("onednn"):
        reference = one_rank_run(case)
    assert_close(np.concatenate([p["y"] for p in parts], axis=1), reference["y"], "y")
    assert_close(np.concatenate([p["dx"] for p in parts], axis=1), reference["dx"], "dx")
    for name, grad in reference["grads"].items():
        assert_close(parts[0]["grads"][name], grad, name)


@pytest.mark.parametrize("shape", [(1, 1), (3, 16), (17, 33), (16, 64), (1617, 64), (64, 5248), (200, 37)])
def test_the_weight_gradients_transpose_is_exact_on_every_built_variant(shape):
    """oneDNN's operands for a weight gradient (``backends._transposed``): the fused kernels'
    tiled transpose, whole 16 x 16 tiles and ragged edges, equal to torch's bit for bit."""
    if not built_variants():
        pytest.skip("the fused kernels are not built")
    x = torch.randn(shape)
    want = x.t().contiguous()
    for variant in built_variants():
        got = load(variant).transpose(x)
        assert got.is_contiguous() and torch.equal(got, want), variant
    assert torch.equal(backends_module._transposed(x), want)
    assert torch.equal(backends_module._transposed(x.t().contiguous().t()), want)  # a strided view: torch's copy
