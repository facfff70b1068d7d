"""Segment ids in the windowed kernel: equal to the dense definition, outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from processor.attention import dense_window_attention, sliding_window_attention


def _ids(n: int, batch: int, seed: int, max_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lengths = torch.randint(1, max_len, (n,), generator=g)
        rows.append(torch.repeat_interleave(torch.arange(n), lengths)[:n] % 3)  # ids recur in separate runs
    return torch.stack(rows)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize(
    "n_q, n_k, q_offset, window, block, id_batch",
    [
        (200, 200, 0, 1, 16, 2),
        (200, 200, 0, 9, 16, 1),
        (150, 190, 20, 12, 8, 2),  # queries inside a padded key block
        (90, 90, 0, 200, 16, 2),  # wider than the keys: per segment
        (120, 140, 10, None, None, 1),
    ],
)
def test_matches_the_dense_definition(dtype, tol, n_q, n_k, q_offset, window, block, id_batch):
    g = torch.Generator().manual_seed(n_q + n_k)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=dtype, requires_grad=True) for n in (n_q, n_k, n_k))
    ids = _ids(n_k, id_batch, n_q, 2 * (window or 10) + 3)
    out = sliding_window_attention(q, k, v, window, q_offset=q_offset, block_size=block, segment_ids=ids)
    cot = torch.randn(out.shape, generator=g, dtype=dtype)
    grads = torch.autograd.grad((out * cot).sum(), (q, k, v))
    ref = dense_window_attention(q, k, v, window, q_offset, segment_ids=ids)
    ref_grads = torch.autograd.grad((ref * cot).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"d{name}")


def test_one_segment_equals_no_ids():
    q, k, v = (torch.randn(1, 2, 100, 8, dtype=torch.float64) for _ in range(3))
    plain = sliding_window_attention(q, k, v, 7, block_size=16)
    one = sliding_window_attention(q, k, v, 7, block_size=16, segment_ids=torch.full((100,), 4))
    torch.testing.assert_close(one, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "ids, match",
    [(torch.zeros(50), "integer"), (torch.zeros(49, dtype=torch.long), "n_k"), (torch.zeros(3, 50).long(), "n_k")],
)
def test_bad_ids(ids, match):
    q = torch.randn(2, 2, 50, 8)
    with pytest.raises(ValueError, match=f"segment_ids.*{match}|{match}.*segment_ids"):
        sliding_window_attention(q, q, q, 4, segment_ids=ids)
