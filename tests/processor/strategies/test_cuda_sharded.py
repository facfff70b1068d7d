"""On one GPU: every strategy's CUDA path, sharded over P gloo ranks that all use ``cuda:0``
through :class:`HostStagedTransport`, gives one rank's numbers on the same GPU, forward and
every gradient, in fp32 and under bf16 autocast (``pytest -m cuda``; skipped without a GPU).

The ranks are the rank pool's gloo processes. Every exchange of the processor (halo, ring,
head all-to-all, ``shard_channels``' all-gathers and reduce-scatters, the 2-D hybrid) goes
through the staging transport: gloo cannot send CUDA tensors point to point. The gradient sums
after backward are staged through the CPU here too (a gloo all-reduce of host copies).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor.distributed import CommCounter, HostStagedTransport, shard_offsets, shard_sizes
from processor.distributed.parameter_split import gather_full, split_of
from processor.strategies import ShardHybrid, ShardSequence, Strategy
from tests.processor.strategies.test_exactness import RTOL, _data, _model, assert_close, segment_ids
from tests.processor.strategies.test_wire_precision import _close
from tests.rank_pool import RankPool

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def rank_pool():
    """conftest's pool of four gloo ranks, with a longer wait per case: a rank's first
    FlexAttention calls compile (forward and backward, per shape) before they answer."""
    pool = RankPool(max_ranks=4, timeout=600.0)
    yield pool
    pool.close()


def _summed_gradients(model: torch.nn.Module, group) -> dict[str, np.ndarray]:
    """Every parameter's gradient of the whole model, on this rank: replicated ones summed over
    ``group``, split ones (``shard_channels``) gathered into the full tensor; both on the CPU."""
    import torch.distributed as dist

    out = {}
    for name, p in model.named_parameters():
        grad = torch.zeros(p.shape) if p.grad is None else p.grad.detach().cpu()
        if group is not None:
            split = split_of(p)
            if split is None:
                dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
            else:
                grad = gather_full(grad, split, group)
        out[name] = grad.numpy()
    return out


def _run_on_gpu(group, case: dict) -> dict:
    """This rank's block on ``cuda:0`` (``group`` None: every point, strategy ``none``, the
    reference): output, input gradient, the whole model's gradients, bytes sent per kind."""
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    rank, ranks = (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))
    model = _model(case, "none" if group is None else case["strategy"])  # built on the CPU: same weights
    model.split_parameters(group)
    model.to(device)
    x_full, cotangent = _data(case)
    sizes = shard_sizes(case["points"], ranks)
    start = shard_offsets(sizes)[rank]
    rows = slice(start, start + sizes[rank])
    x = x_full[:, rows].to(device).requires_grad_()
    ids = segment_ids(case)
    counter = CommCounter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=case.get("bf16", False)):
        y = model(
            x,
            group=model.build_groups(group),
            segment_ids=None if ids is None else ids[..., rows].to(device),
            transport=HostStagedTransport(counter),
        )
    (y.float() * cotangent[:, rows].to(device)).sum().backward()
    torch.cuda.synchronize(device)
    assert y.device == device and x.grad is not None and x.grad.device == device
    return {
        "y": y.detach().float().cpu().numpy(),
        "dx": x.grad.float().cpu().numpy(),
        "grads": _summed_gradients(model, group),
        "bytes": dict(counter.bytes_sent),
    }


N = 61  # uneven over 2, 3 and 4 ranks
BASE = dict(points=N, batch=2, heads=4)
# head_dim 16 (64 channels, 4 heads): the windowed calls take FlexAttention, CUDA's default path.
FLEX = dict(points=301, batch=2, heads=4, channels=64)
FP32_CASES: list[tuple[str | Strategy, int, dict]] = [
    ("shard_heads", 2, {**BASE, "window": 5, "seed": 1, "segments": "shared"}),  # head all-to-all
    ("shard_heads", 3, {**BASE, "window": None, "seed": 2, "qk_norm": True}),
    ("shard_sequence", 2, {**BASE, "window": 4, "seed": 3, "segments": "per_member"}),  # halo
    (ShardSequence(ring=False), 3, {**BASE, "window": 25, "seed": 4, "chunks": 1}),  # halo over several ranks
    (ShardSequence(ring=True), 2, {**BASE, "window": 6, "seed": 5, "segments": "shared"}),  # ring
    (ShardSequence(ring=True), 3, {**BASE, "window": None, "seed": 6, "qk_norm": True, "segments": "per_member"}),
    ("shard_channels", 2, {**BASE, "window": 3, "heads": 5, "channels": 30, "seed": 7, "segments": "per_member"}),
    ("shard_channels", 3, {**BASE, "window": None, "heads": 5, "channels": 30, "seed": 8, "qk_norm": True}),
    # 2 x 2 hybrid: head all-to-all within pairs, halo (then ring) across them.
    (ShardHybrid(head_group_size=2), 4, {**BASE, "window": 7, "seed": 9, "segments": "shared", "qk_norm": True}),
    (
        ShardHybrid(head_group_size=2, ring=True),
        4,
        {**BASE, "window": None, "heads": 2, "seed": 10, "segments": "per_member"},
    ),
    ("shard_sequence", 2, {**FLEX, "window": 9, "seed": 11, "segments": "shared"}),  # flex, sharded
    ("shard_heads", 3, {**FLEX, "window": 20, "seed": 12, "qk_norm": True}),
]


def _case_id(strategy, ranks: int, case: dict) -> str:
    extra = "-seg" if case.get("segments") else ""
    return f"{strategy}-P{ranks}-N{case['points']}-W{case['window']}-C{case.get('channels', 24)}{extra}"


@pytest.mark.parametrize("strategy,ranks,case", FP32_CASES, ids=[_case_id(*c) for c in FP32_CASES])
def test_sharded_on_one_gpu_matches_one_rank_fp32(rank_pool, strategy, ranks: int, case: dict) -> None:
    case = {**case, "strategy": strategy}
    parts = rank_pool.run_ok(_run_on_gpu, ranks, case)
    (reference,) = rank_pool.run_ok(_run_on_gpu, 1, case)
    assert all(part["bytes"] for part in parts), "nothing travelled through the staging transport"
    assert_close(np.concatenate([p["y"] for p in parts], axis=1), reference["y"], "output", tol=RTOL)
    assert_close(np.concatenate([p["dx"] for p in parts], axis=1), reference["dx"], "input gradient", tol=RTOL)
    # Gradients that are zero up to round-off (the k-norm bias) count against a tenth of the largest.
    floor = 0.1 * max(float(np.abs(g).max()) for g in reference["grads"].values())
    for name, expected in reference["grads"].items():
        for rank, part in enumerate(parts):
            assert_close(part["grads"][name], expected, f"summed gradient of {name} on rank {rank}", floor, RTOL)


# As test_wire_precision's: no segment ids, so that every byte on the wire halves under bf16.
BF16_CASES: list[tuple[str | Strategy, int, dict]] = [
    ("shard_sequence", 3, {**BASE, "window": 6, "seed": 21, "qk_norm": True}),
    (ShardSequence(ring=True), 3, {**BASE, "window": 25, "seed": 22, "qk_norm": True}),
    ("shard_heads", 2, {**BASE, "window": 9, "seed": 23, "qk_norm": True, "chunks": 1}),
    ("shard_channels", 2, {**BASE, "window": 5, "heads": 5, "channels": 30, "seed": 24, "qk_norm": True}),
    (ShardHybrid(head_group_size=2), 4, {**BASE, "window": 7, "seed": 25, "qk_norm": True}),
    ("shard_sequence", 2, {**FLEX, "window": 9, "seed": 26, "qk_norm": True}),
]


@pytest.mark.parametrize("strategy,ranks,case", BF16_CASES, ids=[_case_id(*c) for c in BF16_CASES])
def test_sharded_on_one_gpu_matches_one_rank_bf16(rank_pool, strategy, ranks: int, case: dict) -> None:
    """Sharded bf16 is as close to one rank's fp32 as one rank's bf16 is (test_wire_precision's
    measure), and every kind of exchange sends half the fp32 bytes."""
    case = {**case, "strategy": strategy}
    half = rank_pool.run_ok(_run_on_gpu, ranks, {**case, "bf16": True})
    full = rank_pool.run_ok(_run_on_gpu, ranks, case)
    (reference,) = rank_pool.run_ok(_run_on_gpu, 1, {**case, "bf16": True})
    (fp32_reference,) = rank_pool.run_ok(_run_on_gpu, 1, case)
    for rank, (h, f) in enumerate(zip(half, full)):
        assert h["bytes"] and set(h["bytes"]) == set(f["bytes"]), f"rank {rank}: {h['bytes']} vs {f['bytes']}"
        for kind, sent in f["bytes"].items():
            assert 2 * h["bytes"][kind] == sent, f"rank {rank} {kind}: {h['bytes'][kind]} B in bf16, {sent} in fp32"
    for key, what in (("y", "output"), ("dx", "input gradient")):
        sharded = np.concatenate([p[key] for p in half], axis=1)
        _close(sharded, reference[key], fp32_reference[key], what)
    floor = 0.1 * max(float(np.abs(g).max()) for g in fp32_reference["grads"].values())
    for name, exact in fp32_reference["grads"].items():
        for rank, part in enumerate(half):
            _close(
                part["grads"][name], reference["grads"][name], exact, f"summed gradient of {name} on rank {rank}", floor
            )
