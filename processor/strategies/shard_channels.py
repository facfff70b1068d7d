"""``shard_channels``: Megatron's sequence + tensor parallelism (the reduce-scatter/all-gather
schedule), with heads and MLP hidden channels split over the ranks, and their parameters.

Per block, on this rank's points: the norms and the residual adds. Before each projection that
widens (``qkv``, the MLP's first layer) the normed points are all-gathered, so every rank holds
every point for *its* heads and hidden channels (column-parallel: its rows of the weight);
after each projection that narrows (the attention output projection, the MLP's second layer)
every rank has a partial sum over its heads or hidden channels for every point, and a
reduce-scatter adds them up and leaves each rank its own points (row-parallel: its columns of
the weight). The biases of the narrowing layers are added once, after the reduce-scatter.

Per layer and rank, forward: two all-gathers and two reduce-scatters of ``(batch, N, C)``;
backward: the same again (each collective's backward is the other). Heads and hidden channels
are split like points (larger shares first): ``num_heads >= ranks`` is the only requirement.
Parameters and optimiser state per rank are ``1/P`` of the attention and MLP weights; the
norms and the narrowing layers' biases stay replicated (their gradients are summed like the
other strategies'). Call :meth:`processor.TransformerProcessor.split_parameters` once, before
the optimiser is built.
"""

from __future__ import annotations

from torch import Tensor, nn

from processor.distributed.mesh import ModelDims
from processor.distributed.parameter_split import ChannelSplit, split_parameter
from processor.distributed.region import gather_points, reduce_scatter_points
from processor.distributed.shards import shard_sizes
from processor.matmul.backends import linear
from processor.precision import in_compute_dtype
from processor.strategies.base import BlockParts, ShardContext, Strategy, require_a_head_per_rank
from processor.strategies.cost import CommPart, Workload
from processor.strategies.traffic import gathered_rows


class ShardChannels(Strategy):
    name = "shard_channels"
    splits_parameters = True

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        require_a_head_per_rank(self.name, num_heads, world_size)

    def degrees(self, num_heads: int, world_size: int) -> ModelDims:
        return ModelDims(channels=world_size)

    def split_parameters(self, parts: BlockParts, rank: int, world_size: int) -> None:
        attn, narrow = parts.attn, parts.mlp.narrow
        d = attn.head_dim
        heads = shard_sizes(attn.num_heads, world_size)
        head_channels = tuple(h * d for h in heads)
        split_parameter(attn.qkv, "weight", ChannelSplit(0, head_channels, groups=3), rank)
        split_parameter(attn.proj, "weight", ChannelSplit(1, head_channels), rank)
        attn.num_heads, attn.first_head = heads[rank], sum(heads[:rank])  # ALiBi's slopes follow
        hidden = tuple(shard_sizes(narrow.in_features, world_size))
        for widen in parts.mlp.widening:
            split_parameter(widen, "weight", ChannelSplit(0, hidden), rank)
            split_parameter(widen, "bias", ChannelSplit(0, hidden), rank)
            _resize(widen, out_features=hidden[rank])
        split_parameter(narrow, "weight", ChannelSplit(1, hidden), rank)
        _resize(attn.qkv, out_features=3 * head_channels[rank])
        _resize(attn.proj, in_features=head_channels[rank])
        _resize(narrow, in_features=hidden[rank])

    def block(self, parts: BlockParts, x: Tensor, ctx: ShardContext) -> Tensor:
        attn, mlp = parts.attn, parts.mlp

        def gather(local: Tensor) -> Tensor:  # (b, n_local, C) -> (b, N, C); backward reduce-scatters
            return gather_points(
                local,
                ctx.group,
                dim=1,
                sizes=ctx.layout.sizes,
                downstream="rank_local",
                transport=ctx.transport,
                check=False,  # the layout is agreed once per forward
            )

        def reduce_scatter(partial: Tensor) -> Tensor:  # (b, N, C) partial sums -> (b, n_local, C)
            sizes = ctx.layout.sizes
            return reduce_scatter_points(partial, ctx.group, dim=1, sizes=sizes, transport=ctx.transport, check=False)

        # The gathered rows only enter the widening projections: gather them in the compute dtype.
        with self.phase("attention"):
            h = gather(in_compute_dtype(parts.attn_norm(x)))
            q, k, v = attn.qkv_heads(h)  # this rank's heads, every point
            heads_out = attn.merge_heads([attn.attend(q, k, v, segment_ids=ctx.key_segment_ids)])
            x = x + reduce_scatter(linear(heads_out, attn.proj.weight)) + attn.proj.bias
        with self.phase("mlp"):
            h = gather(in_compute_dtype(parts.mlp_norm(x)))
            return x + reduce_scatter(mlp(h, add_output_bias=False)) + mlp.narrow.bias

    # Its cost: two all-gathers and two reduce-scatters of the points per layer, each one's
    # transpose in backward, on the critical path; every point for a share of the heads.

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        return (work.forward_passes + 1) * 4 * gathered_rows(sizes) * work.row_bytes

    def processor_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        """Under checkpointing the recomputation stops early (torch's default) once every saved
        tensor is back: the last reduce-scatter of each chunk, whose output nothing saves, is
        not repeated."""
        total = super().processor_bytes(work, sizes, rank)
        if work.num_chunks > 0:
            total -= max(work.num_chunks, 1) * gathered_rows(sizes) * work.row_bytes
        return total

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        messages = work.num_layers * (4 * work.forward_passes + 4) * (work.ranks - 1)
        return [CommPart(sent, messages, work.ranks, overlapped=False)]

    def work_share(self, work: Workload) -> tuple[float, float]:
        return 1.0, max(shard_sizes(work.num_heads, work.ranks)) / work.num_heads

    def copies_per_value(self, work: Workload) -> float:
        """The gathers and reduce-scatters move P times a rank's rows, four of each."""
        return 8.0 * work.ranks


def _resize(linear: nn.Linear, **features: int) -> None:
    """Keep ``in_features``/``out_features`` (and so the module's repr) true to its share."""
    for key, value in features.items():
        setattr(linear, key, value)
