"""Sliding-window attention: the O(N·W) kernel, its dense reference, and the attention layer."""

from processor.attention.kernel import default_block_size, sliding_window_attention
from processor.attention.masks import band_mask
from processor.attention.module import SelfAttention
from processor.attention.reference import dense_window_attention

__all__ = ["SelfAttention", "band_mask", "default_block_size", "dense_window_attention", "sliding_window_attention"]
