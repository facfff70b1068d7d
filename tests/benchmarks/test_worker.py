"""A benchmark point measured on local gloo ranks: counted bytes agree with the analytic model."""

import dataclasses
from typing import Any

import pytest

from benchmarks.config import BenchmarkConfig, BenchModelConfig
from benchmarks.point import summarise
from benchmarks.worker import measure


def point(**changes: Any) -> BenchmarkConfig:
    changes = dict(changes)
    model = dict(num_layers=2, num_channels=16, num_heads=4, window_size=24) | changes.pop("model", {})
    # A 256-cubed reference GEMM: the 2048-cubed default is most of a small point's time (4 ranks
    # on 2 cores: seconds), and nothing here is a share of it.
    settings = dict(warmup=0, steps=2, gemm_size=256) | changes
    return BenchmarkConfig(**settings, model=dataclasses.replace(BenchModelConfig(), **model))


def slow(case: dict) -> Any:
    """A case of the slow tier: a variant (bf16's halved bytes, 4 ranks on 2 cores) of a formula
    the default tier checks on 2-3 ranks in fp32."""
    return pytest.param(case, marks=pytest.mark.slow)


CASES = [
    dict(strategy="shard_heads", ranks=2, grid="o8"),
    dict(strategy="shard_heads", ranks=3, grid="o8", model=dict(num_heads=8, num_channels=32)),
    slow(dict(strategy="shard_heads", ranks=4, grid="f6", precision="bf16")),
    dict(strategy="shard_sequence", ranks=2, grid="o8"),
    dict(strategy="shard_sequence", ranks=3, grid="o8", batch_size=2),
    dict(strategy="shard_sequence", ranks=4, grid="o8", model=dict(window_size=200)),  # wider than a shard
    slow(dict(strategy="shard_sequence", ranks=4, grid="o8", model=dict(num_chunks=1), precision="bf16")),
    dict(strategy="shard_heads", ranks=2, grid="o8", model=dict(num_chunks=2)),
    dict(strategy="shard_sequence", ranks=3, grid="o8", target="train_step", data_grid="o12"),
    dict(strategy="shard_heads", ranks=2, grid="o8", target="train_step"),
    dict(strategy="shard_channels", ranks=2, grid="o8"),
    slow(dict(strategy="shard_channels", ranks=3, grid="o8", model=dict(num_chunks=1), precision="bf16")),
    dict(strategy="shard_channels", ranks=2, grid="o8", target="train_step"),
    dict(strategy="shard_sequence", ranks=3, grid="o8", segments=4, model=dict(num_chunks=1)),
    dict(strategy="shard_heads", ranks=2, grid="o8", segments=3),
    dict(strategy="shard_channels", ranks=3, grid="o8", segments=5),
    # 2 x 2: a halo of k, v across the head groups; global through the ring, bf16, checkpointed.
    dict(strategy="shard_hybrid", ranks=4, grid="o8", head_group_size=2),
    dict(
        strategy="shard_hybrid",
        ranks=4,
        grid="o8",
        head_group_size=2,
        ring=True,
        segments=3,
        precision="bf16",
        model=dict(window_size=None, num_chunks=1),
    ),
    # An attention wider or narrower than C (anemoi's attn_channels): q, k, v and outputs move A values.
    dict(strategy="shard_heads", ranks=3, grid="o8", model=dict(attn_channels=40)),
    slow(dict(strategy="shard_sequence", ranks=4, grid="o8", model=dict(window_size=200, attn_channels=8))),
    dict(strategy="shard_hybrid", ranks=4, grid="o8", head_group_size=2, model=dict(attn_channels=24, num_chunks=1)),
    # A strategy of your own, swept by import path: counted like the built-ins.
    dict(strategy="tests.processor.plan.test_own_strategy:GatherKeys", ranks=3, grid="o8", model=dict(num_chunks=1)),
]


def _case_id(case: Any) -> str:
    return "-".join(f"{v}" for v in case.values() if not isinstance(v, dict))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_counted_bytes_match_the_analytic_model(rank_pool, case):
    cfg = point(**case)
    row = summarise(cfg, rank_pool.run_ok(measure, cfg.ranks, cfg))
    assert row["status"] == "ok"
    assert all(b > 0 for b in row["bytes_sent_per_rank"])
    assert row["bytes_rel_error_max"] <= 0.01, (row["bytes_sent_per_rank"], row["analytic_bytes_per_rank"])
    assert row["step_time_min_s"] <= row["step_time_s"] <= row["step_time_max_s"]
    assert row["processor_flop_per_s"] > 0


def test_one_rank_sends_nothing(rank_pool):
    cfg = point(strategy="none", ranks=1, grid="o8")
    row = summarise(cfg, rank_pool.run_ok(measure, 1, cfg))
    assert row["bytes_sent_per_step_max"] == 0 == row["analytic_bytes_per_step_max"]
    assert row["bytes_sent_per_layer_max"] == 0 == row["analytic_bytes_per_layer_max"]
    assert row["peak_bytes_per_rank"][0] > 0


@pytest.mark.slow
def test_o96_sequence_sends_over_20x_fewer_bytes_than_heads(rank_pool):
    """Counted, at o96 with W = 512, whatever the channels: the ratio is set by N / (P W)."""
    for ranks in (2, 4):
        sent = {}
        for strategy in ("shard_heads", "shard_sequence"):
            cfg = point(strategy=strategy, ranks=ranks, grid="o96", steps=1, model=dict(num_layers=1, window_size=512))
            sent[strategy] = summarise(cfg, rank_pool.run_ok(measure, ranks, cfg))["bytes_sent_per_step_max"]
        assert sent["shard_heads"] >= 20 * sent["shard_sequence"], (ranks, sent)


def test_local_copy_mode_sends_nothing_and_profile_splits_the_step(rank_pool):
    cfg = point(strategy="shard_sequence", ranks=2, grid="o8", compare_local_copy=True, profile=True)
    row = summarise(cfg, rank_pool.run_ok(measure, 2, cfg))
    assert row["bytes_rel_error_max"] <= 0.01  # counted on the real steps only
    assert row["step_time_local_copy_s"] > 0 and "comm_overhead" in row
    split = row["profile_split_s"]
    assert {"attention", "mlp", "projections", "communication"} <= set(split)
    assert all(v >= 0 for v in split.values())


def test_local_copy_exchange_moves_no_bytes(rank_pool):
    out = rank_pool.run_ok(_halo_under_local_copy, 2)
    assert out == [0, 0]


def _halo_under_local_copy(group):
    import torch

    from benchmarks.local_copy import LocalCopyTransport
    from processor.distributed import CommCounter, HaloConfig, ShardLayout, halo_pad

    layout = ShardLayout((5, 5), group.rank())
    counter = CommCounter()
    padded = halo_pad(torch.ones(1, 5, 3), HaloConfig(width=2, dim=1), layout, group, LocalCopyTransport(counter))
    assert padded.shape == (1, 7, 3)
    return counter.total_bytes
