"""The processor agrees on the layout once per input shape, group and settings, not on every
forward; a disagreement still raises the same ValueError on every rank, and the debug switch
brings back the agreement on every forward."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import consistency, shard_sizes
from processor.distributed.consistency import AGREE_EVERY_FORWARD_ENV
from tests.rank_pool import RankError


def _counting_agreements() -> list[int]:
    """Count the agreements made from now on in this rank (undo with ``_restore``)."""
    calls = [0]
    original = consistency.agree_on_layout

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    counted.original = original  # type: ignore[attr-defined]
    consistency.agree_on_layout = counted
    return calls


def _restore() -> None:
    consistency.agree_on_layout = getattr(consistency.agree_on_layout, "original", consistency.agree_on_layout)


def _model() -> TransformerProcessor:
    torch.manual_seed(0)
    return TransformerProcessor(ProcessorConfig(2, 8, 2, window_size=3, num_chunks=0, strategy="shard_sequence"))


def _x(n: int, rank: int, ranks: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, shard_sizes(n, ranks)[rank], 8)


def agreements_case(group, every_forward: bool) -> list[int]:
    """Agreements made after each forward: 3 of one shape, 1 of another, 1 of the first again,
    1 passing shard_sizes, 1 of a deep copy of the model."""
    import os

    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    os.environ[AGREE_EVERY_FORWARD_ENV] = "1" if every_forward else "0"
    calls, seen = _counting_agreements(), []
    try:
        model = _model()
        for n in (20, 20, 20, 24, 20):
            model(_x(n, rank, ranks), group=group)
            seen.append(calls[0])
        model(_x(20, rank, ranks), group=group, shard_sizes=shard_sizes(20, ranks))
        seen.append(calls[0])
        copy.deepcopy(model)(_x(20, rank, ranks), group=group)
        seen.append(calls[0])
    finally:
        _restore()
        os.environ.pop(AGREE_EVERY_FORWARD_ENV)
    return seen


def test_agreement_once_per_shape(rank_pool):
    assert rank_pool.run_ok(agreements_case, 2, False) == [[1, 1, 1, 2, 2, 3, 4]] * 2


def test_the_debug_switch_agrees_on_every_forward(rank_pool):
    assert rank_pool.run_ok(agreements_case, 2, True) == [[1, 2, 3, 4, 5, 6, 7]] * 2


def late_mismatch_case(group, problem: str) -> str:
    """A good forward, then one where the ranks disagree."""
    import os

    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model()
    model(_x(20, rank, ranks), group=group)
    if problem == "batch":  # every rank's shape changes, differently
        x = _x(20, rank, ranks, batch=2 + rank)
    if problem == "sizes_arg":
        x = _x(20, rank, ranks)
        passed = [s + (1 if r == 0 else -1) for r, s in enumerate(shard_sizes(20, ranks))]
        return str(model(x, group=group, shard_sizes=passed).shape)
    if problem == "settings":  # only rank 1's key changes: caught under the debug switch
        os.environ[AGREE_EVERY_FORWARD_ENV] = "1"
        x = _x(20, rank, ranks)
        if rank == 1:
            model.config = replace(model.config, dropout_p=0.1)
    try:
        model(x, group=group)
    finally:
        os.environ.pop(AGREE_EVERY_FORWARD_ENV, None)
    return "ran"


@pytest.mark.parametrize(
    "problem,message",
    [
        ("batch", r"batch size differs across ranks: \[2, 3\]"),
        ("sizes_arg", "local_points differs from shard_sizes"),
        ("settings", r"processor settings differ between rank 0 and ranks \[1\]: dropout_p: 0.0 on ranks \[0\]"),
    ],
)
def test_a_later_disagreement_raises_on_every_rank(rank_pool, problem, message):
    import re

    results = rank_pool.run(late_mismatch_case, 2, problem)
    assert all(isinstance(r, RankError) and r.type == "ValueError" for r in results), results
    assert len({r.message for r in results}) == 1, [r.message for r in results]
    assert re.search(message, results[0].message), results[0].message
