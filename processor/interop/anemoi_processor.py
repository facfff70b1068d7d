"""gridshard's processor behind anemoi-models' ``TransformerProcessor`` interface.

Put it in an anemoi model by its config (no anemoi code changes)::

    model:
      processor:
        _target_: processor.interop.anemoi_processor.AnemoiTransformerProcessor
        strategy: shard_sequence      # gridshard's; the rest are anemoi's own keys
        num_layers: 16
        num_channels: ${model.num_channels}
        num_chunks: 2
        num_heads: 16
        window_size: 512
        mlp_hidden_ratio: 4
        ...

It takes anemoi's arguments, runs on anemoi's layout (``(batch * local_grid, C)``, this
rank's contiguous block of grid points, the sizes in ``shard_info.nodes``) and its state dict
has anemoi's names, so an anemoi checkpoint loads into it and its checkpoints load into
anemoi. As with anemoi's own processor, each rank's parameter gradients hold its points'
share: anemoi's trainer sums them over the model group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from processor.interop.anemoi import (
    AnemoiConversionError,
    from_anemoi_state_dict,
    processor_kwargs_from_anemoi,
    to_anemoi_state_dict,
)
from processor.strategies import resolve_strategy
from processor.transformer import TransformerProcessor

_INNER = "processor."  # the wrapped TransformerProcessor's attribute name


class AnemoiTransformerProcessor(nn.Module):
    """anemoi-models' ``TransformerProcessor`` signature, gridshard's sharding strategies.

    Args:
        strategy: a gridshard strategy that keeps the weights whole: ``shard_sequence``
            (default), ``shard_heads`` or ``none``.
        **anemoi_settings: anemoi's processor settings (``num_layers``, ``num_channels``,
            ``num_heads``, ``window_size``, ...; see
            :func:`processor.interop.anemoi.processor_kwargs_from_anemoi`).
    """

    def __init__(self, *, strategy: str = "shard_sequence", **anemoi_settings: Any) -> None:
        super().__init__()
        if resolve_strategy(strategy).splits_parameters:
            raise AnemoiConversionError(
                f"strategy = {strategy} splits the weights over the model group, which anemoi's trainer "
                "does not expect: use shard_sequence or shard_heads"
            )
        kwargs = processor_kwargs_from_anemoi(anemoi_settings)
        self.processor = TransformerProcessor(**kwargs, strategy=strategy)
        self.num_layers, self.num_channels = kwargs["num_layers"], kwargs["num_channels"]
        self.num_chunks = kwargs.get("num_chunks", 1)
        self.register_state_dict_post_hook(_state_dict_to_anemoi)
        self.register_load_state_dict_pre_hook(_state_dict_from_anemoi)

    def forward(
        self,
        x: Tensor,
        batch_size: int,
        shard_info: Any = None,
        edge_attr: Tensor | None = None,
        edge_index: Tensor | None = None,
        model_comm_group: dist.ProcessGroup | None = None,
        *,
        shard_shapes: Sequence[Sequence[int]] | None = None,
        cond: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """``(batch_size * local_grid, C)`` -> same shape, as anemoi's processor.

        Args:
            x: this rank's rows, batch-major (``(batch grid) C``).
            batch_size: samples in ``x``.
            shard_info: anemoi's ``GraphShardInfo``; ``.nodes`` lists each rank's rows or grid
                points (``None``: gathered from the ranks). Edges are not used.
            model_comm_group: the model-parallel group (``None``: one rank).
            shard_shapes: older anemoi versions' per-rank shapes, in place of ``shard_info``.
            cond: conditioning of anemoi's conditional norms: refused (gridshard has none).
        """
        if cond is not None:
            raise AnemoiConversionError("cond: gridshard's processor has no conditional layer norms")
        if x.ndim != 2 or batch_size < 1 or x.shape[0] % batch_size:
            raise ValueError(
                f"x must be (batch_size * local_grid, channels) with batch_size = {batch_size}, got {tuple(x.shape)}"
            )
        points = _points_per_rank(x.shape[0], batch_size, shard_info, shard_shapes, model_comm_group)
        out = self.processor(x.view(batch_size, -1, x.shape[1]), model_comm_group, points)
        return out.reshape(-1, x.shape[1])


def _points_per_rank(
    rows: int,
    batch_size: int,
    shard_info: Any,
    shard_shapes: Sequence[Sequence[int]] | None,
    group: dist.ProcessGroup | None,
) -> list[int] | None:
    """Grid points per rank from anemoi's shard description, or ``None`` when it gives none.

    anemoi counts ``.nodes`` in rows of ``(batch * grid, C)`` (its sharded runs have one
    sample), so a size that matches this rank's rows counts rows, one that matches its points
    counts points."""
    sizes = getattr(shard_info, "nodes", None)
    if sizes is None and shard_shapes is not None:
        sizes = [shape[0] for shape in shard_shapes]
    if sizes is None:
        return None
    rank = dist.get_rank(group) if group is not None else 0
    if rank >= len(sizes):
        raise ValueError(f"shard sizes {list(sizes)} have no entry for rank {rank} of the model group")
    if sizes[rank] == rows:
        if any(s % batch_size for s in sizes):
            raise ValueError(f"shard sizes {list(sizes)} (rows) are not multiples of batch_size = {batch_size}")
        return [s // batch_size for s in sizes]
    if sizes[rank] * batch_size == rows:
        return list(sizes)
    raise ValueError(
        f"shard sizes {list(sizes)} say rank {rank} holds {sizes[rank]} rows or points, but x has {rows} rows "
        f"for batch_size = {batch_size}"
    )


def _state_dict_to_anemoi(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    """``state_dict()`` hook: the processor's keys under anemoi's names (``proc.{i}....``)."""
    inner = prefix + _INNER
    ours = [key for key in state_dict if key.startswith(inner)]
    converted = to_anemoi_state_dict({key: state_dict[key] for key in ours}, prefix=inner)
    for key in ours:
        del state_dict[key]
    state_dict.update({prefix + key: tensor for key, tensor in converted.items()})


def _state_dict_from_anemoi(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """``load_state_dict()`` hook: anemoi's names (``proc.{i}....``) to the processor's."""
    theirs = [key for key in state_dict if key.startswith(prefix + "proc.")]
    if not theirs:
        return  # gridshard's own names load as they are
    converted = from_anemoi_state_dict({key: state_dict[key] for key in theirs}, prefix=prefix)
    _check_fits(module.processor, converted)
    for key in theirs:
        del state_dict[key]
    state_dict.update({prefix + _INNER + key: tensor for key, tensor in converted.items()})


def _check_fits(processor: TransformerProcessor, converted: dict[str, Tensor]) -> None:
    """One line naming the first difference between a checkpoint and this processor."""
    layers = len({key.split(".")[1] for key in converted})
    if layers != processor.config.num_layers:
        raise AnemoiConversionError(
            f"the checkpoint has {layers} processor layers, this processor num_layers = {processor.config.num_layers}"
        )
    own = processor.state_dict()
    for key, tensor in converted.items():
        if key in own and own[key].shape != tensor.shape:
            raise AnemoiConversionError(
                f"{key}: the checkpoint's is {tuple(tensor.shape)}, this processor's {tuple(own[key].shape)} "
                "(num_channels, num_heads or mlp_hidden_ratio differ)"
            )
