"""Ring passes: the schedule (pure arithmetic) and ring attention on local gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from processor.attention.reference import dense_window_attention
from processor.distributed import CommCounter, ShardLayout, Transport, shard_sizes
from processor.distributed.ring import RingPlan, blocks_meet, reaches_beyond_neighbours, ring_attention


@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=7), window=st.one_of(st.none(), st.integers(0, 70)))
def test_plan_pairs_every_meeting_block_once_and_both_sides_agree(sizes, window):
    plans = [RingPlan.build(ShardLayout(tuple(sizes), r), window) for r in range(len(sizes))]
    for r, plan in enumerate(plans):
        assert len(set(plan.partners)) == len(plan.partners)
        expected = {p for p in range(len(sizes)) if p != r and blocks_meet(ShardLayout(tuple(sizes), r), r, p, window)}
        assert set(plan.partners) == expected
        # Pair (a, a + d) meets at global step 2 (d - 1) + (a // d) % 2, the same on both sides;
        # a rank's steps strictly increase: one partner per step, no rank waits out of order.
        steps = [2 * (abs(p - r) - 1) + (min(p, r) // abs(p - r)) % 2 for p in plan.partners]
        assert steps == sorted(set(steps))


def test_meeting_blocks_by_window():
    layout = ShardLayout((10, 10, 10), 0)
    assert blocks_meet(layout, 0, 2, 11) and not blocks_meet(layout, 0, 2, 10)  # points 9 and 20
    assert not reaches_beyond_neighbours(layout, 10) and reaches_beyond_neighbours(layout, 11)
    assert reaches_beyond_neighbours(layout, None)
    assert not blocks_meet(ShardLayout((10, 0, 10), 0), 0, 1, None)  # an empty shard meets nobody


def ring_case(group, case: dict) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sizes = case.get("sizes") or shard_sizes(case["points"], world)
    layout = ShardLayout(tuple(sizes), rank)
    q, k, v, ids, cotangent = _inputs(case)
    rows = slice(layout.start, layout.stop)
    mine = [t[:, :, rows].clone().requires_grad_() for t in (q, k, v)]
    counter = CommCounter()
    out = ring_attention(*mine, case["window"], layout, group, Transport(counter), ids)
    forward_bytes = counter.bytes_sent["ring"]
    (out * cotangent[:, :, rows]).sum().backward()
    return {
        "out": out.detach().numpy(),
        "grads": [t.grad.numpy() for t in mine],
        "forward_bytes": forward_bytes,
        "bytes": counter.bytes_sent["ring"],
    }


def _inputs(case: dict):
    g = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], 2, case["points"], 4)
    dtype = torch.float64 if case.get("float64") else torch.float32
    q, k, v, cotangent = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(4))
    ids = None
    if case.get("ids"):
        rows = case["batch"] if case["ids"] == "per_member" else 1
        ids = torch.randint(0, 4, (rows, case["points"]), generator=g).sort(1).values
    return q, k, v, ids, cotangent


N = 61  # uneven over 2, 3 and 4 ranks
RING_CASES = [
    dict(points=N, window=None, batch=1, ranks=2),
    dict(points=N, window=None, batch=2, ranks=3, float64=True),
    dict(points=N, window=None, batch=2, ranks=4, ids="per_member"),
    dict(points=N, window=5, batch=2, ranks=4),  # W < shard: neighbours only, still through the ring
    dict(points=N, window=20, batch=1, ranks=4, ids="shared"),  # W > a shard
    dict(points=N, window=40, batch=2, ranks=4, float64=True),  # W > 2 shards
    dict(points=N, window=9, batch=2, ranks=4, sizes=[20, 0, 3, 38]),  # an empty shard, a tiny one
]


@pytest.mark.parametrize("case", RING_CASES, ids=[f"P{c['ranks']}-W{c['window']}-B{c['batch']}" for c in RING_CASES])
def test_ring_attention_matches_dense(rank_pool, case: dict) -> None:
    case = {**case, "seed": case["ranks"] + (case["window"] or 0)}
    parts = rank_pool.run_ok(ring_case, case["ranks"], case)
    q, k, v, ids, cotangent = _inputs(case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    expected = dense_window_attention(q, k, v, case["window"], segment_ids=ids)
    (expected * cotangent).sum().backward()
    tol = 1e-12 if case.get("float64") else 1e-5
    np.testing.assert_allclose(np.concatenate([p["out"] for p in parts], 2), expected.detach().numpy(), atol=tol)
    for i, want in enumerate((q.grad, k.grad, v.grad)):
        got = np.concatenate([p["grads"][i] for p in parts], 2)
        np.testing.assert_allclose(got, want.numpy(), atol=tol * 10, err_msg=f"gradient of {'qkv'[i]}")


def test_ring_sends_each_block_only_to_ranks_its_window_reaches(rank_pool) -> None:
    case = dict(points=40, window=12, batch=1, ranks=4, seed=0)  # shards of 10: reach 2 ranks away
    parts = rank_pool.run_ok(ring_case, 4, case)
    block = 2 * 1 * 2 * 10 * 4 * 4  # k and v of one shard: (2, batch, heads, 10, head_dim) float32
    sizes = [10] * 4
    for rank, part in enumerate(parts):
        partners = RingPlan.build(ShardLayout(tuple(sizes), rank), 12).partners
        assert sorted(partners) == [p for p in range(4) if p != rank and abs(p - rank) <= 2]
        assert part["forward_bytes"] == len(partners) * block
        # backward: the blocks again, and each partner's dk, dv of them home
        assert part["bytes"] == 3 * len(partners) * block


def saved_by_ring(group, points: int) -> tuple[int, int]:
    """Bytes autograd keeps for one ring attention call, and one local q's bytes."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = ShardLayout(tuple(shard_sizes(points, world)), rank)
    q, k, v = (torch.randn(1, 2, layout.local_size, 8, requires_grad=True) for _ in range(3))
    saved: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = ring_attention(q, k, v, None, layout, group)
    out.sum().backward()
    return sum(saved), q.numel() * q.element_size()


def test_ring_keeps_nothing_remote_for_backward(rank_pool) -> None:
    for saved, block in rank_pool.run_ok(saved_by_ring, 4, 400):  # global attention over 4 blocks
        assert saved <= 4 * block + block // 8 + 64  # q, k, v, out and the log-sum-exp: all local


def test_ring_refuses_tensors_that_are_not_this_ranks_block() -> None:
    layout = ShardLayout((5, 5), 0)
    q = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="this rank's 5 points"):
        ring_attention(q, q, q, None, layout, group=None)
