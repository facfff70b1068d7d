"""anemoi-models' module tree over gridshard's parameters: one set of parameters, two views.

anemoi code walks its processor by name: ``proc[i].attention.lin_q``, ``proc[i].mlp.mlp[0]``,
``proc[i].layer_norm_attention`` (freezing, per-layer learning rates, loading by parameter
name). :func:`anemoi_blocks` builds that tree out of a gridshard
:class:`~processor.TransformerProcessor`'s own modules, so both trees hold the *same* module
objects (not copies): the layer norms, the output projection, the q/k norms and the MLP.

The one parameter that has no anemoi equivalent is gridshard's fused ``qkv`` (3C x C);
anemoi has three C x C matrices. Slices of one fused Parameter cannot be Parameters of their
own (a slice is not a leaf: its ``.grad`` stays empty, an optimiser stepping it does not step
the fused one, freezing it raises). So anemoi's ``lin_q``/``lin_k``/``lin_v`` are the real
parameters and gridshard's ``attn.qkv`` becomes :class:`FusedQKV`, which concatenates them at
each call. ``F.linear`` on the concatenation is the very operation gridshard ran on its fused
weight, and autograd splits its gradient back into the three: outputs and gradients are
bit-for-bit what the fused parameter gave. The cost is one ``3C x C`` copy per call (kept for
backward unless the chunk is checkpointed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from processor.attention.module import SelfAttention
from processor.transformer import TransformerBlock, TransformerProcessor


class FusedQKV(nn.Module):
    """gridshard's ``attn.qkv`` read from anemoi's three projections: ``(..., C)`` -> ``(..., 3C)``."""

    def __init__(self, lin_q: nn.Linear, lin_k: nn.Linear, lin_v: nn.Linear) -> None:
        super().__init__()
        self.lin_q, self.lin_k, self.lin_v = lin_q, lin_k, lin_v

    @property
    def weight(self) -> Tensor:
        """``(3C, C)``, ``[q; k; v]``: a fresh concatenation, differentiable into all three."""
        return torch.cat([self.lin_q.weight, self.lin_k.weight, self.lin_v.weight])

    def forward(self, h: Tensor) -> Tensor:
        """``(..., C)`` -> ``(..., 3C)``, q, k and v side by side."""
        return F.linear(h, self.weight)


class AnemoiAttention(nn.Module):
    """anemoi's ``MultiHeadSelfAttention`` names: ``lin_q``, ``lin_k``, ``lin_v`` (A x C, no bias),
    ``projection`` (C x A, bias) and, with ``qk_norm``, ``q_norm`` and ``k_norm`` (over head_dim).

    Holds parameters only; gridshard's strategies run the attention."""

    def __init__(self, attn: SelfAttention, qk_norm: bool) -> None:
        super().__init__()
        c = attn.proj.out_features
        q, k, v = attn.qkv.weight.detach().chunk(3)
        self.lin_q, self.lin_k, self.lin_v = (_linear_from(w, c) for w in (q, k, v))
        self.projection = attn.proj
        if qk_norm:  # anemoi registers no norm modules without it
            self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.attn_channels, self.window_size, self.dropout_p = attn.inner_channels, attn.window_size, attn.dropout_p
        self.qk_norm, self.softcap = qk_norm, attn.softcap
        self.use_alibi_slopes, self.use_rotary_embeddings = attn.alibi, attn.rotary


class AnemoiMLP(nn.Module):
    """anemoi's ``MLP`` names: ``mlp`` the ``Linear, activation, Linear`` sequence, or, gated,
    ``GatedMLPLayer (gate_proj, value_proj), Linear``."""

    def __init__(self, mlp: nn.Sequential) -> None:
        super().__init__()
        self.mlp = mlp


class AnemoiBlock(nn.Module):
    """anemoi's ``TransformerProcessorBlock`` names: ``layer_norm_attention``, ``layer_norm_mlp``,
    ``attention`` and ``mlp``, around a gridshard block's modules (shared, not copied)."""

    def __init__(self, block: TransformerBlock, qk_norm: bool) -> None:
        super().__init__()
        self.layer_norm_attention = block.attn_norm
        self.layer_norm_mlp = block.mlp_norm
        self.attention = AnemoiAttention(block.attn, qk_norm)
        self.mlp = AnemoiMLP(block.mlp)

    def forward(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "an AnemoiTransformerProcessor's blocks hold its parameters; the processor runs them "
            "(gridshard's strategies exchange points between its layers): call the processor"
        )


def anemoi_blocks(processor: TransformerProcessor) -> nn.ModuleList:
    """``proc``: one :class:`AnemoiBlock` per layer of ``processor``, sharing its modules.

    ``processor``'s fused ``qkv`` projections are replaced by :class:`FusedQKV` over the new
    ``lin_q``/``lin_k``/``lin_v`` (initialised with the fused weight's rows), so from here on the
    two trees hold one set of parameters."""
    qk_norm = processor.config.qk_norm
    proc = nn.ModuleList(AnemoiBlock(block, qk_norm) for block in processor.blocks)
    for block, theirs in zip(processor.blocks, proc):
        block.attn.qkv = FusedQKV(theirs.attention.lin_q, theirs.attention.lin_k, theirs.attention.lin_v)
    return proc


def _linear_from(weight: Tensor, in_features: int) -> nn.Linear:
    """A bias-free ``nn.Linear`` holding a copy of ``weight`` (its own leaf Parameter); built on
    the meta device so that it draws nothing from the random generator."""
    linear = nn.Linear(in_features, weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight.clone())
    return linear
