"""agree_on_values: equal values pass; any difference is the same ValueError on every rank."""

from __future__ import annotations

from processor.distributed.consistency import agree_on_values
from tests.rank_pool import RankError


def agree_case(group, differ: bool) -> str:
    import torch.distributed as dist

    rank = dist.get_rank(group)
    values = {"window": 40, "strategy": "shard_sequence", "dataset.shape": (40, 1600)}
    if differ and rank >= 2:
        values["window"] = 30 + rank
    if differ and rank == 1:
        del values["strategy"]
    agree_on_values(values, group, what="run settings")
    return "agreed"


def test_equal_values_agree(rank_pool):
    assert rank_pool.run_ok(agree_case, 4, False) == ["agreed"] * 4


def test_every_rank_names_the_ranks_and_keys_that_differ(rank_pool):
    results = rank_pool.run(agree_case, 4, True)
    assert all(isinstance(r, RankError) and r.type == "ValueError" for r in results), results
    assert len({r.message for r in results}) == 1
    message = results[0].message
    assert message.startswith("run settings differ between rank 0 and ranks [1, 2, 3]")
    assert "window: 40 on ranks [0, 1], 32 on ranks [2], 33 on ranks [3]" in message
    assert "strategy: shard_sequence on ranks [0, 2, 3], <missing> on ranks [1]" in message
