"""Block-by-block attention merged by log-sum-exp equals attention over every key, with gradients."""

from __future__ import annotations

import pytest
import torch

import processor.attention.partial as partial
from processor.attention.native import native_available
from processor.attention.partial import BlockPair, merge_partial, partial_attention, partial_attention_backward
from processor.attention.reference import dense_window_attention


def _blocks(cuts: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in zip(cuts, cuts[1:])]


def _pair(qa: int, qb: int, ka: int, kb: int, window: int | None, ids: torch.Tensor | None) -> BlockPair:
    if ids is None:
        return BlockPair(qa, ka, window)
    return BlockPair(qa, ka, window, ids[:, qa:qb], ids[:, ka:kb])


def blockwise(q, k, v, cuts, window, ids=None):
    """Each query block over every key block (its own first), merged; then every block's
    backward of ``sum(out * g)`` from the merged out and lse. Returns out, (dq, dk, dv), g."""
    blocks = _blocks(cuts)
    outs, lses = [], []
    for qa, qb in blocks:
        out = lse = None
        for ka, kb in [(qa, qb)] + [b for b in blocks if b != (qa, qb)]:
            o, s = partial_attention(q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb], _pair(qa, qb, ka, kb, window, ids))
            if out is None:
                out, lse = o.clone(), s.clone()
            else:
                merge_partial(out, lse, o, s)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    for qa, qb in blocks:
        for ka, kb in blocks:
            rows, keys = slice(qa, qb), slice(ka, kb)
            dq, dk, dv = partial_attention_backward(
                g[:, :, rows],
                q[:, :, rows],
                k[:, :, keys],
                v[:, :, keys],
                out[:, :, rows],
                lse[:, :, rows],
                _pair(qa, qb, ka, kb, window, ids),
            )
            grads[0][:, :, rows] += dq
            grads[1][:, :, keys] += dk
            grads[2][:, :, keys] += dv
    return out, grads, g


CASES = [
    dict(window=None, cuts=[0, 13, 30, 31, 60]),
    dict(window=3, cuts=[0, 13, 30, 31, 60]),
    dict(window=20, cuts=[0, 13, 30, 31, 60]),
    dict(window=45, cuts=[0, 0, 22, 60]),
    dict(window=7, cuts=[0, 13, 30, 31, 60], ids=True),
    dict(window=None, cuts=[0, 25, 60], ids=True),
]


PATHS = ["fused", "explicit", "native"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[f"W{c['window']}-ids{c.get('ids', False)}" for c in CASES])
def test_blockwise_matches_dense(monkeypatch, case: dict, path: str) -> None:
    """float64 through PyTorch's fused kernel or the explicit softmax (GPUs, low precision) at
    1e-10; fp32 through the C++ kernel (the CPU's own) at 1e-5 of the largest value."""
    if path == "explicit":
        monkeypatch.setattr(partial, "_fused", lambda q, modded: False)
    if path == "native" and not native_available():
        pytest.skip("the fused CPU kernel is not built")
    dtype, tolerance = (torch.float32, 1e-5) if path == "native" else (torch.float64, 1e-10)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 60, 8, generator=g, dtype=torch.float64) for _ in range(3))
    ids = torch.randint(0, 3, (2, 60), generator=g).sort(1).values if case.get("ids") else None
    out, grads, cotangent = blockwise(*(t.to(dtype) for t in (q, k, v)), case["cuts"], case["window"], ids)

    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    expected = dense_window_attention(q, k, v, case["window"], segment_ids=ids)
    (expected * cotangent.double()).sum().backward()
    for name, got, want in zip(["out", "dq", "dk", "dv"], [out, *grads], [expected, q.grad, k.grad, v.grad]):
        error = float((got.double() - want.detach()).abs().max() / want.abs().max())
        assert error < tolerance, f"{path} {name}: relative error {error:.1e}"


def test_a_block_out_of_reach_contributes_nothing() -> None:
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    out, lse = partial_attention(q, k, v, BlockPair(q_start=0, k_start=20, window=5))
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_rows_whose_keys_all_have_other_ids_get_minus_infinity() -> None:
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    pair = BlockPair(0, 4, None, q_ids=torch.tensor([[0, 0, 1, 1]]), k_ids=torch.tensor([[1, 1, 2, 2]]))
    out, lse = partial_attention(q, k, v, pair)
    assert torch.all(lse[..., :2] == float("-inf")) and torch.all(out[..., :2, :] == 0)
    assert torch.all(torch.isfinite(lse[..., 2:]))
