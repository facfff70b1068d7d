"""gridshard's processor: a model-parallel sliding-window transformer on gridded points.

No Hydra, no MLflow here: a plain PyTorch library. Build a :class:`TransformerProcessor` from
a :class:`ProcessorConfig`; :mod:`processor.distributed` has the collectives, halo exchange
and gradient reduction, :mod:`processor.strategies` the strategy contract, and
:mod:`processor.runtime` the launcher and watchdog for the programs that run it.
"""

from processor.attention import SelfAttention, dense_window_attention, sliding_window_attention
from processor.config import ConfigError, ProcessorConfig
from processor.errors import UserError
from processor.mlp import MLP, GatedMLP
from processor.strategies import Strategy
from processor.transformer import TransformerBlock, TransformerProcessor

__all__ = [
    "MLP",
    "GatedMLP",
    "ConfigError",
    "ProcessorConfig",
    "SelfAttention",
    "Strategy",
    "TransformerBlock",
    "TransformerProcessor",
    "UserError",
    "dense_window_attention",
    "sliding_window_attention",
]
