"""A sharded region inside a bigger model: split a replicated tensor into this rank's block of
points, run model-parallel layers on the blocks, gather the blocks back into the full tensor::

    x (full, equal on every rank) -> shard_points -> x_local -> processor -> y_local -> gather_points -> y (full)

Each step is one autograd function with its own backward, for any number of points ``N`` and
ranks ``P`` (contiguous blocks balanced as :func:`shard_sizes` makes them, larger first, or
any split passed as ``sizes``; empty blocks when ``N < P``), along any dim, in any dtype.
Neither divides a gradient by the group size.

- :func:`shard_points`: forward keeps this rank's block (no communication); backward
  all-gathers the blocks' gradients into the full gradient, on every rank. Replicated layers
  *before* the region so get the full, one-rank gradient on every rank.
- :func:`reduce_scatter_points`: the sum over the ranks of a full tensor that differs by rank
  (partial sums), this rank's block of it (a reduce-scatter); backward all-gathers. It is
  the transpose of ``gather_points(..., downstream="rank_local")``, as tensor-parallel
  layers use it.
- :func:`gather_points`: forward all-gathers the blocks into the full tensor on every rank;
  backward depends on the loss computed from that tensor (``downstream=``):

  ``"replicated"`` (default): every rank computes the *same* loss from the same full tensor,
  so its gradient is equal on every rank; backward keeps this rank's block (no
  communication). Choosing ``"rank_local"`` here sums ``P`` equal gradients: everything
  upstream comes out ``P`` times too large.

  ``"rank_local"``: each rank computes a *different* loss (its own members, samples or
  variables) and the loss trained is their sum; backward sums the gradient over the ranks and
  keeps this rank's block (a reduce-scatter). Choosing ``"replicated"`` here keeps only this
  rank's own loss's gradient on each block: the other ranks' contributions are missing.

Parameter gradients: layers *inside* the region (the processor) hold their own points'
contributions only; sum them over the group (:func:`sum_model_parallel_gradients` or
:func:`parallelize_gradients`). Replicated layers before :func:`shard_points` are complete
as they are: summing them would make them ``P`` times too large. Replicated layers after
:func:`gather_points` are complete with ``"replicated"``; with ``"rank_local"`` each rank
holds its own loss's part, and they are summed over the group like the region's.

Every rank of the group makes the same calls, in the same order, and runs backward. The
arguments are checked on every rank together (one small all-gather, not counted by the
transport; ``check=False`` skips it for a caller that has agreed on the layout already), so a
bad argument on any rank raises the same one-line ``ValueError`` on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.consistency import agree_on_values, settings_fingerprint
from processor.distributed.ranges import profiler_range
from processor.distributed.shards import shard_offsets, shard_sizes
from processor.distributed.transport import Transport, collective_device

Downstream = Literal["replicated", "rank_local"]
_DOWNSTREAM: tuple[str, ...] = get_args(Downstream)


@dataclass(frozen=True)
class _Blocks:
    """A tensor split along ``dim`` over ``group``: ``sizes[r]`` rows on rank ``r``, in rank order."""

    sizes: tuple[int, ...]
    rank: int
    dim: int
    group: dist.ProcessGroup
    transport: Transport

    def block(self, full: Tensor) -> Tensor:
        """``full`` with ``N`` rows on ``dim`` -> this rank's ``sizes[rank]`` rows (a contiguous copy)."""
        start = shard_offsets(list(self.sizes))[self.rank]
        return full.narrow(self.dim, start, self.sizes[self.rank]).clone(memory_format=torch.contiguous_format)

    def gather(self, local: Tensor) -> Tensor:
        """This rank's ``sizes[rank]`` rows -> every rank's rows in rank order, ``N`` on ``dim``."""
        rows = local.movedim(self.dim, 0)
        width = math.prod(rows.shape[1:])
        with profiler_range("all_gather"):
            flat = self.transport.all_gather(rows.reshape(-1), [s * width for s in self.sizes], self.group)
        return flat.view(sum(self.sizes), *rows.shape[1:]).movedim(0, self.dim).contiguous()

    def sum_block(self, full: Tensor) -> Tensor:
        """``full`` (``N`` rows on ``dim``, different on each rank) summed over the ranks -> this
        rank's ``sizes[rank]`` rows of the sum."""
        rows = full.movedim(self.dim, 0)
        width = math.prod(rows.shape[1:])
        with profiler_range("reduce_scatter"):
            flat = self.transport.reduce_scatter(rows.reshape(-1), [s * width for s in self.sizes], self.group)
        return flat.view(self.sizes[self.rank], *rows.shape[1:]).movedim(0, self.dim).contiguous()


class _ShardPoints(torch.autograd.Function):
    """Forward: this rank's block of the full tensor. Backward: all-gather the blocks' gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, blocks: _Blocks) -> Tensor:  # type: ignore[override]
        ctx.blocks = blocks
        return blocks.block(x)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return ctx.blocks.gather(grad), None


class _ReduceScatterPoints(_ShardPoints):
    """Forward: this rank's block of the sum over the ranks. Backward (:class:`_ShardPoints`'):
    all-gather the blocks' gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, blocks: _Blocks) -> Tensor:  # type: ignore[override]
        ctx.blocks = blocks
        return blocks.sum_block(x)


class _GatherPoints(torch.autograd.Function):
    """Forward: all-gather the blocks. Backward: this rank's block of the gradient, as it is
    (``replicated``) or summed over the ranks (``rank_local``)."""

    @staticmethod
    def forward(ctx, x_local: Tensor, blocks: _Blocks, downstream: str) -> Tensor:  # type: ignore[override]
        ctx.blocks, ctx.downstream = blocks, downstream
        return blocks.gather(x_local)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.downstream == "rank_local":
            return ctx.blocks.sum_block(grad), None, None
        return ctx.blocks.block(grad), None, None


def _dim_problem(x: Tensor, dim: int) -> str:
    if x.dim() == 0:
        return "a 0-d tensor has no dim to split"
    if not -x.dim() <= dim < x.dim():
        return f"dim {dim} is out of range for a {x.dim()}-d tensor of shape {tuple(x.shape)}"
    return ""


def _sizes_problem(sizes: Sequence[int] | None, world: int) -> str:
    if sizes is None:
        return ""
    if len(sizes) != world:
        return f"sizes {list(sizes)} has {len(sizes)} entries for {world} ranks"
    if any(s < 0 for s in sizes):
        return f"sizes {list(sizes)} must all be >= 0"
    return ""


def _agree(
    what: str, x: Tensor, group: dist.ProcessGroup, problem: str, common: Mapping[str, object], rows: int
) -> list[int]:
    """Every rank's ``rows`` (its block's length), once no rank reports a ``problem`` and
    ``common`` is equal on every rank; else the same one-line ``ValueError`` on every rank."""
    world = dist.get_world_size(group)
    device = collective_device(group)  # the group's, not x's: ranks sharing a GPU talk over gloo
    mine = torch.tensor([int(bool(problem)), settings_fingerprint(common), rows], dtype=torch.int64, device=device)
    table = torch.empty(world * 3, dtype=torch.int64, device=device)
    with profiler_range("agree_on_arguments"):
        dist.all_gather_single(table, mine, group=group)
        seen = table.view(world, 3).tolist()
    if any(row[0] for row in seen):
        problems: list[str] = [""] * world
        dist.all_gather_object(problems, problem, group=group)
        first = next(p for p in problems if p)
        raise ValueError(f"{what}: {first} (on ranks {[r for r, p in enumerate(problems) if p == first]})")
    if len({row[1] for row in seen}) > 1:
        agree_on_values(common, group, what=f"{what}: arguments")
        raise ValueError(f"{what}: arguments differ across ranks")  # not reached: the line above names them
    return [row[2] for row in seen]


def _world(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _grad(x: Tensor) -> bool:
    """Whether backward will run a collective for ``x``: every rank must agree on it."""
    return torch.is_grad_enabled() and x.requires_grad


def _plain(sizes: Sequence[int] | None) -> list[int] | None:
    """``sizes`` as a list of ints, so that ranks passing a tuple or a list agree."""
    return None if sizes is None else [int(s) for s in sizes]


def _split_full(
    what: str,
    x: Tensor,
    group: dist.ProcessGroup | None,
    dim: int,
    sizes: Sequence[int] | None,
    check: bool,
    transport: Transport | None,
) -> _Blocks | None:
    """The blocks to split ``x`` into, a full ``N`` rows on ``dim`` on every rank; ``None`` on one
    rank. Checked on every rank together unless ``check`` is False."""
    world = _world(group)
    problem = _dim_problem(x, dim) or _sizes_problem(sizes, world)
    d = dim % x.dim() if x.dim() else dim
    if not problem and sizes is not None and sum(sizes) != x.shape[d]:
        problem = f"sizes {list(sizes)} sum to {sum(sizes)}, not to the {x.shape[d]} rows of dim {dim}"
    if world > 1 and check:
        common = {"shape": tuple(x.shape), "dtype": x.dtype, "dim": d, "sizes": _plain(sizes), "grad": _grad(x)}
        _agree(what, x, group, problem, common, 0)
    elif problem:
        raise ValueError(f"{what}: {problem}")
    if world == 1:
        return None
    sizes = tuple(_plain(sizes) or shard_sizes(x.shape[d], world))
    return _Blocks(sizes, dist.get_rank(group), d, group, transport or Transport())


def _split_local(
    x: Tensor,
    group: dist.ProcessGroup | None,
    dim: int,
    sizes: Sequence[int] | None,
    downstream: str,
    check: bool,
    transport: Transport | None,
) -> _Blocks | None:
    """The blocks ``x`` is one of, their sizes gathered from the ranks (or, with ``check`` False
    and ``sizes`` given, trusted); ``None`` on one rank."""
    world = _world(group)
    problem = _dim_problem(x, dim) or _sizes_problem(sizes, world)
    if downstream not in _DOWNSTREAM:
        problem = problem or f"downstream must be one of {list(_DOWNSTREAM)}, got {downstream!r}"
    d = dim % x.dim() if x.dim() else dim
    rank = 0 if world == 1 else dist.get_rank(group)
    if not problem and sizes is not None and sizes[rank] != x.shape[d] and (world == 1 or not check):
        problem = f"sizes {list(sizes)} give this rank {sizes[rank]} rows, it holds {x.shape[d]} on dim {dim}"
    if world > 1 and (check or sizes is None):
        other = tuple("*" if i == d else n for i, n in enumerate(x.shape))
        common = {"shape": other, "dtype": x.dtype, "dim": d, "sizes": _plain(sizes), "downstream": downstream}
        rows = -1 if problem else x.shape[d]
        actual = _agree("gather_points", x, group, problem, {**common, "grad": _grad(x)}, rows)
        if sizes is not None and list(sizes) != actual:
            raise ValueError(f"gather_points: sizes {list(sizes)} do not match the blocks the ranks hold, {actual}")
        sizes = actual
    elif problem:
        raise ValueError(f"gather_points: {problem}")
    if world == 1:
        return None
    return _Blocks(tuple(_plain(sizes) or ()), rank, d, group, transport or Transport())


def shard_points(
    x: Tensor,
    group: dist.ProcessGroup | None,
    dim: int = 1,
    *,
    sizes: Sequence[int] | None = None,
    transport: Transport | None = None,
    check: bool = True,
) -> Tensor:
    """This rank's contiguous block of a tensor that is equal on every rank of ``group``.

    Args:
        x: the full tensor, e.g. ``(batch, N, channels)``, the same on every rank.
        group: the model-parallel group; ``None`` (or one rank): ``x`` itself.
        dim: the dim to split (negative counts from the end).
        sizes: rows per rank (``len == P``, ``sum == N``); default :func:`shard_sizes` ``(N, P)``.
        transport: what sends the backward's bytes (default: torch.distributed, uncounted).
        check: False skips the cross-rank check of the arguments (one small all-gather) for a
            caller that has agreed on them already; a rank's own mistake then raises there only.
    Returns:
        ``(batch, sizes[rank], channels)`` (for ``dim=1``): rows ``[offset, offset + sizes[rank])``.
        Backward all-gathers the blocks' gradients: the input gets the full gradient on every
        rank, summed over nothing and divided by nothing.
    Raises:
        ValueError: on every rank, if any rank's dim, sizes, shape, dtype or ``requires_grad`` is
            wrong or differs from the others'.
    """
    blocks = _split_full("shard_points", x, group, dim, sizes, check, transport)
    if blocks is None:
        return x
    return _ShardPoints.apply(x, blocks)


def reduce_scatter_points(
    x: Tensor,
    group: dist.ProcessGroup | None,
    dim: int = 1,
    *,
    sizes: Sequence[int] | None = None,
    transport: Transport | None = None,
    check: bool = True,
) -> Tensor:
    """This rank's block of the sum over the ranks of ``x``, a full tensor that differs by rank
    (partial sums, e.g. a row-parallel layer's output): the transpose of
    ``gather_points(..., downstream="rank_local")``.

    Args:
        x: this rank's term, e.g. ``(batch, N, channels)``, the same shape on every rank.
        group, dim, sizes, transport, check: as :func:`shard_points`.
    Returns:
        ``(batch, sizes[rank], channels)`` (for ``dim=1``): rows ``[offset, offset + sizes[rank])``
        of the sum. Backward all-gathers the blocks' gradients: each rank's term gets the full
        gradient of the sum.
    Raises:
        ValueError: on every rank, as :func:`shard_points`.
    """
    blocks = _split_full("reduce_scatter_points", x, group, dim, sizes, check, transport)
    if blocks is None:
        return x
    return _ReduceScatterPoints.apply(x, blocks)


def gather_points(
    x_local: Tensor,
    group: dist.ProcessGroup | None,
    dim: int = 1,
    *,
    sizes: Sequence[int] | None = None,
    downstream: Downstream = "replicated",
    transport: Transport | None = None,
    check: bool = True,
) -> Tensor:
    """Every rank's block of points, concatenated in rank order, on every rank of ``group``.

    Args:
        x_local: this rank's block, e.g. ``(batch, n_rank, channels)``; blocks may differ in
            length on ``dim`` (even be empty), all other dims must agree.
        group: the model-parallel group; ``None`` (or one rank): ``x_local`` itself.
        dim: the dim the blocks are split along (negative counts from the end).
        sizes: expected rows per rank, checked against the blocks (which are gathered anyway).
        downstream: the loss computed from the result. ``"replicated"``: the same loss on every
            rank; backward keeps this rank's block of the gradient. ``"rank_local"``: a
            different loss on each rank, the total being their sum; backward sums the gradient
            over the ranks (reduce-scatter). The wrong choice makes gradients ``P`` times too
            large (``rank_local`` for a replicated loss) or drops the other ranks' terms
            (``replicated`` for rank-local losses); see the module docstring.
        transport: what sends the bytes, forward and backward (default: torch.distributed).
        check: False, with ``sizes`` given, skips the cross-rank check (one small all-gather)
            for a caller that has agreed on the layout already.
    Returns:
        ``(batch, N, channels)`` (for ``dim=1``), ``N = sum(sizes)``, equal on every rank.
    Raises:
        ValueError: on every rank, if any rank's dim, sizes, ``downstream``, other dims, dtype or
            ``requires_grad`` is wrong or differs from the others'.
    """
    blocks = _split_local(x_local, group, dim, sizes, downstream, check, transport)
    if blocks is None:
        return x_local
    return _GatherPoints.apply(x_local, blocks, downstream)
