"""The fused q/k head norms (processor/attention/qk_heads.py, csrc/head_norm.cpp): q, k and v and
every gradient against torch's LayerNorm in float64, for each ISA variant built here, for head
widths the kernel unrolls and one it reads at run time; the cases it leaves to torch; and the
attention layer equal with and without it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import processor.attention.module as module_under_test
from processor.attention import SelfAttention
from processor.attention.native import native_available
from processor.attention.native_build import built_variants, load
from processor.attention.qk_heads import fused_qk_heads, fused_qk_heads_serve
from tests.processor.strategies.test_exactness import assert_close

pytestmark = pytest.mark.skipif(not native_available(), reason="the fused CPU kernel is not built")
VARIANTS = built_variants() or ["native"]
RTOL = 1e-5


def _norms(head_dim: int, bias: bool, generator: torch.Generator) -> tuple[nn.LayerNorm, nn.LayerNorm]:
    norms = nn.LayerNorm(head_dim, bias=bias), nn.LayerNorm(head_dim, bias=bias)
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.randn(head_dim, generator=generator))
            if bias:
                norm.bias.copy_(torch.randn(head_dim, generator=generator))
    return norms


def _reference(qkv: torch.Tensor, heads: int, q_norm: nn.LayerNorm, k_norm: nn.LayerNorm):
    """torch's path in float64: (b, heads, n, head_dim) q, k, v."""
    b, n, channels = qkv.shape
    q, k, v = qkv.view(b, n, 3, heads, channels // (3 * heads)).permute(2, 0, 3, 1, 4)
    q_norm64, k_norm64 = (
        nn.LayerNorm(norm.normalized_shape, bias=norm.bias is not None).double() for norm in (q_norm, k_norm)
    )
    q_norm64.load_state_dict(q_norm.state_dict())
    k_norm64.load_state_dict(k_norm.state_dict())
    return (q_norm64(q), k_norm64(k), v), [*q_norm64.parameters(), *k_norm64.parameters()]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "batch,points,heads,head_dim",
    # heads of 16: blocks of sixteen vectors, across rows, tails, and (2, 100, 3) a second task
    # starting inside a block's stride; other widths row by row
    [(2, 37, 4, 16), (2, 41, 3, 16), (2, 100, 3, 16), (1, 130, 2, 32), (3, 9, 3, 12)],
)
@pytest.mark.parametrize("bias", [True, False])
def test_q_k_v_and_every_gradient_match_float64(variant, batch, points, heads, head_dim, bias, monkeypatch):
    monkeypatch.setattr("processor.attention.qk_heads.native_kernel", lambda: load(variant))
    g = torch.Generator().manual_seed(batch * points + head_dim)
    q_norm, k_norm = _norms(head_dim, bias, g)
    qkv = (3 * torch.randn(batch, points, 3 * heads * head_dim, generator=g) + 1).requires_grad_()
    cotangents = [  # contiguous, point-major (as attention's own), and a broadcast one
        torch.randn(batch, heads, points, head_dim, generator=g),
        torch.randn(batch, points, heads, head_dim, generator=g).transpose(1, 2),
        torch.randn(1, heads, 1, head_dim, generator=g).expand(batch, heads, points, head_dim),
    ]

    got = fused_qk_heads(qkv, heads, q_norm, k_norm)
    params = [*q_norm.parameters(), *k_norm.parameters()]
    got_grads = torch.autograd.grad(got, [qkv, *params], cotangents)

    qkv64 = qkv.detach().double().requires_grad_()
    want, params64 = _reference(qkv64, heads, q_norm, k_norm)
    want_grads = torch.autograd.grad(want, [qkv64, *params64], [c.double() for c in cotangents])
    for name, a, b in zip("qkv", got, want):
        assert a.shape == b.shape
        assert_close(a.detach().numpy(), b.detach().numpy(), name, tol=RTOL)
    names = ["dqkv", "dq_weight", "dq_bias", "dk_weight", "dk_bias"] if bias else ["dqkv", "dq_weight", "dk_weight"]
    for name, a, b in zip(names, got_grads, want_grads):
        assert_close(a.numpy(), b.numpy(), name, tol=RTOL)


def test_q_and_k_are_laid_out_point_major_and_v_is_a_view_of_the_projection():
    q_norm, k_norm = _norms(16, True, torch.Generator().manual_seed(0))
    qkv = torch.randn(2, 10, 3 * 4 * 16)
    q, k, v = fused_qk_heads(qkv, 4, q_norm, k_norm)
    assert q.shape == (2, 4, 10, 16) and q.permute(0, 2, 1, 3).is_contiguous()  # merging heads is a view
    assert v.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()


def test_what_it_leaves_to_torch():
    qkv = torch.randn(1, 8, 3 * 2 * 16)
    q_norm, k_norm = _norms(16, True, torch.Generator().manual_seed(1))
    assert fused_qk_heads_serve(qkv, 2, q_norm, k_norm)
    assert not fused_qk_heads_serve(qkv, 2, nn.Identity(), nn.Identity())  # no norms: views are cheaper
    assert not fused_qk_heads_serve(qkv.double(), 2, q_norm, k_norm)
    assert not fused_qk_heads_serve(qkv, 2, q_norm, nn.LayerNorm(16, eps=1e-3))  # two norms' eps apart
    assert not fused_qk_heads_serve(qkv, 1, q_norm, k_norm)  # norms over 16 values, heads of 32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_qk_heads_serve(qkv, 2, q_norm, k_norm)


def test_a_second_derivative_through_it_is_refused():
    q_norm, k_norm = _norms(16, True, torch.Generator().manual_seed(2))
    qkv = torch.randn(1, 8, 3 * 2 * 16, requires_grad=True)
    q, k, v = fused_qk_heads(qkv, 2, q_norm, k_norm)
    (grad,) = torch.autograd.grad((q * k).sum(), qkv, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


@pytest.mark.parametrize("qk_norm_bias", [True, False])
def test_the_attention_layer_is_the_same_with_and_without_it(qk_norm_bias, monkeypatch):
    torch.manual_seed(3)
    layer = SelfAttention(32, 4, window_size=5, qk_norm=True, qk_norm_bias=qk_norm_bias, path="native")
    x = torch.randn(2, 50, 32, requires_grad=True)
    cotangent = torch.randn(2, 50, 32)
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(module_under_test, "fused_qk_heads_serve", lambda *args: False)
        out = layer(x)
        results.append((out, torch.autograd.grad(out, [x, *layer.parameters()], cotangent)))
    (out_fused, grads_fused), (out_torch, grads_torch) = results
    assert_close(out_fused.detach().numpy(), out_torch.detach().numpy(), "output", tol=RTOL)
    # k's bias shifts every score of a query alike, which softmax ignores: its gradient is rounding,
    # held to the scale of the input's gradient
    scale = float(grads_torch[0].abs().max())
    for (name, _), a, b in zip([("x", None), *layer.named_parameters()], grads_fused, grads_torch):
        assert_close(a.numpy(), b.numpy(), f"d{name}", floor=scale, tol=RTOL)
