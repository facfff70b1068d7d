"""One profiled step of a run: its operators by part and kind, and the share of the step in the
model's matmuls, attention and message passing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from processor.attention.qk_heads import PROFILE_RANGE as QK_NORM_RANGE
from processor.matmul.backends import TRANSPOSE_RANGE
from training.reporting.step_split import StepSplit, kind_of, model_parts_marked


def test_operators_fall_in_their_kinds():
    assert kind_of("aten::addmm") == kind_of("mkldnn::_linear_pointwise") == "matmul"
    assert kind_of("gridshard_band_attention_backward") == "attention"
    assert kind_of("gridshard_edge_attention_backward") == "attention"
    assert kind_of(QK_NORM_RANGE) == kind_of(QK_NORM_RANGE + "_backward") == "norm"  # not compute
    assert kind_of(TRANSPOSE_RANGE) == "copy"
    assert kind_of("aten::index_add_") == kind_of("aten::scatter_add_") == "gather/scatter"
    assert kind_of("aten::native_layer_norm_backward") == "norm"
    assert kind_of("aten::gelu") == "elementwise"
    assert kind_of("gridshard/halo_exchange/wait") == "communication"
    assert kind_of("gridshard/shard_sequence/attention") == "python"  # a strategy's phase: its own time


class _Model(nn.Module):
    """The forecaster's part names around a matmul-heavy middle and an elementwise-heavy tail."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.processor, self.decoder = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 64)
        self.head = None  # a part the model lacks is skipped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.decoder(self.processor(self.encoder(x)))
        for _ in range(3):
            y = torch.sin(y) * 1.5 + 0.1  # outside the model's parts: not its compute
        return y


def _step(model: nn.Module) -> None:
    model(torch.randn(512, 64)).square().mean().backward()


def test_only_the_step_after_the_warm_up_is_profiled_and_its_share_is_a_fraction():
    model, means = _Model(), []
    split = StepSplit(model, start=10, after=2, mean_over_ranks=lambda v: means.append(v) or v)
    found = {}
    for step in range(10, 15):
        with split.around(step) as profiled:
            _step(model)
        found[step] = dict(profiled)
    assert [s for s, f in found.items() if f] == [12]  # start + after, once
    share = found[12]["model_compute_share"]
    assert 0.0 < share < 1.0 and means == [[share]]  # averaged over the ranks, once
    assert not model.encoder._forward_hooks and not model.encoder._forward_pre_hooks  # hooks removed


def test_none_profiles_nothing():
    model = _Model()
    split = StepSplit(model, start=0, after=None, mean_over_ranks=lambda v: pytest.fail("no collective"))
    for step in range(3):
        with split.around(step) as profiled:
            _step(model)
        assert profiled == {}


def test_a_failing_forward_leaves_no_hook_behind():
    model = _Model()
    with pytest.raises(RuntimeError), model_parts_marked(model):
        model(torch.randn(2, 3))  # a shape the encoder refuses
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
