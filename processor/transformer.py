"""The sharded transformer processor: a stack of pre-norm sliding-window blocks.

The executable specification is the dense reference: every strategy must give, for its
points, what one rank computes with :func:`processor.attention.dense_window_attention` in
place of the kernel (``tests/processor/strategies/test_exactness.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.checkpoint import checkpoint

from processor.attention.module import SelfAttention
from processor.config import ProcessorConfig
from processor.distributed.consistency import agree_on_layout
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Transport
from processor.mlp import MLP
from processor.strategies.base import ShardContext


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ProcessorConfig) -> None:
        super().__init__()
        c = config
        self.attn_norm = nn.LayerNorm(c.num_channels)
        self.attn = SelfAttention(
            c.num_channels, c.num_heads, c.window_size, c.qk_norm, c.dropout_p, c.attention_block_size
        )
        self.mlp_norm = nn.LayerNorm(c.num_channels)
        self.mlp = MLP(c.num_channels, c.mlp_hidden, c.activation)

    def forward(self, x: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` -> same shape."""
        x = x + self.attn(self.attn_norm(x), ctx)
        return x + self.mlp(self.mlp_norm(x))


class TransformerProcessor(nn.Module):
    """Transformer processor on ``(batch, points, channels)``, split over a model-parallel group.

    Built from a :class:`~processor.ProcessorConfig` (hyper-parameters and strategy).
    Parameters do not depend on the strategy or the rank: built under the same seed they are
    equal everywhere. After backward each rank's parameter gradients hold its own points'
    contributions: wrap the model with :func:`processor.distributed.parallelize_gradients` to
    have backward sum them into the one-rank gradient, or call
    :func:`processor.distributed.sum_model_parallel_gradients` yourself.

    What "right" means is executable: on any number of ranks the output and every gradient
    equal one rank's, and one rank's equal the dense reference
    :func:`processor.attention.dense_window_attention` (see the module docstring).
    """

    def __init__(self, config: ProcessorConfig) -> None:
        super().__init__()
        if not isinstance(config, ProcessorConfig):
            raise TypeError(f"TransformerProcessor takes a ProcessorConfig, got {type(config).__name__}")
        self.config = config
        self.strategy = config.resolved_strategy()
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))

    def forward(
        self,
        x: Tensor,
        group: dist.ProcessGroup | DeviceMesh | None = None,
        shard_sizes: Sequence[int] | None = None,
        *,
        transport: Transport | None = None,
    ) -> Tensor:
        """Run the processor on this rank's block of points.

        Args:
            x: ``(batch, local_points, channels)``, this rank's contiguous block of points.
            group: the model-parallel group, or a 1-D device mesh of it (e.g. ``mesh["mp"]``);
                ``None`` for one rank.
            shard_sizes: optional points per rank, checked against the actual blocks
                (gathered from the ranks either way).
            transport: what sends the bytes (default: torch.distributed, uncounted); pass one
                with a :class:`~processor.distributed.CommCounter` to count them.
        Returns:
            ``(batch, local_points, channels)`` for the same points.
        Raises:
            ValueError: on every rank of the group, for input or configuration that any rank
                gets wrong (shapes, channels, shard sizes, any processor setting).
        """
        ctx = self._context(x, _process_group(group), shard_sizes, transport or Transport())
        c = self.config
        chunks = max(c.num_chunks, 1)
        per_chunk = c.num_layers // chunks
        for i in range(chunks):
            blocks = self.blocks[i * per_chunk : (i + 1) * per_chunk]
            if c.num_chunks > 0 and torch.is_grad_enabled():
                x = checkpoint(_run_blocks, blocks, x, ctx, use_reentrant=False)
            else:
                x = _run_blocks(blocks, x, ctx)
        return x

    def _context(
        self, x: Tensor, group: dist.ProcessGroup | None, shard_sizes: Sequence[int] | None, transport: Transport
    ) -> ShardContext:
        world = 1 if group is None else dist.get_world_size(group)
        if world == 1:
            self.config.check_world_size(1)
            _check_single_rank(x, self.config.num_channels, shard_sizes)
            layout = ShardLayout((x.shape[1],), 0)
        else:
            # Agree first: ranks with different settings all raise here, together.
            layout = agree_on_layout(x, group, self.config.num_channels, self.config.describe(), shard_sizes)
            self.config.check_world_size(world)
        return ShardContext.build(group, layout, self.strategy, transport)


def _process_group(group: dist.ProcessGroup | DeviceMesh | None) -> dist.ProcessGroup | None:
    if not isinstance(group, DeviceMesh):
        return group
    if group.ndim != 1:
        raise ValueError(
            f"the processor takes a 1-D mesh of its model-parallel ranks; got dims {group.mesh_dim_names}: "
            'pass the axis, e.g. mesh["mp"]'
        )
    return group.get_group()


def _run_blocks(blocks: nn.ModuleList, x: Tensor, ctx: ShardContext) -> Tensor:
    for block in blocks:
        x = block(x, ctx)
    return x


def _check_single_rank(x: Tensor, channels: int, shard_sizes: Sequence[int] | None) -> None:
    if x.dim() != 3 or x.shape[2] != channels:
        raise ValueError(f"input must be (batch, points, {channels}), got {tuple(x.shape)}")
    if shard_sizes is not None and list(shard_sizes) != [x.shape[1]]:
        raise ValueError(f"shard_sizes {list(shard_sizes)} do not match {x.shape[1]} points on one rank")
