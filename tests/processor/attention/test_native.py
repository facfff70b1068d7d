"""The fused C++ CPU kernel against dense float64 attention (fp32 at 1e-5, bf16 at its own error),
each ISA variant built here (AVX-512, AVX2, scalar: the code paths users' CPUs take), its
bfloat16 products (oneDNN's BRGeMM, where the host runs them) to bfloat16's error, and the
``native`` build against the Python banded kernel on random geometries: outputs, log-sum-exp
and every gradient. Skipped where the kernel is not built
(``python -m processor.attention.build_kernel``)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.attention import dense_window_attention, sliding_window_attention
from processor.attention.native import (
    NativeBandAttention,
    bf16_products_here,
    native_available,
    native_backward,
    native_forward,
)
from processor.attention.native_build import built_variants, load

pytestmark = pytest.mark.skipif(not native_available(), reason="the fused CPU kernel is not built")
VARIANTS = built_variants() or ["native"]
needs_bf16_products = pytest.mark.skipif(
    not native_available() or not bf16_products_here(),
    reason="no bfloat16 BRGeMM with native bf16 here (AVX512-BF16 or AMX)",
)


def _qkv(batch, heads, n_q, n_k, dim, dtype, seed):
    """Point-major ``(batch, heads, points, head_dim)`` views, as the processor makes them."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        return torch.randn(batch, n, heads, dim, generator=g).transpose(1, 2).to(dtype).requires_grad_()

    return make(n_q), make(n_k), make(n_k)


def _ids(batch, n_k, seed, rate=0.03):
    g = torch.Generator().manual_seed(seed)
    return torch.cumsum((torch.rand(batch, n_k, generator=g) < rate).long(), dim=1)


def _cotangent(out):
    """A gradient for ``out`` laid out like it, the same whatever ran before (a seeded generator,
    not the global one: the bf16 bounds hold for the seeded draws, not for every draw)."""
    g = torch.Generator().manual_seed(out.numel())
    return torch.empty_like(out).normal_(generator=g)


def _variant_call(q, k, v, window, q_offset, scale, ids, variant, cotangent=None, bf16_products=None):
    """``variant``'s output and, given a cotangent, its ``(dq, dk, dv)``; ``native`` through its
    autograd function (which decides on bfloat16 products itself)."""
    if variant == "native" and bf16_products is None:
        out = NativeBandAttention.apply(q, k, v, window, q_offset, scale, ids)
        cotangent = _cotangent(out) if cotangent is None else cotangent
        return out, torch.autograd.grad(out, (q, k, v), cotangent), cotangent
    q, k, v = (t.detach() for t in (q, k, v))
    products = {"variant": variant, "bf16_products": bf16_products}
    out, lse = native_forward(q, k, v, window, q_offset, scale, ids, **products)
    cotangent = _cotangent(out) if cotangent is None else cotangent
    grads = native_backward(cotangent, q, k, v, out, lse, window, q_offset, scale, ids, **products)
    return out, grads, cotangent


def _against_dense(q, k, v, window, q_offset, ids, rtol, variant="native", bf16_products=None):
    scale = 1 / math.sqrt(q.shape[-1])
    out, grads, cotangent = _variant_call(q, k, v, window, q_offset, scale, ids, variant, None, bf16_products)
    assert out.dtype == q.dtype and out.stride() == q.stride()  # point-major in, point-major out
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = dense_window_attention(q64, k64, v64, window, q_offset, ids)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), cotangent.double())
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
        error = float((got.double() - want).abs().max() / max(float(want.abs().max()), 1.0))  # dq is 0 at W = 0
        assert error < rtol, f"{name}: relative error {error:.2e}"


def test_the_variants_have_the_widths_they_are_named_for():
    """``native`` is this host's widest; ``avx2`` and ``scalar``, where built, are what they say."""
    for variant in VARIANTS:
        isa = load(variant).isa()
        assert isa == {"native": isa, "avx2": "avx2", "scalar": "scalar"}[variant]
    if torch.backends.cpu.get_cpu_capability() == "AVX512" and "native" in VARIANTS:
        assert load("native").isa() == "avx512"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [8, 16, 24, 32, 48, 64, 128])
@pytest.mark.parametrize(
    "n_q,left,right,window,with_ids",
    [(300, 0, 0, 20, False), (257, 60, 83, 70, True), (130, 0, 0, 500, True), (64, 5, 0, 0, False)],
)
def test_fp32_matches_dense_float64(variant, dim, n_q, left, right, window, with_ids):
    """Head dims 8-128 (through the register-tiled products where the build's vectors serve
    them, AVX2 8-32 and AVX-512 16-64, else BLAS), windows of 0, inside and wider than a tile (64
    rows), edges, queries in a halo-padded key block (``q_offset``), segment ids; each variant."""
    q, k, v = _qkv(2, 2, n_q, left + n_q + right, dim, torch.float32, dim)
    ids = _ids(2, left + n_q + right, dim) if with_ids else None
    _against_dense(q, k, v, window, left, ids, rtol=1e-5, variant=variant)


def _native_windows(monkeypatch) -> list[int]:
    """The windows the kernel is called with from now on (it still runs)."""
    from processor.attention import kernel

    calls: list[int] = []
    real = kernel.NativeBandAttention.apply
    monkeypatch.setattr(kernel.NativeBandAttention, "apply", lambda *a: calls.append(a[3]) or real(*a))
    return calls


@pytest.mark.parametrize(
    "n_q,left,right,with_ids,path",
    [
        (200, 0, 0, False, "auto"),
        (120, 37, 51, False, "auto"),
        (120, 37, 51, True, "native"),
        (33, 0, 90, True, "native"),
    ],
)
def test_a_global_window_runs_the_kernel_over_every_key(monkeypatch, n_q, left, right, with_ids, path):
    """``window=None`` under ``auto`` (with segment ids: forced) takes the kernel with a window of
    all the keys (a rank's queries inside the whole key block), and matches dense float64 to 1e-5."""
    calls = _native_windows(monkeypatch)
    n_k = left + n_q + right
    q, k, v = _qkv(2, 3, n_q, n_k, 16, torch.float32, n_q)
    ids = _ids(2, n_k, n_q) if with_ids else None
    out = sliding_window_attention(q, k, v, None, q_offset=left, segment_ids=ids, path=path)
    assert calls == [n_k]
    cotangent = _cotangent(out)
    grads = torch.autograd.grad(out, (q, k, v), cotangent)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = dense_window_attention(q64, k64, v64, None, left, ids)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), cotangent.double())
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
        error = float((got.double() - want).abs().max() / float(want.abs().max()))
        assert error < 1e-5, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize(
    "n,dtype,dropout,with_ids",
    [
        (20, torch.float32, 0.0, False),
        (200, torch.float64, 0.0, False),
        (200, torch.float32, 0.1, False),
        (200, torch.float32, 0.0, True),
    ],
)
def test_a_global_window_runs_sdpa_where_the_kernel_does_not_pay_or_cannot_run(
    monkeypatch, n, dtype, dropout, with_ids
):
    """Under ``auto``: under 32 keys, fp64, attention dropout and segment ids take SDPA."""
    calls = _native_windows(monkeypatch)
    q, k, v = _qkv(1, 2, n, n, 16, dtype, n)
    ids = _ids(1, n, n, rate=0.1) if with_ids else None
    sliding_window_attention(q, k, v, None, dropout_p=dropout, segment_ids=ids).sum().backward()
    assert calls == []


def test_a_global_window_in_bf16_runs_the_kernel_to_bf16_error(monkeypatch):
    calls = _native_windows(monkeypatch)
    q, k, v = _qkv(2, 2, 150, 150, 32, torch.bfloat16, 7)
    out = sliding_window_attention(q, k, v, None)
    assert calls == [150] and out.dtype == torch.bfloat16
    ref = dense_window_attention(*(t.detach().double() for t in (q, k, v)), None, 0, None)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_matches_dense_to_its_own_error(variant):
    q, k, v = _qkv(1, 2, 200, 260, 32, torch.bfloat16, 1)
    _against_dense(q, k, v, 33, 30, _ids(1, 260, 1), rtol=2e-2, variant=variant)


@needs_bf16_products
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [16, 32, 48, 64, 128])
@pytest.mark.parametrize(
    "n_q,left,right,window,with_ids",
    [(300, 0, 0, 20, False), (257, 60, 83, 70, True), (131, 0, 0, 500, True), (65, 5, 0, 0, False)],
)
def test_bf16_products_match_dense_float64_to_bf16_error(variant, dim, n_q, left, right, window, with_ids):
    """The products in bfloat16 (oneDNN's BRGeMM) with float32 softmax and accumulation: fp32
    inputs, each variant (the products are oneDNN's on every build; the row passes are each
    build's), head dims 16-128 (128: two blocks of the head dim), odd tiles, edges, offsets, ids.
    3e-2 of the largest term: dq and dk come from dS = P (dP - D), a difference of terms of the
    size of dO V (at W = 0 they cancel exactly, and what is left is bfloat16's error of them)."""
    q, k, v = _qkv(2, 2, n_q, left + n_q + right, dim, torch.float32, dim)
    ids = _ids(2, left + n_q + right, dim) if with_ids else None
    _against_dense(q, k, v, window, left, ids, rtol=3e-2, variant=variant, bf16_products=True)


@needs_bf16_products
def test_bf16_products_are_what_bf16_inputs_get_and_differ_from_fp32_products():
    """bf16 inputs take the bfloat16 products where the host runs them (the autograd function as
    the processor calls it); their results are within bfloat16's error of the float32 products
    on the same inputs (relative RMS), and not equal to them (the bf16 path did run)."""
    q, k, v = _qkv(1, 4, 200, 200, 32, torch.bfloat16, 5)
    out = NativeBandAttention.apply(q, k, v, 40, 0, 32**-0.5, None)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    q32, k32, v32 = (t.detach().float() for t in (q, k, v))
    for products in (True, False):
        got, got_grads, _ = _variant_call(
            q32, k32, v32, 40, 0, 32**-0.5, None, "native", torch.ones(out.shape), bf16_products=products
        )
        results = [(got.to(out.dtype), out), *((a.to(b.dtype), b) for a, b in zip(got_grads, grads))]
        if products:  # the same computation as the autograd function's, to its output's rounding
            for a, b in results:
                torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
        rms = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in results)
        assert rms < 1e-2
    fp32_out, _ = native_forward(q32, k32, v32, 40, 0, 32**-0.5, None, bf16_products=False)
    bf16_out, _ = native_forward(q32, k32, v32, 40, 0, 32**-0.5, None, bf16_products=True)
    assert float((bf16_out - fp32_out).abs().max()) > 1e-4


@needs_bf16_products
def test_where_onednn_refuses_the_bf16_products_the_kernel_warns_and_computes_in_fp32():
    """With mkldnn turned off, torch's BRGeMM refuses (as oneDNN would a shape it has no kernel
    for): the call warns once and returns the float32 products' results, and so do later calls.
    In a fresh process: the refusal holds for the rest of it."""
    script = """
import warnings, torch
from processor.attention.native import native_backward, native_forward
q, k, v = (torch.randn(1, 2, 100, 32) for _ in range(3))
fp32 = native_forward(q, k, v, 10, 0, 0.2, None, bf16_products=False)
with warnings.catch_warnings(record=True) as caught, torch.backends.mkldnn.flags(enabled=False):
    warnings.simplefilter("always")
    out, lse = native_forward(q, k, v, 10, 0, 0.2, None, bf16_products=True)
    grads = native_backward(torch.ones_like(q), q, k, v, out, lse, 10, 0, 0.2, None, bf16_products=True)
refusals = [w for w in caught if "refused the bf16 products" in str(w.message)]
assert len(refusals) == 1 and "Brgemm" in str(refusals[0].message), [str(w.message) for w in caught]
assert torch.equal(out, fp32[0]) and torch.equal(lse, fp32[1])
want = native_backward(torch.ones_like(q), q, k, v, out, lse, 10, 0, 0.2, None, bf16_products=False)
assert all(torch.equal(a, b) for a, b in zip(grads, want))
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_a_query_that_reaches_no_key_gets_zero_and_minus_infinity():
    """The ring's partial blocks: queries whose window misses every key of the block."""
    q, k, v = _qkv(1, 1, 10, 50, 16, torch.float32, 2)
    out, lse = native_forward(q.detach(), k.detach(), v.detach(), 3, 45, 0.25, None)  # keys 42..57: 42..49 exist
    reached = torch.arange(10) + 45 - 3 < 50
    assert torch.isinf(lse[0, 0, ~reached]).all() and (out[0, 0, ~reached] == 0).all()
    assert torch.isfinite(lse[0, 0, reached]).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [16, 64, 128])  # the tiled products (64: AVX-512's) and BLAS
@pytest.mark.parametrize(
    "products", [False, pytest.param(True, marks=needs_bf16_products)], ids=["fp32_products", "bf16_products"]
)
def test_a_nan_shows_in_every_output_and_gradient_that_sees_it(variant, dim, products):
    """A diverged input must show: a row of NaN scores must not read as a row of masked keys.
    Outputs are NaN exactly where a NaN query or key is seen; gradients NaN there too (and,
    through the tiles' masked zeros times NaN, possibly beside it, as in any dense product),
    finite in a tile of queries that sees no NaN."""
    q, k, v = _qkv(1, 1, 300, 300, dim, torch.float32, 3)
    with torch.no_grad():
        q[0, 0, 5, 0] = math.nan  # query 5: its whole row of scores
        k[0, 0, 200, 0] = math.nan  # key 200: one score of each query within 20 of it
    out, grads, _ = _variant_call(q, k, v, 20, 0, dim**-0.5, None, variant, torch.ones(1, 1, 300, dim), products)
    dq = grads[0][0, 0]
    seen = torch.zeros(300, dtype=torch.bool)
    seen[5] = True
    seen[180:221] = True
    assert out[0, 0, seen].isnan().all() and out[0, 0, ~seen].isfinite().all()
    assert dq[seen].isnan().all() and dq[64:128].isfinite().all()


@needs_bf16_products
@pytest.mark.parametrize("dim", [16, 64, 128])
def test_bf16_products_keep_a_nan_key_to_the_tiles_that_reach_it(dim):
    """The bf16 products pad a chunk's keys to blocks of 64; a NaN key just past a tile's reach
    (key 170: queries 64-127 reach keys up to 147, padded to 191) must not reach that tile's dq
    through the padding, nor the dk and dv of keys past the chunk of the queries that see it
    (150-190: their tile's chunk ends at key 211, padded to 255). Within a chunk, masked zeros
    times NaN show as in the fp32 products and any dense product."""
    q, k, v = _qkv(1, 1, 300, 300, dim, torch.float32, 4)
    q, k, v = (t.detach() for t in (q, k, v))
    k[0, 0, 170, 0] = math.nan
    out, (dq, dk, dv), _ = _variant_call(q, k, v, 20, 0, dim**-0.5, None, "native", torch.ones(1, 1, 300, dim), True)
    out, dq, dk, dv = (t[0, 0] for t in (out, dq, dk, dv))
    seen = torch.zeros(300, dtype=torch.bool)
    seen[150:191] = True
    assert out[seen].isnan().all() and out[~seen].isfinite().all()
    assert dq[64:128].isfinite().all()
    assert dk[:64].isfinite().all() and dk[212:].isfinite().all() and dv[212:].isfinite().all()
    assert dk[150:191].isnan().any()


@settings(max_examples=40, deadline=None)
@given(
    n_q=st.integers(1, 260),
    left=st.integers(0, 70),
    right=st.integers(0, 70),
    window=st.integers(0, 150),
    dim=st.sampled_from([16, 24, 32]),
    ids=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_geometries_match_the_python_kernel(n_q, left, right, window, dim, ids, seed):
    """Against ``sdpa_blocks`` (the Python kernel that takes any geometry) in fp32."""
    n_k = left + n_q + right
    q, k, v = _qkv(1, 2, n_q, n_k, dim, torch.float32, seed)
    segment_ids = _ids(1, n_k, seed, rate=0.05) if ids else None
    out = sliding_window_attention(q, k, v, window, q_offset=left, segment_ids=segment_ids, path="native")
    ref = sliding_window_attention(q, k, v, window, q_offset=left, segment_ids=segment_ids, path="sdpa_blocks")
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-6)
    cotangent = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), cotangent), torch.autograd.grad(ref, (q, k, v), cotangent)):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
