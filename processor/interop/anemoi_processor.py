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
rank's contiguous block of grid points, the sizes in ``shard_info.nodes``), and its module tree
is anemoi's: ``proc`` a ``ModuleList`` of per-layer blocks with ``layer_norm_attention``,
``attention.lin_q/lin_k/lin_v``, ``attention.projection``, ``attention.q_norm/k_norm``,
``layer_norm_mlp`` and ``mlp.mlp[0..2]``, and the attributes ``num_layers``, ``num_channels``,
``num_chunks``, ``chunk_size`` and ``gradient_checkpointing``, read at each forward as anemoi
reads them. So ``named_parameters()`` and ``state_dict()`` have anemoi's names: anemoi
checkpoints load into it, its checkpoints load into anemoi, and anemoi code that freezes or
tunes submodules by name finds them.

Those anemoi-named modules hold the only parameters. The gridshard
:class:`~processor.TransformerProcessor` that runs them is kept out of the module tree (so it
adds no second name for a parameter) and is built on the same module objects
(:mod:`processor.interop.anemoi_modules` explains how its fused q/k/v projection reads anemoi's
three): ``.to()``, ``.apply()``, ``requires_grad_()``, optimisers and Lightning all see anemoi's
tree, and the processor computes with whatever they leave there. As with anemoi's own
processor, each rank's parameter gradients hold its points' share: anemoi's trainer sums them
over the model group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from processor.interop.anemoi import AnemoiConversionError, processor_kwargs_from_anemoi
from processor.interop.anemoi_modules import anemoi_blocks
from processor.strategies import resolve_strategy
from processor.transformer import TransformerProcessor


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
        self.num_layers, self.num_channels = kwargs["num_layers"], kwargs["num_channels"]
        self.num_chunks = anemoi_settings.get("num_chunks", 1)
        if not isinstance(self.num_chunks, int) or self.num_chunks < 1 or self.num_layers % self.num_chunks:
            raise AnemoiConversionError(
                f"num_chunks = {self.num_chunks} must be an integer >= 1 dividing num_layers = {self.num_layers}"
            )
        self.chunk_size = self.num_layers // self.num_chunks
        self.gradient_checkpointing = bool(anemoi_settings.get("gradient_checkpointing", True))
        processor = TransformerProcessor(**kwargs, strategy=strategy)
        self.proc = anemoi_blocks(processor)
        # A plain attribute, not a submodule: its parameters are proc's, under anemoi's names only.
        object.__setattr__(self, "_gridshard", processor)
        self.register_load_state_dict_pre_hook(_check_anemoi_state_dict)

    @property
    def processor(self) -> TransformerProcessor:
        """The gridshard processor that runs ``proc``'s parameters (outside the module tree)."""
        return self._gridshard

    def train(self, mode: bool = True) -> AnemoiTransformerProcessor:
        """As ``nn.Module.train``, and the gridshard processor's attention (its dropout) follows."""
        super().train(mode)
        self._gridshard.train(mode)
        return self

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
        self._follow_checkpointing()
        out = self._gridshard(x.view(batch_size, -1, x.shape[1]), model_comm_group, points)
        return out.reshape(-1, x.shape[1])

    def _follow_checkpointing(self) -> None:
        """Checkpoint chunks of ``chunk_size`` layers when ``gradient_checkpointing``, none
        otherwise, as anemoi reads these attributes at each forward (gridshard: ``num_chunks = 0``
        checkpoints nothing)."""
        if self.chunk_size < 1 or self.num_layers % self.chunk_size:
            raise ValueError(f"chunk_size = {self.chunk_size} must divide num_layers = {self.num_layers}")
        chunks = self.num_layers // self.chunk_size if self.gradient_checkpointing else 0
        if self._gridshard.config.num_chunks != chunks:
            self._gridshard.config = replace(self._gridshard.config, num_chunks=chunks)


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


def _check_anemoi_state_dict(
    module: AnemoiTransformerProcessor,
    state_dict: dict,
    prefix: str,
    local_metadata: Any,
    strict: bool,
    *args: Any,
) -> None:
    """``load_state_dict()`` hook: one line for a checkpoint of another depth (strict loads
    only) or width, where torch would list every key. Keys this processor lacks (q/k/v biases,
    another MLP kind) torch reports as unexpected."""
    theirs = {key[len(prefix) :]: tensor for key, tensor in state_dict.items() if key.startswith(prefix + "proc.")}
    if not theirs:
        return  # torch reports the missing keys
    layers = len({name.split(".")[1] for name in theirs})
    if strict and layers != module.num_layers:
        raise AnemoiConversionError(
            f"the checkpoint has {layers} processor layers, this processor num_layers = {module.num_layers}"
        )
    own = module.state_dict()
    for name, tensor in theirs.items():
        if name in own and own[name].shape != tensor.shape:
            raise AnemoiConversionError(
                f"{prefix}{name}: the checkpoint's is {tuple(tensor.shape)}, this processor's "
                f"{tuple(own[name].shape)} (num_channels, attn_channels, num_heads or mlp_hidden_ratio differ)"
            )
