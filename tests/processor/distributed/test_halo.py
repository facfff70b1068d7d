"""Halo plans (pure arithmetic) and the halo exchange itself on local gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from processor.distributed import (
    CommCounter,
    HaloConfig,
    HaloPlan,
    ShardLayout,
    Transport,
    halo_pad,
    shard_offsets,
)


@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6), width=st.one_of(st.none(), st.integers(0, 70)))
def test_plan_fetches_exactly_the_window(sizes, width):
    total = sum(sizes)
    w = total if width is None else width
    plans = [HaloPlan.build(ShardLayout(tuple(sizes), r), width) for r in range(len(sizes))]
    starts = shard_offsets(sizes)
    for r, plan in enumerate(plans):
        lo, hi = max(0, starts[r] - w), min(total, starts[r] + sizes[r] + w)
        assert (plan.left, plan.right) == (starts[r] - lo, hi - starts[r] - sizes[r])
        covered = sorted(pos for t in plan.recvs for pos in range(t.start, t.stop))
        halo = [*range(plan.left), *range(plan.left + sizes[r], plan.left + sizes[r] + plan.right)]
        assert covered == halo  # every halo row arrives exactly once
        # What r receives from a peer is what that peer plans to send to r, row for row.
        for t in plan.recvs:
            sent = [s for s in plans[t.peer].sends if s.peer == r]
            assert len(sent) == 1
            assert sent[0].stop - sent[0].start == t.stop - t.start
            assert starts[t.peer] + sent[0].start == lo + t.start


def test_neighbours_only_when_shards_cover_the_window():
    plan = HaloPlan.build(ShardLayout((10, 10, 10, 10), 1), 4)
    assert {t.peer for t in plan.recvs} == {0, 2} == {t.peer for t in plan.sends}
    edge = HaloPlan.build(ShardLayout((10, 10, 10, 10), 0), 4)
    assert edge.left == 0 and {t.peer for t in edge.recvs} == {1}


def test_negative_width():
    with pytest.raises(ValueError):
        HaloConfig(width=-1)


def halo_case(group, sizes: list[int], width: int | None, batch: int) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank(group)
    layout = ShardLayout(tuple(sizes), rank)
    g = torch.Generator().manual_seed(0)
    full = torch.randn(batch, sum(sizes), 3, generator=g)
    cotangent_full = torch.randn(batch, sum(sizes) + 2 * sum(sizes), 3, generator=g)
    x = full[:, layout.start : layout.stop].clone().requires_grad_()
    counter = CommCounter()
    padded = halo_pad(x, HaloConfig(width=width, dim=1), layout, group, Transport(counter))
    left = layout.start - max(0, layout.start - (sum(sizes) if width is None else width))
    # Cotangent indexed by global row, so the same global row gets the same weight everywhere.
    lo = layout.start - left
    cot = cotangent_full[:, lo : lo + padded.shape[1]]
    (padded * cot).sum().backward()
    return {"padded": padded.detach().numpy(), "lo": lo, "dx": x.grad.numpy(), "bytes": counter.bytes_sent["halo"]}


@pytest.mark.parametrize(
    "sizes,width,batch",
    [([5, 5], 2, 1), ([4, 3, 3], 5, 2), ([2, 9, 1, 6], 7, 2), ([3, 3, 3, 3], None, 1), ([6, 6, 6], 0, 1)],
)
def test_halo_pad_and_its_gradient(rank_pool, sizes, width, batch):
    parts = rank_pool.run_ok(halo_case, len(sizes), sizes, width, batch)
    g = torch.Generator().manual_seed(0)
    n = sum(sizes)
    full = torch.randn(batch, n, 3, generator=g).numpy()
    cotangent_full = torch.randn(batch, 3 * n, 3, generator=g).numpy()
    w = n if width is None else width
    expected_dx = np.zeros_like(full)
    for part in parts:
        lo, rows = part["lo"], part["padded"].shape[1]
        np.testing.assert_array_equal(part["padded"], full[:, lo : lo + rows])
        # Each global row's gradient is its cotangent once for every rank that holds it padded.
        expected_dx[:, lo : lo + rows] += cotangent_full[:, lo : lo + rows]
    # Every halo row crosses once forward (value) and once backward (gradient): fp32, 3 channels.
    received_rows = sum(p["padded"].shape[1] - s for p, s in zip(parts, sizes))
    assert sum(p["bytes"] for p in parts) == 2 * 4 * 3 * batch * received_rows
    assert received_rows == sum(min(w, off) + min(w, n - off - s) for off, s in zip(shard_offsets(sizes), sizes))
    np.testing.assert_allclose(np.concatenate([p["dx"] for p in parts], axis=1), expected_dx, rtol=1e-6)


def overlap_order_case(group, sizes: list[int], width: int) -> list[str]:
    """Log when the exchange is posted and awaited, and when work placed in between runs."""
    import torch.distributed as dist

    from processor.distributed import Posted, start_halo_exchange

    events: list[str] = []

    class LoggedPosted(Posted):
        def wait(self):
            events.append("wait")
            return super().wait()

    class LoggingTransport(Transport):
        def post(self, outgoing, incoming, group):
            events.append("post")
            posted = super().post(outgoing, incoming, group)
            return LoggedPosted(posted.works, posted.outgoing, posted.incoming)

    class Interior(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            events.append("interior")
            return 2 * x

        @staticmethod
        def backward(ctx, grad):
            events.append("interior backward")
            return 2 * grad

    layout = ShardLayout(tuple(sizes), dist.get_rank(group))
    x = torch.randn(1, layout.local_size, 3, requires_grad=True)
    exchange = start_halo_exchange(x, HaloConfig(width=width, dim=1), layout, group, LoggingTransport())
    inner = Interior.apply(x)
    left, right = exchange.finish()
    (inner.sum() + (left.square().sum() + right.square().sum())).backward()
    return events


def test_exchange_overlaps_the_work_between_start_and_finish(rank_pool):
    """Forward: posted before the interior work, awaited after it. Backward: the halo gradients
    are posted before the interior work's backward and awaited after it."""
    for events in rank_pool.run_ok(overlap_order_case, 3, [4, 5, 4], 2):
        assert events == ["post", "interior", "wait", "post", "interior backward", "wait"]
