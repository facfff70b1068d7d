"""On a GPU: every CUDA attention path, forward and backward, against the float64 dense
reference, at fp32 and bf16 tolerances (``pytest -m cuda``; skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from processor.attention import dense_window_attention, sliding_window_attention
from processor.attention.dispatch import AttentionCall, choose_path, path_problem
from processor.attention.score_mods import ScoreMods, alibi_slopes
from processor.attention.scored import scored_window_attention

pytestmark = pytest.mark.cuda

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}  # of the largest value
GEOMETRIES = [  # n_q, left, right, window, batch, ids
    (4096, 0, 0, 256, 1, None),  # many 128-row tiles, full and partial
    (3000, 300, 200, 300, 2, None),  # q_offset into a halo-padded key block, ragged tiles
    (700, 0, 900, 1000, 1, None),  # a window wider than the queries: an edge rank
    (2048, 64, 64, 64, 2, "per_member"),
    (1500, 0, 0, 100, 1, "shared"),
]


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def _inputs(n_q, left, right, batch, ids, dtype):
    g = torch.Generator(device="cuda").manual_seed(n_q + left)
    n_k = left + n_q + right
    q = torch.randn(batch, 4, n_q, 64, generator=g, device="cuda", dtype=torch.float64)
    k, v = (torch.randn(batch, 4, n_k, 64, generator=g, device="cuda", dtype=torch.float64) for _ in range(2))
    segment_ids = None
    if ids is not None:
        rows = 1 if ids == "shared" else batch
        segment_ids = torch.randint(0, 4, (rows, n_k), generator=g, device="cuda").sort(dim=1).values
    low = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    return [t.requires_grad_() for t in (q, k, v)], low, segment_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["auto", "flex", "sdpa_blocks", "dense", "flash_attn"])
@pytest.mark.parametrize("n_q, left, right, window, batch, ids", GEOMETRIES)
def test_forward_and_backward_match_float64(path, dtype, n_q, left, right, window, batch, ids):
    exact, low, segment_ids = _inputs(n_q, left, right, batch, ids, dtype)
    call = AttentionCall.of(*low, window, left, ids is not None, 0.0)
    if path != "auto" and (problem := path_problem(path, call)) is not None:
        pytest.skip(problem)
    out = sliding_window_attention(*low, window, q_offset=left, segment_ids=segment_ids, path=path)
    ref = dense_window_attention(*exact, window, left, segment_ids=segment_ids)
    _assert_matches(out, low, ref, exact, dtype)


def _assert_matches(out, low, ref, exact, dtype):
    """``out`` of inputs ``low`` (``dtype``) against ``ref`` of the float64 ``exact``: the
    output and the gradients of q, k, v, within :data:`TOLERANCE`."""
    cotangent = torch.randn_like(ref)
    grads = torch.autograd.grad(out, low, cotangent.to(dtype))
    ref_grads = torch.autograd.grad(ref, exact, cotangent)
    tol = TOLERANCE[dtype]
    assert _relative_error(out, ref) <= tol, "output"
    for name, a, b in zip("qkv", grads, ref_grads):
        assert _relative_error(a, b) <= tol, f"d{name}"


def test_auto_takes_a_block_sparse_path_on_cuda():
    q = torch.randn(1, 4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert choose_path(AttentionCall.of(q, q, q, 128, 0, False, 0.0)) in ("flash_attn", "flex")


def test_flex_memory_grows_with_the_band_not_the_square():
    """Doubling N at a fixed window about doubles the peak memory of fwd+bwd (dense would quadruple)."""
    peaks = []
    for n in (16384, 32768):
        q, k, v = (torch.randn(1, 8, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = sliding_window_attention(q, k, v, 256, path="flex")
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v, out
    assert peaks[1] < 3 * peaks[0], f"peaks {peaks} bytes"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["flex", "scored"])
@pytest.mark.parametrize("n_q, left, right, window, batch, ids", GEOMETRIES[1:4])
def test_softcap_and_alibi_match_float64(path, dtype, n_q, left, right, window, batch, ids):
    """anemoi's softcap and ALiBi on the GPU: FlexAttention's score_mod and the scored path."""
    exact, low, segment_ids = _inputs(n_q, left, right, batch, ids, dtype)
    mods = ScoreMods(2.0, alibi_slopes(4, device="cuda"))
    out = sliding_window_attention(*low, window, q_offset=left, segment_ids=segment_ids, path=path, mods=mods)
    ids64 = None if segment_ids is None else segment_ids.long()
    ref = scored_window_attention(*exact, window, left, None, ids64, mods)  # float64: checked against formulas on CPU
    _assert_matches(out, low, ref, exact, dtype)
