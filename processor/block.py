"""One pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

from __future__ import annotations

from torch import Tensor, nn

from processor.attention.module import SelfAttention
from processor.strategies.base import ShardContext, Strategy

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
}


def make_activation(name: str) -> nn.Module:
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted([*ACTIVATIONS, 'gelu_tanh'])}")
    return ACTIVATIONS[name]()


class MLP(nn.Sequential):
    """``(..., C)`` -> ``(..., C)`` through a hidden layer of ``hidden`` channels."""

    def __init__(self, num_channels: int, hidden: int, activation: str) -> None:
        super().__init__(nn.Linear(num_channels, hidden), make_activation(activation), nn.Linear(hidden, num_channels))


class TransformerBlock(nn.Module):
    def __init__(
        self,
        num_channels: int,
        num_heads: int,
        window_size: int | None,
        mlp_hidden: int,
        activation: str,
        strategy: Strategy,
        qk_norm: bool,
        dropout_p: float,
        attention_block_size: int | None,
    ) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(num_channels)
        self.attn = SelfAttention(
            num_channels, num_heads, window_size, strategy, qk_norm, dropout_p, attention_block_size
        )
        self.mlp_norm = nn.LayerNorm(num_channels)
        self.mlp = MLP(num_channels, mlp_hidden, activation)

    def forward(self, x: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` -> same shape."""
        x = x + self.attn(self.attn_norm(x), ctx)
        return x + self.mlp(self.mlp_norm(x))
