"""The host-staged transport moves the same bytes as the plain one and changes no number: every
strategy, forward and backward, on CPU ranks (the staging copies run on CPU tensors too).

Each rank runs a case twice, once through :class:`Transport` and once through
:class:`HostStagedTransport`, each with its own :class:`CommCounter`; outputs, input gradients
and every parameter's (local, unsummed) gradient must be bitwise equal, and so must the bytes
sent and the calls made per kind of operation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor.distributed import CommCounter, HostStagedTransport, Transport, shard_offsets, shard_sizes
from processor.strategies import ShardHybrid, ShardSequence, Strategy
from tests.processor.strategies.test_exactness import _data, _model, segment_ids

TRANSPORTS = (("plain", Transport), ("staged", HostStagedTransport))


def _run(group, case: dict, transport: Transport, groups) -> dict:
    """This rank's block through ``transport``: output, input and local parameter gradients, and
    what the transport's counter saw."""
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model(case, case["strategy"])
    model.split_parameters(group)
    x_full, cotangent = _data(case)
    sizes = shard_sizes(case["points"], ranks)
    rows = slice(shard_offsets(sizes)[rank], shard_offsets(sizes)[rank] + sizes[rank])
    x = x_full[:, rows].clone().requires_grad_()
    ids = segment_ids(case)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case.get("bf16", False)):
        y = model(x, group=groups, segment_ids=None if ids is None else ids[..., rows], transport=transport)
    (y.float() * cotangent[:, rows]).sum().backward()
    return {
        "y": y.detach().float().numpy(),
        "dx": x.grad.numpy(),
        "grads": {n: p.grad.numpy() for n, p in model.named_parameters()},
        "bytes": dict(transport.counter.bytes_sent),
        "calls": dict(transport.counter.calls),
    }


def _both(group, cases: list[dict]) -> list[dict]:
    """Every case through each transport, on this rank (the groups built once per case)."""
    out = []
    for case in cases:
        groups = _model(case, case["strategy"]).build_groups(group)
        out.append({name: _run(group, case, make(CommCounter()), groups) for name, make in TRANSPORTS})
    return out


N = 61  # uneven over 2, 3 and 4 ranks
BASE = dict(points=N, batch=2, heads=4)
GROUPS: list[tuple[str | Strategy, int, list[dict]]] = [
    ("shard_heads", 2, [{**BASE, "window": 5, "seed": 1}, {**BASE, "window": 9, "seed": 2, "segments": "shared"}]),
    ("shard_heads", 3, [{**BASE, "window": None, "seed": 3, "qk_norm": True}]),
    ("shard_sequence", 2, [{**BASE, "window": 4, "seed": 4, "segments": "per_member"}]),
    # A window wider than a shard, forced through the halo: it gathers from several ranks.
    (ShardSequence(ring=False), 3, [{**BASE, "window": 25, "seed": 5, "chunks": 1}]),
    (ShardSequence(ring=True), 2, [{**BASE, "window": 6, "seed": 6, "segments": "shared"}]),
    (ShardSequence(ring=True), 3, [{**BASE, "window": None, "seed": 7, "qk_norm": True}]),
    ("shard_channels", 2, [{**BASE, "window": 3, "heads": 5, "channels": 30, "seed": 8, "segments": "per_member"}]),
    ("shard_channels", 3, [{**BASE, "window": None, "heads": 5, "channels": 30, "seed": 9}]),
    # 2 x 2: the head all-to-all within pairs, the halo (then the ring) across them.
    (ShardHybrid(head_group_size=2), 4, [{**BASE, "window": 7, "seed": 10, "segments": "shared"}]),
    (ShardHybrid(head_group_size=2, ring=True), 4, [{**BASE, "window": None, "heads": 2, "seed": 11}]),
    # bf16 on the wire: the ring's blocks and their gradients travel in bf16 through the staging.
    (ShardSequence(ring=True), 3, [{**BASE, "window": 20, "seed": 12, "bf16": True, "segments": "shared"}]),
]


def _case_id(strategy, ranks: int, cases: list[dict]) -> str:
    flags = "".join(f"-{f}" for f in ("segments", "bf16") if any(c.get(f) for c in cases))
    return f"{strategy}-P{ranks}{flags}"


@pytest.mark.parametrize("strategy,ranks,cases", GROUPS, ids=[_case_id(*g) for g in GROUPS])
def test_staged_matches_plain_bitwise(rank_pool, strategy, ranks: int, cases: list[dict]) -> None:
    results = rank_pool.run_ok(_both, ranks, [{**c, "strategy": strategy} for c in cases])
    for rank, per_case in enumerate(zip(*results)):
        for i, got in enumerate(per_case):
            plain, staged = got["plain"], got["staged"]
            where = f"case {i}, rank {rank}"
            assert plain["bytes"], f"{where}: nothing was sent"
            assert staged["bytes"] == plain["bytes"], f"{where}: bytes {staged['bytes']} vs {plain['bytes']}"
            assert staged["calls"] == plain["calls"], f"{where}: calls {staged['calls']} vs {plain['calls']}"
            np.testing.assert_array_equal(staged["y"], plain["y"], err_msg=f"{where}: output")
            np.testing.assert_array_equal(staged["dx"], plain["dx"], err_msg=f"{where}: input gradient")
            assert staged["grads"].keys() == plain["grads"].keys()
            for name, grad in plain["grads"].items():
                np.testing.assert_array_equal(staged["grads"][name], grad, err_msg=f"{where}: gradient of {name}")


def _primitives(group) -> dict:
    """Each primitive once through each transport, uneven splits, several dtypes: results, the
    counters, and whether ``post``'s ``wait`` hands back the caller's own buffers."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    out: dict = {"same_buffers": True, "staged_copies": True}
    for name, make in TRANSPORTS:
        transport = make(CommCounter())
        results = []
        for dtype in (torch.float64, torch.bfloat16, torch.int64):
            base = torch.arange(100, dtype=torch.float64).mul(rank + 1).to(dtype)
            # post: a message of rank + 1 rows of 3 to every other rank, a buffer for each peer's
            peers = [p for p in range(world) if p != rank]
            sends = [(p, base[: 3 * (rank + 1)].view(rank + 1, 3)) for p in peers]
            bufs = [(p, torch.full((p + 1, 3), -1, dtype=dtype)) for p in peers]
            posted = transport.post(sends, bufs, group, kind="ring")
            received = posted.wait()
            out["same_buffers"] &= all(r is b for r, (_, b) in zip(received, bufs))
            if name == "staged":  # what travelled were host copies, not the caller's tensors
                staged_ptrs = {t.data_ptr() for t in posted.staged}
                out["staged_copies"] &= not staged_ptrs & {b.data_ptr() for _, b in bufs}
            results += [r.numpy() if dtype != torch.bfloat16 else r.float().numpy() for r in received]
            splits = [2 * r + 1 for r in range(world)]  # uneven: rank r's chunk to rank s
            flat = base[: sum(splits)]
            for result in (
                transport.all_to_all(flat, splits, [2 * rank + 1] * world, group),
                transport.all_gather(base[: 4 + rank], [4 + r for r in range(world)], group),
                transport.reduce_scatter(base[: sum(splits)], splits, group),
            ):
                results.append(result.float().numpy() if dtype == torch.bfloat16 else result.numpy())
        out[name] = {"results": results, "bytes": dict(transport.counter.bytes_sent)}
        out[name]["calls"] = dict(transport.counter.calls)
    return out


def test_each_primitive_matches_plain_and_fills_the_callers_buffers(rank_pool) -> None:
    for rank, got in enumerate(rank_pool.run_ok(_primitives, 3)):
        assert got["same_buffers"], f"rank {rank}: wait() did not return the caller's buffers"
        assert got["staged_copies"], f"rank {rank}: gloo received into the caller's buffers"
        assert got["staged"]["bytes"] == got["plain"]["bytes"] and got["staged"]["calls"] == got["plain"]["calls"]
        assert set(got["plain"]["calls"]) == {"ring", "all_to_all", "all_gather", "reduce_scatter"}
        for i, (a, b) in enumerate(zip(got["staged"]["results"], got["plain"]["results"], strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {rank}, result {i}")
