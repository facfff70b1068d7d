"""Segment ids in sliding_window_attention: the dense definition, every path, and the semantics.

Query ``i`` (key position ``q_offset + i``) sees key ``j`` iff ``|q_offset + i - j| <= W`` and
``ids[q_offset + i] == ids[j]``; checked against :func:`dense_window_attention` for outputs
and the gradients of q, k and v, through the CPU banded kernel (clean and mixed blocks), the
SDPA-on-views path, the short and edge calls, and the per-segment path (every key in reach).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.attention import banded, dense_window_attention, sliding_window_attention
from tests.processor.attention.peak_memory import peak_bytes


def _runs(n: int, seed: int, short: int, long: int, recur: int | None = None) -> torch.Tensor:
    """``(n,)`` ids in contiguous runs, alternating short (< ``short``) and long (>= ``long``) ones;
    ``recur``: ids taken modulo it, so one id comes back in separate runs."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < n:
        if len(lengths) % 2:
            lengths.append(int(torch.randint(1, max(short, 2), (1,), generator=g)))
        else:
            lengths.append(int(torch.randint(long, 2 * long, (1,), generator=g)))
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:n]
    return ids % recur if recur else ids


def _ids(n: int, rows: int, seed: int, window: int | None, block: int | None) -> torch.Tensor:
    w, b = window or 16, block or 64
    return torch.stack([_runs(n, seed + r, short=w, long=3 * b, recur=3 if r else None) for r in range(rows)])


def _qkv(batch: int, heads: int, n_q: int, n_k: int, dim: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, heads, n, dim, generator=g, dtype=dtype, requires_grad=True) for n in (n_q, n_k, n_k)
    )


def _assert_matches_dense(q, k, v, window, ids, *, q_offset=0, block=None, tol=1e-10, path="auto") -> None:
    out = sliding_window_attention(q, k, v, window, q_offset=q_offset, block_size=block, segment_ids=ids, path=path)
    ref = dense_window_attention(q, k, v, window, q_offset, segment_ids=ids)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), cot)
    ref_grads = torch.autograd.grad(ref, (q, k, v), cot)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, n=name: f"d{n}: {m}")


CASES = [  # n_q, left, right, window, block, id rows
    (240, 0, 0, 1, 8, 1),
    (400, 0, 0, 9, 16, 2),
    (600, 0, 0, 20, 16, 1),
    (250, 30, 45, 12, 8, 2),  # queries inside a padded key block
    (200, 7, 0, 5, 16, 1),
    (90, 5, 9, 150, 16, 2),  # wider than the keys: per segment
    (120, 10, 20, None, None, 2),  # global within segments
    (120, 0, 0, None, None, 1),
]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("n_q, left, right, window, block, rows", CASES)
def test_matches_the_dense_definition(dtype, tol, n_q, left, right, window, block, rows):
    q, k, v = _qkv(2, 2, n_q, left + n_q + right, 8, dtype, n_q + left)
    ids = _ids(left + n_q + right, rows, n_q, window, block)
    _assert_matches_dense(q, k, v, window, ids, q_offset=left, block=block, tol=tol)


@pytest.mark.parametrize("n_q, left, right, window, block, rows", [c for c in CASES if c[3] is not None])
def test_sdpa_on_views_path_matches_the_dense_definition(n_q, left, right, window, block, rows):
    """The path bf16 and dropout take, forced on CPU in float64."""
    q, k, v = _qkv(2, 2, n_q, left + n_q + right, 4, torch.float64, n_q)
    ids = _ids(left + n_q + right, rows, n_q + 1, window, block)
    _assert_matches_dense(q, k, v, window, ids, q_offset=left, block=block, path="sdpa_blocks")


def test_bfloat16_follows_the_definition_loosely():
    q, k, v = _qkv(2, 2, 160, 160, 16, torch.float64, 3)
    ids = _ids(160, 2, 3, 6, 16)
    out = sliding_window_attention(*(t.detach().bfloat16() for t in (q, k, v)), 6, block_size=16, segment_ids=ids)
    ref = dense_window_attention(q.detach(), k.detach(), v.detach(), 6, segment_ids=ids)
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("mask_blocks", [1, 3, 1000])
def test_mixed_blocks_in_pieces_and_all_at_once(monkeypatch, mask_blocks):
    """Per-block id masks built for 1 or 3 blocks at a time, or for every mixed block in one go."""
    block, window = 8, 11
    band = (2 * 2 + 1) * block  # reach = ceil(11 / 8) = 2 blocks
    monkeypatch.setattr(banded, "_MIXED_MASK_BYTES", mask_blocks * block * band * 8)
    q, k, v = _qkv(2, 2, 240, 240, 4, torch.float64, 5)
    _assert_matches_dense(q, k, v, window, _ids(240, 2, 5, window, block), block=block)


@settings(max_examples=30, deadline=None)
@given(
    n_q=st.integers(1, 160),
    left=st.integers(0, 30),
    right=st.integers(0, 30),
    window=st.one_of(st.none(), st.integers(0, 60)),
    block=st.one_of(st.none(), st.integers(1, 24)),
    rows=st.integers(1, 2),
    longest=st.integers(1, 60),
    views=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_layouts_match_the_dense_definition(n_q, left, right, window, block, rows, longest, views, seed):
    n_k = left + n_q + right
    g = torch.Generator().manual_seed(seed)
    runs = [torch.repeat_interleave(torch.arange(n_k), torch.randint(1, longest + 1, (n_k,), generator=g))[:n_k] % 4]
    ids = torch.stack(runs * rows) if rows == 1 else torch.stack([runs[0], runs[0].flip(0)])
    q, k, v = _qkv(2, 2, n_q, n_k, 4, torch.float64, seed)
    path = "sdpa_blocks" if views and window is not None else "auto"
    _assert_matches_dense(q, k, v, window, ids, q_offset=left, block=block, path=path)


def test_dropout_sees_only_its_own_segment():
    """The dropout path (SDPA on views): changing another segment's keys and values changes nothing."""
    q, k, v = (t.detach().float() for t in _qkv(1, 2, 300, 300, 8, torch.float64, 11))
    ids = (torch.arange(300) >= 140).long()
    outs = []
    for shift in (0.0, 3.0):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, 140:] += shift
        v2[:, :, 140:] -= shift
        torch.manual_seed(0)
        outs.append(sliding_window_attention(q, k2, v2, 20, block_size=16, dropout_p=0.3, segment_ids=ids))
    torch.testing.assert_close(outs[0][:, :, :140], outs[1][:, :, :140], rtol=0, atol=0)
    assert not torch.allclose(outs[0][:, :, 140:], outs[1][:, :, 140:])


def test_two_segments_equal_each_alone():
    q, k, v = (t.detach() for t in _qkv(2, 3, 500, 500, 8, torch.float64, 7))
    ids = torch.cat([torch.zeros(180, dtype=torch.long), torch.ones(320, dtype=torch.long)])
    both = sliding_window_attention(q, k, v, 24, block_size=16, segment_ids=ids)
    alone = [
        sliding_window_attention(q[:, :, s], k[:, :, s], v[:, :, s], 24, block_size=16)
        for s in (
            slice(0, 180),
            slice(180, 500),
        )
    ]
    torch.testing.assert_close(both, torch.cat(alone, dim=2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window, block", [(12, 16), (None, None), (300, None)])
def test_one_id_everywhere_equals_no_ids(window, block):
    q, k, v = _qkv(2, 2, 300, 300, 8, torch.float64, 9)
    plain = sliding_window_attention(q, k, v, window, block_size=block)
    one = sliding_window_attention(q, k, v, window, block_size=block, segment_ids=torch.full((1, 300), 4))
    torch.testing.assert_close(one, plain, rtol=1e-12, atol=1e-12)
    cot = torch.randn_like(plain)
    for a, b in zip(torch.autograd.grad(one, (q, k, v), cot), torch.autograd.grad(plain, (q, k, v), cot)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "ids, match",
    [
        (torch.zeros(50), "integer"),
        (torch.zeros(50, dtype=torch.bool), "integer"),
        (torch.zeros(49, dtype=torch.long), "n_k"),
        (torch.zeros(3, 50, dtype=torch.long), "n_k"),
        (torch.zeros(2, 1, 50, dtype=torch.long), "n_k"),
        (torch.zeros(50, dtype=torch.long, device="meta"), "device|on meta"),
    ],
)
def test_bad_ids(ids, match):
    q = torch.randn(2, 2, 50, 8)
    with pytest.raises(ValueError, match=f"segment_ids.*({match})"):
        sliding_window_attention(q, q, q, 4, segment_ids=ids)


def test_peak_memory_has_no_square_mask():
    """N = 20000 with 200 segments, banded (W = 128) and global within segments: an N x N
    float mask alone would be 1.6 GB."""
    setup = """
        n = 20000
        q, k, v = (torch.randn(1, 2, n, 8, requires_grad=True) for _ in range(3))
        ids = torch.arange(n) // 100
    """
    work = """
        for window in (128, None):
            sliding_window_attention(q, k, v, window, segment_ids=ids).sum().backward()
    """
    peak = peak_bytes(setup, work)
    assert peak < 200e6, f"peak {peak / 1e6:.0f} MB"
