"""The sharded transformer processor: a stack of pre-norm sliding-window blocks."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from processor.block import TransformerBlock, make_activation
from processor.distributed.consistency import agree_on_layout
from processor.distributed.shards import ShardLayout
from processor.strategies import ShardContext, get_strategy


class TransformerProcessor(nn.Module):
    """Transformer processor on ``(batch, points, channels)``, split over a model-parallel group.

    Args:
        num_layers: transformer blocks.
        num_channels: channels ``C``; must be divisible by ``num_heads``.
        num_heads: attention heads.
        window_size: ``W``; point ``i`` attends to points ``j`` with ``|i - j| <= W``
            in the grid's 1-D point order. ``None``: global attention.
        mlp_hidden_ratio: MLP hidden channels = ``int(mlp_hidden_ratio * C)``.
        num_chunks: the layers are run in this many consecutive chunks, each under
            activation checkpointing (recomputed in backward) as in anemoi; ``0`` disables
            checkpointing. Must divide ``num_layers``.
        dropout_p: dropout on the attention weights (training only).
        qk_norm: LayerNorm over each head's queries and keys.
        activation: ``gelu``, ``gelu_tanh``, ``silu``, ``relu`` or ``tanh``.
        strategy: ``none`` (one rank), ``shard_heads`` or ``shard_sequence``.
        attention_block_size: query rows per block in the windowed kernel (default: W / 2).

    Parameters do not depend on the strategy or the rank: built under the same seed they are
    equal everywhere. After backward each rank's parameter gradients hold its own points'
    contributions; :func:`processor.distributed.sum_model_parallel_gradients` sums them into
    the one-rank gradient.
    """

    def __init__(
        self,
        num_layers: int,
        num_channels: int,
        num_heads: int,
        window_size: int | None = None,
        mlp_hidden_ratio: float = 4,
        num_chunks: int = 1,
        dropout_p: float = 0.0,
        qk_norm: bool = False,
        activation: str = "gelu",
        strategy: str = "none",
        attention_block_size: int | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(num_layers, num_channels, num_heads, window_size, mlp_hidden_ratio, num_chunks, dropout_p)
        make_activation(activation)  # fail early on an unknown name
        self.strategy = get_strategy(strategy)
        self.num_layers, self.num_channels, self.num_heads = num_layers, num_channels, num_heads
        self.window_size, self.num_chunks = window_size, num_chunks
        self._config = (
            strategy,
            num_layers,
            num_channels,
            num_heads,
            window_size,
            mlp_hidden_ratio,
            num_chunks,
            qk_norm,
            activation,
        )
        hidden = int(mlp_hidden_ratio * num_channels)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                num_channels,
                num_heads,
                window_size,
                hidden,
                activation,
                self.strategy,
                qk_norm,
                dropout_p,
                attention_block_size,
            )
            for _ in range(num_layers)
        )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], strategy: str) -> TransformerProcessor:
        """Build from a mapping that holds these arguments among others (e.g. a config's ``model``
        section); keys that are not arguments are ignored."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "strategy"}
        return cls(**{k: v for k, v in settings.items() if k in names}, strategy=strategy)

    def forward(
        self, x: Tensor, group: dist.ProcessGroup | None = None, shard_sizes: Sequence[int] | None = None
    ) -> Tensor:
        """Run the processor on this rank's block of points.

        Args:
            x: ``(batch, local_points, channels)``, this rank's contiguous block of points.
            group: the model-parallel process group; ``None`` for one rank.
            shard_sizes: optional points per rank, checked against the actual blocks
                (gathered from the ranks either way).
        Returns:
            ``(batch, local_points, channels)`` for the same points.
        Raises:
            ValueError: on every rank of the group, for input or configuration that any rank
                gets wrong (shapes, channels, shard sizes, strategy, window, heads).
        """
        ctx = self._context(x, group, shard_sizes)
        chunks = max(self.num_chunks, 1)
        per_chunk = self.num_layers // chunks
        for c in range(chunks):
            blocks = self.blocks[c * per_chunk : (c + 1) * per_chunk]
            if self.num_chunks > 0 and torch.is_grad_enabled():
                x = checkpoint(_run_blocks, blocks, x, ctx, use_reentrant=False)
            else:
                x = _run_blocks(blocks, x, ctx)
        return x

    def _context(self, x: Tensor, group: dist.ProcessGroup | None, shard_sizes: Sequence[int] | None) -> ShardContext:
        world = 1 if group is None else dist.get_world_size(group)
        self.strategy.check(self.num_heads, self.window_size, world)
        if world == 1:
            _check_single_rank(x, self.num_channels, shard_sizes)
            return ShardContext(group, ShardLayout((x.shape[1],), 0))
        layout = agree_on_layout(x, group, self.num_channels, self._config, shard_sizes)
        return ShardContext(group, layout)


def _run_blocks(blocks: nn.ModuleList, x: Tensor, ctx: ShardContext) -> Tensor:
    for block in blocks:
        x = block(x, ctx)
    return x


def _check_single_rank(x: Tensor, channels: int, shard_sizes: Sequence[int] | None) -> None:
    if x.dim() != 3 or x.shape[2] != channels:
        raise ValueError(f"input must be (batch, points, {channels}), got {tuple(x.shape)}")
    if shard_sizes is not None and list(shard_sizes) != [x.shape[1]]:
        raise ValueError(f"shard_sizes {list(shard_sizes)} do not match {x.shape[1]} points on one rank")


def _check_arguments(
    num_layers: int,
    num_channels: int,
    num_heads: int,
    window_size: int | None,
    mlp_hidden_ratio: float,
    num_chunks: int,
    dropout_p: float,
) -> None:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_heads < 1 or num_channels < 1:
        raise ValueError(f"num_channels and num_heads must be >= 1, got {num_channels} and {num_heads}")
    if num_channels % num_heads:
        raise ValueError(f"num_channels ({num_channels}) must be divisible by num_heads ({num_heads})")
    if window_size is not None and (not isinstance(window_size, int) or window_size < 0):
        raise ValueError(f"window_size must be a non-negative integer or None, got {window_size!r}")
    if mlp_hidden_ratio <= 0 or int(mlp_hidden_ratio * num_channels) < 1:
        raise ValueError(f"mlp_hidden_ratio must give at least one hidden channel, got {mlp_hidden_ratio}")
    if num_chunks < 0 or (num_chunks > 0 and num_layers % num_chunks):
        raise ValueError(f"num_chunks ({num_chunks}) must be 0 (no checkpointing) or divide num_layers ({num_layers})")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
