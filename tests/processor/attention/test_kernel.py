"""The O(N·W) kernel against dense masked attention, forward and backward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.attention import dense_window_attention, sliding_window_attention
from tests.processor.attention.peak_memory import peak_bytes


def _qkv(batch: int, heads: int, n_q: int, n_k: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(batch, heads, n, dim, generator=g, dtype=torch.float64, requires_grad=True)  # noqa: E731
    return make(n_q), make(n_k), make(n_k)


def _assert_same_as_dense(q, k, v, window, q_offset=0, block_size=None, path="auto") -> None:
    out = sliding_window_attention(q, k, v, window, q_offset=q_offset, block_size=block_size, path=path)
    ref = dense_window_attention(q, k, v, window, q_offset)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    cotangent = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), cotangent)
    ref_grads = torch.autograd.grad(ref, (q, k, v), cotangent)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"d{n}: {m}")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    window=st.one_of(st.none(), st.integers(0, 80)),
    heads=st.integers(1, 3),
    dim=st.sampled_from([1, 4, 8]),
    batch=st.integers(1, 2),
    block=st.one_of(st.none(), st.integers(1, 40)),
    seed=st.integers(0, 2**16),
)
def test_matches_dense(n, window, heads, dim, batch, block, seed):
    q, k, v = _qkv(batch, heads, n, n, dim, seed)
    _assert_same_as_dense(q, k, v, window, block_size=block)


@settings(max_examples=40, deadline=None)
@given(
    n_q=st.integers(1, 200),
    left=st.integers(0, 50),
    right=st.integers(0, 50),
    window=st.integers(0, 60),
    block=st.one_of(st.none(), st.integers(1, 32)),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_with_query_offset(n_q, left, right, window, block, seed):
    """Local queries inside a halo-padded key block, as shard_sequence calls it."""
    q, k, v = _qkv(1, 2, n_q, left + n_q + right, 4, seed)
    _assert_same_as_dense(q, k, v, window, q_offset=left, block_size=block)


def test_float32_and_window_zero_is_identity_on_values():
    q, k, v = (t.detach().float() for t in _qkv(1, 2, 50, 50, 8, 0))
    torch.testing.assert_close(sliding_window_attention(q, k, v, 0), v)


@pytest.mark.parametrize(
    "shapes,message",
    [
        (((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 3)), "do not match"),
        (((2, 5, 4), (2, 5, 4), (2, 5, 4)), "batch, heads, points, head_dim"),
        (((1, 2, 6, 4), (1, 2, 5, 4), (1, 2, 5, 4)), "exceed"),
    ],
)
def test_bad_shapes(shapes, message):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        sliding_window_attention(q, k, v, 2)


def test_negative_window():
    x = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(x, x, x, -1)


def test_peak_memory_scales_with_window_not_square():
    """o96 size (N = 40320), W = 512, 8 heads x 16: fwd+bwd peak stays a few N·W·heads floats.

    Dense N x N scores would need 8 * 40320^2 * 4 B = 52 GB; measured here ~0.4-0.6 GB.
    """
    peak = peak_bytes(
        "q, k, v = (torch.randn(1, 8, 40320, 16, requires_grad=True) for _ in range(3))",
        "sliding_window_attention(q, k, v, 512).sum().backward()",
    )
    n_w_heads_floats = 40320 * 512 * 8 * 4
    assert peak < 2 * n_w_heads_floats, f"peak {peak / 1e9:.2f} GB, N*W*heads*4 B = {n_w_heads_floats / 1e9:.2f} GB"


@pytest.mark.parametrize("path", ["banded", "sdpa_blocks", "dense"])
@pytest.mark.parametrize(
    "n,window,block,left,right,batch", [(200, 17, 8, 0, 0, 2), (150, 30, 16, 25, 40, 1), (90, 9, 4, 9, 0, 1)]
)
def test_every_cpu_training_path_matches_dense(path, n, window, block, left, right, batch):
    """The CPU banded kernel, the SDPA-on-views path that bf16 and dropout take, and the one
    masked call (anemoi's approach), each forced, agree with dense attention, gradients included."""
    q, k, v = _qkv(batch, 2, n, left + n + right, 4, 0)
    _assert_same_as_dense(q, k, v, window, q_offset=left, block_size=block, path=path)
