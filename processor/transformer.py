"""The sharded transformer processor: a stack of pre-norm sliding-window blocks.

The executable specification is the dense reference: every strategy must give, for its
points, what one rank computes with :func:`processor.attention.dense_window_attention` in
place of the kernel (``tests/processor/strategies/test_exactness.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from processor.attention.module import SelfAttention
from processor.config import ProcessorConfig
from processor.distributed.consistency import LayoutAgreement
from processor.distributed.mesh import GroupLike, ModelMesh, process_group_of
from processor.distributed.parameter_split import (
    full_state_dict,
    load_full_state_dict,
    mark_split_parameters,
)
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Transport
from processor.mlp import make_mlp
from processor.segments import normalise_segment_ids, segment_ids_kind
from processor.strategies.base import ShardContext, Strategy


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ProcessorConfig) -> None:
        super().__init__()
        c = config
        self.attn_norm = nn.LayerNorm(c.num_channels)
        self.attn = SelfAttention(
            c.num_channels,
            c.num_heads,
            c.window_size,
            c.qk_norm,
            c.dropout_p,
            c.attention_block_size,
            qk_norm_bias=c.qk_norm_bias,
            path=c.attention_path,
            attn_channels=c.attn_channels,
            softcap=c.softcap,
            alibi=c.use_alibi_slopes,
            rotary=c.use_rotary_embeddings,
        )
        self.mlp_norm = nn.LayerNorm(c.num_channels)
        self.mlp = make_mlp(c.num_channels, c.mlp_hidden, c.activation, c.mlp_implementation)

    def forward(self, x: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` -> same shape, as the context's strategy plans it."""
        return ctx.strategy.block(self, x, ctx)


class TransformerProcessor(nn.Module):
    """Transformer processor on ``(batch, points, channels)``, split over a model-parallel group.

    Built from a :class:`~processor.ProcessorConfig` (hyper-parameters and strategy) or its
    fields as keyword arguments.
    Parameters are built the same on every rank and for every strategy (same seed, same
    values); ``shard_channels`` then keeps each rank's share (:meth:`split_parameters`).
    After backward each rank's replicated parameter gradients hold its own points'
    contributions: wrap the model with :func:`processor.distributed.parallelize_gradients` to
    have backward sum them into the one-rank gradient, or call
    :func:`processor.distributed.sum_model_parallel_gradients` yourself.

    What "right" means is executable: on any number of ranks the output and every gradient
    equal one rank's, and one rank's equal the dense reference
    :func:`processor.attention.dense_window_attention` (see the module docstring).
    """

    def __init__(self, config: ProcessorConfig | None = None, **settings: Any) -> None:
        """Build from ``config``, or from its fields as keywords (``TransformerProcessor(num_layers=2,
        num_channels=64, num_heads=4, window_size=16)``, or ``**processor_kwargs_from_anemoi(cfg)``)."""
        super().__init__()
        if config is None:
            config = ProcessorConfig.from_mapping(settings)
        elif settings:
            raise TypeError(f"give a ProcessorConfig or its settings, not both: {sorted(settings)}")
        if not isinstance(config, ProcessorConfig):
            raise TypeError(f"TransformerProcessor takes a ProcessorConfig, got {type(config).__name__}")
        self.config = config
        self.strategy = config.resolved_strategy()
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.parameter_split = ParameterSplit()
        self.layout_agreement = LayoutAgreement()  # the layouts agreed so far (a copy starts with none)

    def forward(
        self,
        x: Tensor,
        group: GroupLike = None,
        shard_sizes: Sequence[int] | None = None,
        *,
        segment_ids: Tensor | None = None,
        transport: Transport | None = None,
    ) -> Tensor:
        """Run the processor on this rank's block of points.

        Args:
            x: ``(batch, local_points, channels)``, this rank's contiguous block of points.
            group: the model-parallel group, or a 1-D device mesh of it (e.g. ``mesh["mp"]``),
                or what :meth:`build_groups` made of it (a strategy that splits more than one
                mesh axis, ``shard_hybrid``, needs that); ``None`` for one rank.
            shard_sizes: optional points per rank, checked against the actual blocks
                (gathered from the ranks either way).
            segment_ids: optional integer ids of this rank's points, ``(batch, local_points)``
                or ``(local_points,)``, sharded like ``x``: a point attends only to points of
                its own id (and within the window). Several grids, domains or members packed
                into one sequence, or padding, then never mix.
            transport: what sends the bytes (default: torch.distributed, uncounted); pass one
                with a :class:`~processor.distributed.CommCounter` to count them.
        Returns:
            ``(batch, local_points, channels)`` for the same points.
        Raises:
            ValueError: on every rank of the group, for input or configuration that any rank
                gets wrong (shapes, channels, shard sizes, segment ids, any processor setting).
        """
        ctx = self._context(x, process_group_of(group), shard_sizes, transport or Transport(), segment_ids)
        if ctx.world_size > 1:
            ctx = replace(ctx, mesh=self._mesh(group, ctx.world_size))
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
        self,
        x: Tensor,
        group: dist.ProcessGroup | None,
        shard_sizes: Sequence[int] | None,
        transport: Transport,
        segment_ids: Tensor | None,
    ) -> ShardContext:
        world = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        split_problem = self.parameter_split.problem(rank, world, self.strategy)
        settings = {
            **self.config.describe(),
            "segment_ids": segment_ids_kind(segment_ids, x),
            "parameters": split_problem or "usable",  # agreed: ranks differing here all raise
        }
        if world == 1:
            self.config.check_world_size(1)
            _check_single_rank(x, self.config.num_channels, shard_sizes)
            layout = ShardLayout((x.shape[1],), 0)
        else:
            # Agree first: ranks with different settings all raise here, together (once per
            # shape, group and settings: see LayoutAgreement for what the ranks must keep to).
            layout = self.layout_agreement.layout(x, group, self.config.num_channels, settings, shard_sizes)
            self.config.check_world_size(world)
        if split_problem is not None:
            raise ValueError(split_problem)
        if self.parameter_split.world_size > 1:
            mark_split_parameters(self)  # a copy or swap of the parameters drops their marks
        ids = normalise_segment_ids(segment_ids, x)  # the same error on every rank: the kinds agreed
        return ShardContext.build(group, layout, self.strategy, transport, self.config.window_size, ids)

    def build_groups(self, group: GroupLike) -> ModelMesh | None:
        """The model-parallel ``group`` as a mesh with this model's strategy's degrees
        (:class:`~processor.distributed.mesh.ModelMesh`), what :meth:`forward` takes as its
        group: made once per run, every rank of the world calling together (a strategy that
        splits several axes creates their groups). None for one rank."""
        plain = process_group_of(group)
        if plain is None or dist.get_world_size(plain) == 1:
            return None
        world = dist.get_world_size(plain)
        self.config.check_world_size(world)
        return ModelMesh.build(plain, self.strategy.degrees(self.config.num_heads, world))

    def _mesh(self, group: GroupLike, world: int) -> ModelMesh:
        """``group`` as the mesh this model's strategy lays its ranks out on: the mesh given
        (checked), or the plain group's when the strategy splits one axis only."""
        dims = self.strategy.degrees(self.config.num_heads, world)
        if isinstance(group, ModelMesh) and group.dims == dims:
            return group
        if len(dims.split_axes) <= 1 and not isinstance(group, ModelMesh):
            return ModelMesh.build(process_group_of(group), dims)  # one axis: no groups to create
        given = f"a mesh of {group.dims.describe()}" if isinstance(group, ModelMesh) else "the plain group"
        raise ValueError(
            f"strategy {self.strategy.name!r} runs on a mesh of {dims.describe()}: pass "
            f"group=model.build_groups(group), built once on every rank, instead of {given}"
        )

    def split_parameters(self, group: GroupLike) -> None:
        """Keep only this rank's share of the parameters, for strategies that split them
        (``shard_channels``); a no-op for the others. Every rank of ``group`` calls it once,
        on a model built identically everywhere (same seed or same weights), before the
        optimiser is built."""
        group = process_group_of(group)
        rank, world = (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))
        if self.parameter_split.world_size != 1:
            raise RuntimeError(f"the parameters are already split ({self.parameter_split})")
        self.config.check_world_size(world)
        if world == 1:
            return
        for block in self.blocks:
            self.strategy.split_parameters(block, rank, world)
        if mark_split_parameters(self):
            self.parameter_split = ParameterSplit(rank, world)

    def full_state_dict(self, group: GroupLike = None) -> dict[str, Tensor]:
        """The state dict as one rank holding every parameter has it (split parameters gathered
        from ``group``, every rank of which calls): what a checkpoint stores, loadable on any
        rank count and strategy with :meth:`load_full_state_dict`."""
        return full_state_dict(self, process_group_of(group) if self.parameter_split.world_size > 1 else None)

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load a full state dict, keeping this rank's share of each split parameter."""
        load_full_state_dict(self, state, self.parameter_split.rank)


@dataclass(frozen=True)
class ParameterSplit:
    """Which share of the parameters this model holds: rank ``rank`` of ``world_size`` (1: all)."""

    rank: int = 0
    world_size: int = 1

    def problem(self, rank: int, world_size: int, strategy: Strategy) -> str | None:
        """Why a forward as rank ``rank`` of ``world_size`` under ``strategy`` cannot use these
        parameters (None: it can)."""
        if world_size > 1 and strategy.splits_parameters and self.world_size == 1:
            return (
                f"strategy {strategy.name!r} runs on this rank's share of the parameters: call "
                "model.split_parameters(group) once, before building the optimiser"
            )
        if self.world_size == 1 or (rank, self.world_size) == (self.rank, world_size):
            return None
        return (
            f"the parameters were split for rank {self.rank} of {self.world_size} "
            f"(split_parameters), this forward runs as rank {rank} of {world_size}: split them for this group"
        )


def _run_blocks(blocks: nn.ModuleList, x: Tensor, ctx: ShardContext) -> Tensor:
    for block in blocks:
        x = block(x, ctx)
    return x


def _check_single_rank(x: Tensor, channels: int, shard_sizes: Sequence[int] | None) -> None:
    if x.dim() != 3 or x.shape[2] != channels:
        raise ValueError(f"input must be (batch, points, {channels}), got {tuple(x.shape)}")
    if shard_sizes is not None and list(shard_sizes) != [x.shape[1]]:
        raise ValueError(f"shard_sizes {list(shard_sizes)} do not match {x.shape[1]} points on one rank")
