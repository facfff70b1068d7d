"""The processor's configuration: every argument that shapes it, typed and checked in one place.

:class:`ProcessorConfig` is what :class:`~processor.TransformerProcessor` is built from; the
training app and the benchmarks build it from their Hydra sections with
:meth:`ProcessorConfig.from_mapping` (an unknown key is an error) and check it against the
model-parallel group size with :meth:`ProcessorConfig.check_world_size`. Its
:meth:`~ProcessorConfig.fingerprint` covers every field, so ranks built from different
configurations fail together at the first forward.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.attention.dispatch import PATHS, SCORE_MOD_PATHS
from processor.distributed.consistency import settings_fingerprint
from processor.errors import UserError
from processor.mlp import ACTIVATIONS, MLP_IMPLEMENTATIONS
from processor.strategies import Strategy, resolve_strategy


class ConfigError(UserError):
    """A processor setting out of range: ``key`` names it (as a :class:`ProcessorConfig` field)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class ProcessorConfig:
    """Hyper-parameters and model-parallel strategy of a :class:`~processor.TransformerProcessor`.

    Args:
        num_layers: transformer blocks.
        num_channels: channels ``C``; must be divisible by ``num_heads``.
        num_heads: attention heads.
        window_size: ``W``; point ``i`` attends to points ``j`` with ``|i - j| <= W`` in the
            grid's 1-D point order. ``None``: global attention.
        mlp_hidden_ratio: MLP hidden channels = ``mlp_hidden_ratio * C`` rounded to the nearest
            integer, halves up (as anemoi-models rounds it).
        num_chunks: the layers run in this many consecutive chunks, each under activation
            checkpointing (recomputed in backward) as in anemoi; ``0`` disables checkpointing.
            Must divide ``num_layers``.
        dropout_p: dropout on the attention weights (training only).
        qk_norm: LayerNorm over each head's queries and keys.
        qk_norm_bias: whether those LayerNorms have a bias (anemoi's have none: the converters
            in :mod:`processor.interop.anemoi` set ``False``, so both directions are lossless).
        activation: one of :data:`processor.mlp.ACTIVATIONS`.
        strategy: a built-in strategy's name (``none``, ``shard_heads``, ``shard_sequence``,
            ``shard_channels``) or a :class:`~processor.strategies.Strategy` instance of your own.
        attention_block_size: query rows per block in the windowed kernel (None: ``W / 2``).
        attention_path: the windowed kernel, one of :data:`processor.attention.dispatch.PATHS`:
            ``auto`` picks by device, dtype and whether a gradient is needed (docs/attention.md, "Attention
            paths"); any other forces that path, for tests and benchmarks.
        attn_channels: the attention's width ``A`` (q, k, v ``C -> A``, projection ``A -> C``;
            ``A / num_heads`` per head); None: ``num_channels``.
        mlp_implementation: ``mlp`` (``activation`` between two linears) or a gated MLP as
            anemoi's ``GatedMLPLayer``: ``glu`` (sigmoid gate), ``swiglu`` (SiLU), ``geglu``
            (GELU), ``reglu`` (ReLU); ``gate(x W_g) * (x W_v)`` then a linear, ``activation``
            unused.
        softcap: logits ``s`` become ``softcap * tanh(s / softcap)``; None: none.
        use_alibi_slopes: add ``-slope_h * |i - j|`` (global point indices, anemoi's slopes).
        use_rotary_embeddings: rotate q and k by their global point index (flash-attn's rotary
            embedding, as anemoi's flash-attention path; ``head_dim`` must be even).
            The three work on every device and strategy (:mod:`processor.attention.score_mods`);
            softcap and ALiBi need ``attention_path`` ``auto``, ``scored`` or ``flex``.
    """

    num_layers: int
    num_channels: int
    num_heads: int
    window_size: int | None = None
    mlp_hidden_ratio: float = 4.0
    num_chunks: int = 1
    dropout_p: float = 0.0
    qk_norm: bool = False
    qk_norm_bias: bool = True
    activation: str = "gelu"
    strategy: str | Strategy = "none"
    attention_block_size: int | None = None
    attention_path: str = "auto"
    attn_channels: int | None = None
    mlp_implementation: str = "mlp"
    softcap: float | None = None
    use_alibi_slopes: bool = False
    use_rotary_embeddings: bool = False

    def __post_init__(self) -> None:
        for key, ok, expected in _RULES:
            if not ok(self):
                raise ConfigError(key, f"{getattr(self, key)!r} is out of range: expected {expected}")
        if self.inner_channels % self.num_heads:
            width = "attn_channels" if self.attn_channels is not None else "num_channels"
            raise ConfigError(
                "num_heads", f"{width} ({self.inner_channels}) is not divisible by num_heads ({self.num_heads})"
            )
        if self.use_rotary_embeddings and self.head_dim % 2:
            raise ConfigError("use_rotary_embeddings", f"rotary embeddings need an even head_dim, not {self.head_dim}")
        if self.softcap is not None or self.use_alibi_slopes:
            if self.attention_path not in SCORE_MOD_PATHS:
                raise ConfigError(
                    "attention_path",
                    f"{self.attention_path!r} applies no softcap or ALiBi: choose one of {list(SCORE_MOD_PATHS)}",
                )
            if self.dropout_p > 0:
                raise ConfigError(
                    "dropout_p", f"{self.dropout_p}: the paths that apply a softcap or ALiBi have no attention dropout"
                )
        if self.num_chunks > 0 and self.num_layers % self.num_chunks:
            raise ConfigError(
                "num_chunks", f"{self.num_chunks} must be 0 (no checkpointing) or divide num_layers ({self.num_layers})"
            )
        try:
            resolve_strategy(self.strategy)
        except ValueError as exc:
            raise ConfigError("strategy", str(exc)) from None

    @property
    def inner_channels(self) -> int:
        """The attention's width: ``attn_channels``, or ``num_channels``."""
        return self.num_channels if self.attn_channels is None else self.attn_channels

    @property
    def head_dim(self) -> int:
        return self.inner_channels // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return mlp_hidden_channels(self.num_channels, self.mlp_hidden_ratio)

    def resolved_strategy(self) -> Strategy:
        """The strategy object (a built-in's instance when ``strategy`` is a name)."""
        return resolve_strategy(self.strategy)

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`ConfigError` (key ``strategy``) if the strategy cannot run this
        configuration on a model-parallel group of ``world_size`` ranks."""
        try:
            self.resolved_strategy().check(self.num_heads, self.window_size, world_size)
        except ValueError as exc:
            raise ConfigError("strategy", str(exc)) from None

    def describe(self) -> dict[str, str]:
        """Every field as text (the strategy by its ``repr``, which names its options)."""
        values = {f.name: repr(getattr(self, f.name)) for f in dataclasses.fields(self)}
        values["strategy"] = repr(self.resolved_strategy())
        return values

    def fingerprint(self) -> int:
        """A 32-bit hash of every field, equal on every rank for equal configurations."""
        return settings_fingerprint(self.describe())

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], **overrides: Any) -> ProcessorConfig:
        """Build from a mapping of field names (e.g. a config section), ``overrides`` on top.

        Raises:
            ConfigError: naming a key that is not a field, or the first value out of range.
        """
        merged = {**values, **overrides}
        names = field_names()
        unknown = sorted(set(merged) - set(names))
        if unknown:
            raise ConfigError(unknown[0], f"not a processor setting; the settings are {list(names)}")
        return cls(**merged)


def mlp_hidden_channels(num_channels: int, mlp_hidden_ratio: float) -> int:
    """The MLP's hidden width: ``ratio * C`` to the nearest integer, halves up (as in anemoi)."""
    return int(num_channels * mlp_hidden_ratio + 0.5)


def field_names() -> tuple[str, ...]:
    """The names of :class:`ProcessorConfig`'s fields, in order."""
    return tuple(f.name for f in dataclasses.fields(ProcessorConfig))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_RULES = (
    ("num_layers", lambda c: _is_int(c.num_layers) and c.num_layers >= 1, "an integer >= 1"),
    ("num_channels", lambda c: _is_int(c.num_channels) and c.num_channels >= 1, "an integer >= 1"),
    ("num_heads", lambda c: _is_int(c.num_heads) and c.num_heads >= 1, "an integer >= 1"),
    (
        "window_size",
        lambda c: c.window_size is None or (_is_int(c.window_size) and c.window_size >= 0),
        "an integer >= 0 or None",
    ),
    (
        "mlp_hidden_ratio",
        lambda c: math.isfinite(c.mlp_hidden_ratio) and c.mlp_hidden_ratio > 0 and c.mlp_hidden >= 1,
        "> 0, giving at least one hidden channel",
    ),
    ("num_chunks", lambda c: _is_int(c.num_chunks) and c.num_chunks >= 0, "an integer >= 0"),
    ("dropout_p", lambda c: 0.0 <= c.dropout_p < 1.0, "in [0, 1)"),
    ("qk_norm", lambda c: isinstance(c.qk_norm, bool), "true or false"),
    ("qk_norm_bias", lambda c: isinstance(c.qk_norm_bias, bool), "true or false"),
    ("activation", lambda c: c.activation in ACTIVATIONS, f"one of {list(ACTIVATIONS)}"),
    (
        "attention_block_size",
        lambda c: c.attention_block_size is None or (_is_int(c.attention_block_size) and c.attention_block_size >= 1),
        "an integer >= 1 or None",
    ),
    ("attention_path", lambda c: c.attention_path in PATHS, f"one of {list(PATHS)}"),
    (
        "attn_channels",
        lambda c: c.attn_channels is None or (_is_int(c.attn_channels) and c.attn_channels >= 1),
        "an integer >= 1 or None (num_channels)",
    ),
    (
        "mlp_implementation",
        lambda c: c.mlp_implementation in MLP_IMPLEMENTATIONS,
        f"one of {list(MLP_IMPLEMENTATIONS)}",
    ),
    (
        "softcap",
        lambda c: c.softcap is None or (_is_number(c.softcap) and math.isfinite(c.softcap) and c.softcap > 0),
        "a number > 0 or None",
    ),
    ("use_alibi_slopes", lambda c: isinstance(c.use_alibi_slopes, bool), "true or false"),
    ("use_rotary_embeddings", lambda c: isinstance(c.use_rotary_embeddings, bool), "true or false"),
)
