"""A strategy written here, outside the package, is a first-class one: it runs exactly, the
bytes it states are the bytes it sends, and the planner picks it when it is the cheapest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import CommCounter, Transport, gather_points, shard_offsets, shard_sizes
from processor.plan import CommPart, Machine, Workload, candidates, choose, processor_bytes
from processor.strategies import HeadAttention, PointSharded, ShardContext
from processor.strategies.traffic import gathered_rows
from tests.processor.strategies.test_exactness import assert_close, one_rank_run, sharded_run


@dataclass(frozen=True)
class GatherKeys(PointSharded):
    """Every rank gathers every point's normed input and projects all keys and values itself:
    one all-gather per layer forward, its reduce-scatter back."""

    name = "gather_keys"

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        sizes = ctx.layout.sizes
        everyone = gather_points(
            h, ctx.group, dim=1, sizes=sizes, downstream="rank_local", transport=ctx.transport, check=False
        )
        q, (k, v) = attn.queries(h), attn.keys_values(everyone)
        out = attn.attend(q, k, v, q_offset=ctx.layout.start, segment_ids=ctx.key_segment_ids)
        return attn.merge_heads([out])

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        return (work.forward_passes + 1) * gathered_rows(sizes) * work.row_bytes

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        return [CommPart(sent, work.num_layers * (work.forward_passes + 1), work.ranks, overlapped=False)]

    def extra_projection_flops(self, work: Workload, sizes: list[int]) -> int:
        return 2 * (work.points - max(sizes)) * 2 * work.num_channels**2  # k, v of every other rank's rows


class Uncosted(PointSharded):
    """Runs, but says nothing of its cost."""

    name = "uncosted"

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        return GatherKeys().attend(attn, h, ctx)


@pytest.mark.parametrize("ranks,window,segments", [(2, 5, None), (3, None, "per_member"), (3, 9, "shared")])
def test_it_gives_the_one_rank_numbers(rank_pool, ranks, window, segments) -> None:
    case = dict(points=41, window=window, batch=2, heads=4, seed=ranks, strategy=GatherKeys(), segments=segments)
    expected = one_rank_run(case)
    for rank, got in enumerate(rank_pool.run_ok(sharded_run, ranks, case)):
        start, n = shard_offsets(shard_sizes(41, ranks))[rank], shard_sizes(41, ranks)[rank]
        assert_close(got["y"], expected["y"][:, start : start + n], f"rank {rank} output")
        assert_close(got["dx"], expected["dx"][:, start : start + n], f"rank {rank} input gradient")
        for name, grad in expected["grads"].items():
            assert_close(got["grads"][name], grad, f"rank {rank} {name} gradient")


def _counted_bytes(group, sizes: list[int], chunks: int) -> int:
    import torch.distributed as dist

    rank = dist.get_rank(group)
    torch.manual_seed(0)
    config = ProcessorConfig(
        num_layers=3, num_channels=16, num_heads=4, window_size=4, num_chunks=chunks, strategy=GatherKeys()
    )
    model = TransformerProcessor(config)
    counter = CommCounter()
    x = torch.randn(2, sizes[rank], 16, requires_grad=True)
    model(x, group=model.build_groups(group), transport=Transport(counter)).sum().backward()
    return counter.total_bytes


@pytest.mark.parametrize("chunks", [0, 3])
def test_the_bytes_it_states_are_the_bytes_it_sends(rank_pool, chunks) -> None:
    sizes = [7, 12, 5]  # uneven: the gathers pad to the longest block
    counted = rank_pool.run_ok(_counted_bytes, 3, sizes, chunks)
    work = Workload(
        points=24, num_layers=3, num_channels=16, num_heads=4, window_size=4, num_chunks=chunks, batch=2, ranks=3
    )
    assert counted == [processor_bytes(GatherKeys(), work, sizes, r) for r in range(3)]
    assert counted[0] > 0


CHATTY_LINKS = Machine(
    "chatty", 20e9, 5e9, 10e9, latency_s=1.0, bandwidth_b_s=1e12, memory_b=64 * 2**30, parallel_ranks=2
)


def test_the_planner_picks_it_where_it_is_cheapest() -> None:
    work = Workload(points=20000, num_layers=2, num_channels=128, num_heads=8, window_size=64, ranks=2)
    assert "gather_keys" not in [s.label for s in candidates(work)]  # not unless asked
    # Where each message costs a second, one collective each way beats the halo's four messages.
    pick, table = choose(work, CHATTY_LINKS, strategies=[GatherKeys])
    assert pick.label == "gather_keys" and len(table) == len(candidates(work)) + 1
    # Where messages are cheap, its extra projections lose to the halo's.
    fast = dataclasses.replace(CHATTY_LINKS, latency_s=1e-6)
    assert choose(work, fast, strategies=[GatherKeys])[0].label != "gather_keys"


def test_a_strategy_that_states_no_cost_is_left_out() -> None:
    work = Workload(points=2000, num_layers=2, num_channels=64, num_heads=4, window_size=16, ranks=2)
    _, table = choose(work, CHATTY_LINKS, strategies=[Uncosted])
    assert "uncosted" in [s.label for s in candidates(work, [Uncosted])]
    assert "uncosted" not in [p.label for p in table]


def test_configs_name_it_by_import_path() -> None:
    from processor.strategies import resolve_strategy

    path = f"{__name__}:GatherKeys"
    assert resolve_strategy(path) == GatherKeys()
    assert ProcessorConfig(num_layers=1, num_channels=8, num_heads=2, strategy=path).resolved_strategy() == GatherKeys()
    with pytest.raises(ValueError, match="not a Strategy subclass"):
        resolve_strategy(f"{__name__}:CHATTY_LINKS")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_strategy("no_such_module:Thing")
