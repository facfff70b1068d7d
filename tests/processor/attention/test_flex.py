"""The FlexAttention path: its block-sparse band (checked tile by tile against the dense mask),
and its compiled CPU forward against the dense reference (torch has no CPU backward for it;
``pytest -m cuda`` checks the backward on a GPU)."""

from __future__ import annotations

import pytest
import torch

from processor import TransformerProcessor
from processor.attention import band_mask, dense_window_attention, sliding_window_attention
from processor.attention.flex import band_tiles, flex_available

pytestmark = pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")


def _tiles_from_dense(n_q, n_k, window, q_offset, block, split_full):
    """Brute force: each (query block, key block) tile of the dense band mask, classified."""
    mask = band_mask(n_q, n_k, window, q_offset)
    partial, full = [], []
    for i in range(0, n_q, block):
        row_partial, row_full = [], []
        for j in range(0, n_k, block):
            tile = mask[i : i + block, j : j + block]
            whole = tile.all() and tile.shape == (block, block) and split_full
            if whole:
                row_full.append(j // block)
            elif tile.any():
                row_partial.append(j // block)
        partial.append(row_partial)
        full.append(row_full)
    return partial, full


def _listed(counts, indices):
    return [indices[0, 0, r, : int(c)].tolist() for r, c in enumerate(counts[0, 0])]


@pytest.mark.parametrize(
    "n_q, n_k, window, q_offset, block",
    [
        (64, 64, 5, 0, 8),
        (64, 64, 0, 0, 8),
        (61, 75, 9, 7, 8),  # ragged blocks, queries inside a padded key block
        (40, 200, 300, 100, 16),  # a window wider than everything: every tile
        (33, 33, 16, 0, 4),
        (10, 400, 3, 390, 16),  # the last queries of a long key block (an edge rank)
        (128, 128, 20, 0, 128),  # one tile
    ],
)
@pytest.mark.parametrize("split_full", [True, False])
def test_tiles_are_the_dense_masks_tiles(n_q, n_k, window, q_offset, block, split_full):
    kv_num, kv_idx, full_num, full_idx = band_tiles(n_q, n_k, window, q_offset, block, "cpu", split_full)
    partial, full = _tiles_from_dense(n_q, n_k, window, q_offset, block, split_full)
    assert _listed(kv_num, kv_idx) == partial
    assert _listed(full_num, full_idx) == full
    assert kv_idx.shape[-1] == -(-n_k // block)  # BlockMask's layout: one slot per key block


CASES = [  # n_q, left, right, window, batch, ids
    (300, 0, 0, 17, 1, None),
    (300, 25, 40, 30, 2, "shared"),  # q_offset into a halo-padded key block
    (129, 128, 3, 200, 2, "per_member"),  # a window wider than the queries
    # Each shape compiles anew (about 5 s cold): these two in the slow tier.
    pytest.param(257, 0, 0, 0, 1, None, marks=pytest.mark.slow),  # each query sees itself only
    pytest.param(640, 100, 0, 128, 1, "shared", marks=pytest.mark.slow),  # an edge rank: halo on one side
]


@pytest.mark.parametrize("n_q, left, right, window, batch, ids", CASES)
def test_cpu_forward_matches_the_dense_reference(n_q, left, right, window, batch, ids):
    n_k = left + n_q + right
    g = torch.Generator().manual_seed(n_q + window)
    q = torch.randn(batch, 2, n_q, 16, generator=g)
    k, v = (torch.randn(batch, 2, n_k, 16, generator=g) for _ in range(2))
    segment_ids = None
    if ids is not None:
        rows = 1 if ids == "shared" else batch
        segment_ids = torch.randint(0, 3, (rows, n_k), generator=g).sort(dim=1).values  # contiguous runs
    with torch.no_grad():
        out = sliding_window_attention(q, k, v, window, q_offset=left, segment_ids=segment_ids, path="flex")
    ref = dense_window_attention(q, k, v, window, left, segment_ids=segment_ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_processor_infers_through_flex_as_through_the_default():
    torch.manual_seed(0)
    settings = dict(num_layers=2, num_channels=64, num_heads=4, window_size=40, qk_norm=True)
    default = TransformerProcessor(**settings)
    flex = TransformerProcessor(**settings, attention_path="flex")
    flex.load_state_dict(default.state_dict())
    x = torch.randn(1, 500, 64)
    with torch.no_grad():
        torch.testing.assert_close(flex(x), default(x), rtol=1e-5, atol=1e-5)
