"""The adapter's module tree is anemoi's, and it holds the only parameters (no anemoi package
needed): the gridshard processor that runs them computes exactly what it computes on its own."""

from __future__ import annotations

import copy

import pytest
import torch

from processor import TransformerProcessor
from processor.interop.anemoi import processor_kwargs_from_anemoi, to_anemoi_state_dict
from processor.interop.anemoi_processor import AnemoiTransformerProcessor

SETTINGS = {
    "num_layers": 4,
    "num_channels": 16,
    "num_chunks": 2,
    "num_heads": 4,
    "window_size": 5,
    "mlp_hidden_ratio": 2.0,
    "qk_norm": True,
    "dropout_p": 0.0,
}
BATCH, POINTS = 2, 12


def _pair() -> tuple[AnemoiTransformerProcessor, TransformerProcessor]:
    """The adapter and a plain gridshard processor with the same (random) weights, float64."""
    torch.manual_seed(1)
    plain = TransformerProcessor(**processor_kwargs_from_anemoi(SETTINGS), strategy="none").double()
    with torch.no_grad():
        for p in plain.parameters():
            p.normal_()
    adapter = AnemoiTransformerProcessor(**SETTINGS, strategy="none").double()
    adapter.load_state_dict(to_anemoi_state_dict(plain.state_dict()), strict=True)
    return adapter, plain


def _run(model: torch.nn.Module, x: torch.Tensor, adapter: bool) -> torch.Tensor:
    """``sum(out * x)`` of a ``(BATCH * POINTS, C)`` input, backward done; returns the output."""
    out = model(x, batch_size=BATCH) if adapter else model(x.view(BATCH, POINTS, -1)).reshape_as(x)
    (out * x).sum().backward()
    return out.detach()


def test_the_tree_has_anemois_names_and_attributes():
    adapter = AnemoiTransformerProcessor(**SETTINGS)
    block = adapter.proc[1]
    assert isinstance(adapter.proc, torch.nn.ModuleList) and len(adapter.proc) == 4
    assert [name for name, _ in block.named_children()] == [
        "layer_norm_attention",
        "layer_norm_mlp",
        "attention",
        "mlp",
    ]
    assert block.attention.lin_q.weight.shape == (16, 16) and block.attention.lin_q.bias is None
    assert block.attention.projection.in_features == 16 and block.mlp.mlp[0].out_features == 32
    assert (adapter.num_chunks, adapter.chunk_size, adapter.gradient_checkpointing) == (2, 2, True)
    names = [name for name, _ in adapter.named_parameters()]
    assert names == list(adapter.state_dict()) and all(name.startswith("proc.") for name in names)
    assert "proc.0.attention.k_norm.weight" in names and "proc.3.mlp.mlp.2.bias" in names
    assert len(names) == len(set(map(id, adapter.parameters()))) == 4 * 15


def test_outputs_and_gradients_are_bit_for_bit_the_processors():
    adapter, plain = _pair()
    x = torch.randn(BATCH * POINTS, 16, dtype=torch.float64)
    assert torch.equal(_run(adapter, x, True), _run(plain, x, False))
    theirs = to_anemoi_state_dict({name: p.grad for name, p in plain.named_parameters()})
    for name, p in adapter.named_parameters():
        assert torch.equal(p.grad, theirs[name]), name


def test_an_optimiser_step_and_a_frozen_submodule_reach_the_processor():
    adapter, _ = _pair()
    adapter.proc[0].attention.lin_k.requires_grad_(False)  # as anemoi code freezes by name
    x = torch.randn(BATCH * POINTS, 16, dtype=torch.float64)
    before = _run(adapter, x, True)
    assert adapter.proc[0].attention.lin_k.weight.grad is None
    assert adapter.proc[0].attention.lin_q.weight.grad is not None
    frozen = adapter.proc[0].attention.lin_k.weight.clone()
    torch.optim.SGD(adapter.parameters(), lr=0.1).step()
    assert torch.equal(adapter.proc[0].attention.lin_k.weight, frozen)
    with torch.no_grad():
        assert not torch.allclose(adapter(x, batch_size=BATCH), before)


def test_dtype_copies_and_train_mode_carry_over():
    adapter = AnemoiTransformerProcessor(**{**SETTINGS, "dropout_p": 0.5})
    twin = copy.deepcopy(adapter).double().eval()
    assert not twin.processor.blocks[0].attn.training and adapter.processor.blocks[0].attn.training
    assert twin.processor.blocks[0].attn.qkv.weight.dtype == torch.float64
    assert twin.proc[0].attention.lin_v.weight is twin.processor.blocks[0].attn.qkv.lin_v.weight
    x = torch.randn(BATCH * POINTS, 16, dtype=torch.float64)
    assert torch.equal(twin(x, batch_size=BATCH), twin(x, batch_size=BATCH))  # eval: no dropout


@pytest.mark.parametrize("checkpointing, chunk_size, chunks", [(True, 2, 2), (True, 1, 4), (False, 2, 0)])
def test_checkpointing_follows_anemois_attributes_at_each_forward(monkeypatch, checkpointing, chunk_size, chunks):
    import processor.transformer as transformer

    calls = []
    real = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    adapter = AnemoiTransformerProcessor(**SETTINGS)
    adapter.gradient_checkpointing, adapter.chunk_size = checkpointing, chunk_size
    adapter(torch.randn(BATCH * POINTS, 16), batch_size=BATCH).sum().backward()
    assert len(calls) == chunks and adapter.processor.config.num_chunks == chunks


def test_gradient_checkpointing_false_is_taken_from_the_config():
    adapter = AnemoiTransformerProcessor(**SETTINGS, gradient_checkpointing=False)
    assert adapter.gradient_checkpointing is False and adapter.chunk_size == 2


def test_q_k_norms_with_a_bias_save_and_load_and_unknown_keys_are_reported():
    kernels = {name: {"_target_": "torch.nn.LayerNorm"} for name in ("QueryNorm", "KeyNorm")}
    adapter = AnemoiTransformerProcessor(**SETTINGS, layer_kernels=kernels)
    state = adapter.state_dict()
    assert "proc.0.attention.q_norm.bias" in state
    AnemoiTransformerProcessor(**SETTINGS, layer_kernels=kernels).load_state_dict(state, strict=True)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"proc.0.attention.lin_q.bias\""):
        adapter.load_state_dict({**state, "proc.0.attention.lin_q.bias": torch.zeros(16)})
