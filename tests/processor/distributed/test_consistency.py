"""Bad input on any rank is a ValueError on every rank, never one rank raising while others wait."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import shard_sizes
from tests.rank_pool import RankError


def bad_input_case(group, problem: str) -> str:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    kwargs = dict(num_layers=1, num_channels=8, num_heads=2, window_size=3, strategy="shard_sequence")
    sizes = shard_sizes(20, ranks)
    batch, channels, passed_sizes = 1, 8, None
    if problem == "channels" and rank == 1:
        channels = 6
    if problem == "batch" and rank == 0:
        batch = 2
    if problem == "window" and rank == ranks - 1:
        kwargs["window_size"] = 4
    if problem == "strategy" and rank == 0:
        kwargs["strategy"] = "shard_heads"
    if problem == "dropout" and rank == 1:
        kwargs["dropout_p"] = 0.1
    if problem == "block" and rank == 0:
        kwargs["attention_block_size"] = 64
    if problem == "sizes_arg":
        passed_sizes = [s + (1 if r == 0 else -1 if r == 1 else 0) for r, s in enumerate(sizes)]
    if problem == "sizes_length":
        passed_sizes = sizes[:-1]
    if problem == "heads":
        kwargs.update(strategy="shard_heads", num_heads=2)
    model = TransformerProcessor(ProcessorConfig(**kwargs))
    x = torch.randn(batch, sizes[rank], channels)
    ids = None
    if problem == "ids_missing" and rank != 1:
        ids = torch.zeros(sizes[rank], dtype=torch.long)
    if problem == "ids_dtype":
        ids = torch.zeros(sizes[rank], dtype=torch.float32 if rank == 0 else torch.long)
    if problem == "ids_batch":  # per sample on one rank, shared on the others: would gather unequal sizes
        batch = 2
        x = torch.randn(batch, sizes[rank], channels)
        ids = torch.zeros(batch if rank == 0 else 1, sizes[rank], dtype=torch.long)
    if problem == "ids_shape":
        ids = torch.zeros(sizes[rank] + 1, dtype=torch.long)
    model(x, group=group, shard_sizes=passed_sizes, segment_ids=ids)
    return "ran"


@pytest.mark.parametrize(
    "problem,ranks,message",
    [
        ("channels", 2, "rank 1 .*wrong number of channels"),
        ("batch", 3, "batch size differs"),
        ("window", 3, r"processor settings differ between rank 0 and ranks \[2\]: window_size: 3 on ranks \[0, 1\]"),
        ("strategy", 2, "processor settings differ .*strategy: ShardHeads\\(\\) on ranks \\[0\\]"),
        ("dropout", 3, r"processor settings differ between rank 0 and ranks \[1\]: dropout_p: 0.0 on ranks \[0, 2\]"),
        ("block", 2, r"processor settings differ .*attention_block_size: 64 on ranks \[0\], None on ranks \[1\]"),
        ("sizes_arg", 2, "local_points differs from shard_sizes"),
        ("sizes_length", 3, "one entry per rank"),
        ("heads", 4, "num_heads >= ranks .*: 2 heads on 4 ranks"),
        ("ids_missing", 3, r"segment_ids: given, shared by the batch on ranks \[0, 2\], none on ranks \[1\]"),
        ("ids_dtype", 2, "segment_ids: invalid .*integer tensor"),
        ("ids_batch", 2, "segment_ids: given per sample on ranks \\[0\\]"),
        ("ids_shape", 3, "segment_ids"),
    ],
)
def test_every_rank_raises_the_same_error(rank_pool, problem, ranks, message):
    import re

    results = rank_pool.run(bad_input_case, ranks, problem)
    assert all(isinstance(r, RankError) and r.type in ("ValueError", "ConfigError") for r in results), results
    assert len({r.message for r in results}) == 1, [r.message for r in results]
    assert re.search(message, results[0].message), results[0].message


def test_good_input_runs(rank_pool):
    assert rank_pool.run_ok(bad_input_case, 3, "none") == ["ran"] * 3
