"""Segment ids at the processor level: the semantics (packed = each segment alone) and bad ids."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor


def _model(window: int | None, **extra) -> TransformerProcessor:
    torch.manual_seed(0)
    config = ProcessorConfig(
        num_layers=2, num_channels=16, num_heads=2, window_size=window, mlp_hidden_ratio=2.0, num_chunks=0, **extra
    )
    return TransformerProcessor(config).double()


@pytest.mark.parametrize("window", [1, 5, 40, None])
def test_packed_segments_equal_each_segment_alone(window):
    """Three grids packed end to end (one shorter than the window) give what each gives alone,
    forward and input gradient."""
    model = _model(window, attention_block_size=8)
    lengths = [37, 3, 60]
    x = torch.randn(2, sum(lengths), 16, dtype=torch.float64, requires_grad=True)
    ids = torch.repeat_interleave(torch.tensor([4, 9, 2]), torch.tensor(lengths))
    y = model(x, segment_ids=ids)
    y.square().sum().backward()

    alone_outputs, alone_grads = [], []
    for piece in x.detach().split(lengths, dim=1):
        piece = piece.clone().requires_grad_()
        out = model(piece)
        out.square().sum().backward()
        alone_outputs.append(out.detach())
        alone_grads.append(piece.grad)
    torch.testing.assert_close(y.detach(), torch.cat(alone_outputs, dim=1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, torch.cat(alone_grads, dim=1), rtol=1e-12, atol=1e-12)


def test_per_member_ids_and_one_segment():
    """Ids per batch member apply to that member only; one id everywhere changes nothing."""
    model = _model(6)
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    ids = torch.zeros(2, 50, dtype=torch.long)
    ids[1, 20:] = 1  # member 1 is two segments, member 0 one
    y = model(x, segment_ids=ids)
    torch.testing.assert_close(y[0], model(x[:1])[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y[1, :20], model(x[1:, :20])[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model(x, segment_ids=torch.full((50,), 3)), model(x), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y[1], model(x[1:])[0])  # the split matters


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.zeros(50), "integer"),
        (torch.zeros(49, dtype=torch.long), r"\(local_points,\)"),
        (torch.zeros(3, 50, dtype=torch.long), r"\(batch, local_points\)"),
        (torch.zeros(2, 5, 10, dtype=torch.long), "segment_ids"),
    ],
)
def test_bad_segment_ids(ids, message):
    model = _model(6)
    with pytest.raises(ValueError, match=message):
        model(torch.randn(2, 50, 16, dtype=torch.float64), segment_ids=ids)
