"""gridshard's processor: a model-parallel sliding-window transformer on gridded points.

No Hydra, no MLflow here: a plain PyTorch library. See :class:`TransformerProcessor`.
"""

from processor.transformer import TransformerProcessor

__all__ = ["TransformerProcessor"]
