"""shard_sequence's choice between the halo and the ring, and what the ring refuses."""

from __future__ import annotations

import pytest
import torch

from processor.attention import SelfAttention
from processor.distributed import ShardLayout, Transport
from processor.strategies import ShardContext, ShardSequence


def test_the_ring_when_a_window_reaches_past_a_neighbour() -> None:
    layout = ShardLayout((30, 30, 30, 30), 1)
    auto = ShardSequence()
    assert not auto.uses_ring(layout, 30)  # 30 rows reach the neighbours' blocks only
    assert auto.uses_ring(layout, 31)  # ...and one more reaches two ranks away
    assert auto.uses_ring(layout, None)
    assert ShardSequence(ring=True).uses_ring(layout, 1)
    assert not ShardSequence(ring=False).uses_ring(layout, None)
    assert repr(auto) == "ShardSequence(ring=None)"  # the option shows in logged settings


def test_ring_refuses_attention_dropout_in_training() -> None:
    attn = SelfAttention(8, 2, window_size=None, dropout_p=0.1).train()
    layout = ShardLayout((4, 4, 4), 0)
    ctx = ShardContext(None, layout, ShardSequence(), Transport(), window_size=None)
    with pytest.raises(ValueError, match=r"dropout_p > 0.*ring=False"):
        ShardSequence().attend(attn, torch.zeros(1, 4, 8), ctx)
