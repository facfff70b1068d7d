"""The anemoi converters on their own (no anemoi package needed): names, shapes, refusals."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.interop.anemoi import (
    AnemoiConversionError,
    from_anemoi_state_dict,
    processor_kwargs_from_anemoi,
    to_anemoi_state_dict,
)

ANEMOI_PROCESSOR = {
    "_target_": "anemoi.models.layers.processor.TransformerProcessor",
    "_convert_": "all",
    "num_layers": 2,
    "num_channels": 16,
    "num_chunks": 1,
    "num_heads": 4,
    "window_size": 3,
    "mlp_hidden_ratio": 2.5,
    "dropout_p": 0.0,
    "attention_implementation": "flash_attention",
    "qk_norm": True,
    "softcap": 0.0,
    "use_alibi_slopes": False,
    "cpu_offload": False,
}


def _model(**overrides) -> TransformerProcessor:
    torch.manual_seed(0)
    model = TransformerProcessor(**{**processor_kwargs_from_anemoi(ANEMOI_PROCESSOR), **overrides})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def test_round_trip_is_exact_and_names_anemoi_keys():
    model = _model()
    theirs = to_anemoi_state_dict(model.state_dict())
    assert "proc.1.attention.lin_v.weight" in theirs and "proc.0.mlp.mlp.2.bias" in theirs
    assert "proc.0.attention.q_norm.weight" in theirs and not any(k.endswith("q_norm.bias") for k in theirs)
    assert theirs["proc.0.attention.lin_q.weight"].shape == (16, 16)
    ours = from_anemoi_state_dict(theirs)
    assert ours.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(ours[key], value), key


def test_lightning_prefix_is_found_and_other_modules_left_out():
    theirs = to_anemoi_state_dict(_model().state_dict())
    checkpoint = {f"model.model.processor.{k}": v for k, v in theirs.items()}
    checkpoint["model.model.encoder.proc.0.weight"] = torch.zeros(3)  # another module's keys
    with pytest.raises(AnemoiConversionError, match="prefix"):
        from_anemoi_state_dict({**checkpoint, "other.proc.0.attention.lin_q.weight": torch.zeros(1)})
    ours = from_anemoi_state_dict(checkpoint)
    TransformerProcessor(**processor_kwargs_from_anemoi(ANEMOI_PROCESSOR)).load_state_dict(ours)
    assert from_anemoi_state_dict(checkpoint, prefix="model.model.processor.").keys() == ours.keys()


def test_a_forecasters_prefix_converts_too():
    wrapped = {f"processor.{k}": v for k, v in _model().state_dict().items()}
    assert "proc.0.attention.lin_k.weight" in to_anemoi_state_dict(wrapped)


def test_q_k_norm_bias_is_kept_or_refused():
    model = _model(qk_norm_bias=True)
    with pytest.raises(AnemoiConversionError, match=r"blocks.0.attn.q_norm.bias is not zero.*qk_norm_bias=False"):
        to_anemoi_state_dict(model.state_dict())
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_norm.bias.zero_()
            block.attn.k_norm.bias.zero_()
    assert "proc.0.attention.k_norm.weight" in to_anemoi_state_dict(model.state_dict())  # zeros drop losslessly


def test_one_ranks_share_of_a_split_model_is_refused():
    state = _model().state_dict()
    state["blocks.0.attn.qkv.weight"] = state["blocks.0.attn.qkv.weight"][:24]
    with pytest.raises(AnemoiConversionError, match="full_state_dict"):
        to_anemoi_state_dict(state)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda sd: sd.update({"proc.0.attention.lin_q.bias": torch.zeros(16)}), "no gridshard equivalent"),
        (lambda sd: sd.pop("proc.1.attention.lin_k.weight"), r"proc.1 lacks \['attention.lin_k.weight'\]"),
        (lambda sd: sd.update({"proc.1.mlp.mlp.0.weight": torch.zeros(7, 16)}), r"blocks.1.mlp.0.weight has shape"),
        (lambda sd: sd.update({"proc.0.attention.lin_v.weight": torch.zeros(8, 16)}), "must be equal"),
        (lambda sd: sd.update({"proc.1.attention.projection.weight": torch.zeros(16, 8)}), r"blocks.1.attn.proj"),
        (lambda sd: sd.update({"proc.3.layer_norm_mlp.weight": torch.zeros(16)}), r"numbered 0..L-1"),
        (lambda sd: sd.clear(), "found prefixes none"),
    ],
)
def test_state_dicts_without_an_equivalent_are_refused(change, message):
    theirs = to_anemoi_state_dict(_model().state_dict())
    change(theirs)
    with pytest.raises(AnemoiConversionError, match=message):
        from_anemoi_state_dict(theirs)


def test_config_keys_map_onto_the_processor():
    kwargs = processor_kwargs_from_anemoi(ANEMOI_PROCESSOR)
    assert kwargs == {
        "num_layers": 2,
        "num_channels": 16,
        "num_heads": 4,
        "window_size": 3,
        "num_chunks": 1,
        "dropout_p": 0.0,
        "qk_norm": True,
        "use_alibi_slopes": False,  # softcap 0.0: off, as anemoi reads it
        "mlp_hidden_ratio": 2.5,
        "activation": "gelu",
        "qk_norm_bias": False,
    }
    assert ProcessorConfig(**kwargs).mlp_hidden == 40  # anemoi rounds ratio * C halves up too
    model_section = {"num_channels": 16, "processor": {**ANEMOI_PROCESSOR, "num_channels": None}}
    model_section["processor"].pop("num_channels")
    model_section["layer_kernels"] = {"Activation": {"_target_": "torch.nn.SiLU"}}
    assert processor_kwargs_from_anemoi(model_section)["activation"] == "silu"
    no_checkpointing = processor_kwargs_from_anemoi({**ANEMOI_PROCESSOR, "gradient_checkpointing": False})
    assert no_checkpointing["num_chunks"] == 0
    with_bias = {"layer_kernels": {k: {"_target_": "torch.nn.LayerNorm"} for k in ("QueryNorm", "KeyNorm")}}
    assert processor_kwargs_from_anemoi({**ANEMOI_PROCESSOR, **with_bias})["qk_norm_bias"] is True


def test_every_setting_of_anemois_processor_maps_onto_the_processor():
    everything = {
        "attn_channels": 24,
        "mlp_implementation": "swiglu",
        "softcap": 30.0,
        "use_alibi_slopes": True,
        "use_rotary_embeddings": True,
    }
    kwargs = processor_kwargs_from_anemoi({**ANEMOI_PROCESSOR, **everything})
    assert {key: kwargs[key] for key in everything} == everything
    config = ProcessorConfig(**kwargs)
    assert (config.inner_channels, config.head_dim) == (24, 6)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"_target_": "anemoi.models.layers.processor.GNNProcessor"}, "only anemoi's TransformerProcessor"),
        ({"num_heads": None}, r"lacks \['num_heads'\]"),
        ({"shard_strategy": "edges"}, "shard_strategy is not a setting"),
        ({"layer_kernels": {"Activation": {"_target_": "torch.nn.Mish"}}}, "layer_kernels.Activation"),
        ({"layer_kernels": {"LayerNorm": {"_target_": "my.RMSNorm"}}}, "layer_kernels.LayerNorm"),
        ({"layer_kernels": {"QueryNorm": {"_target_": "torch.nn.LayerNorm"}}}, "differ in bias"),
        ({"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm", "eps": 1e-6}}}, "eps = 1e-06"),
    ],
)
def test_configs_without_an_equivalent_are_refused(change, message):
    with pytest.raises(AnemoiConversionError, match=message):
        processor_kwargs_from_anemoi({**ANEMOI_PROCESSOR, **change})


def test_the_processor_takes_keywords_or_a_config_not_both():
    config = ProcessorConfig(num_layers=1, num_channels=8, num_heads=2)
    with pytest.raises(TypeError, match="not both"):
        TransformerProcessor(config, num_layers=2)
    assert TransformerProcessor(num_layers=1, num_channels=8, num_heads=2).config == config


def test_the_adapter_refuses_a_checkpoint_of_another_shape_in_one_line():
    from processor.interop.anemoi_processor import AnemoiTransformerProcessor

    theirs = to_anemoi_state_dict(_model().state_dict())
    wider = AnemoiTransformerProcessor(**{**ANEMOI_PROCESSOR, "mlp_hidden_ratio": 4.0})
    with pytest.raises(
        AnemoiConversionError,
        match=r"proc.0.mlp.mlp.0.weight: the checkpoint's is \(40, 16\), this processor's \(64, 16\)",
    ):
        wider.load_state_dict(theirs)
    deeper = AnemoiTransformerProcessor(**{**ANEMOI_PROCESSOR, "num_layers": 3})
    with pytest.raises(AnemoiConversionError, match="2 processor layers, this processor num_layers = 3"):
        deeper.load_state_dict(theirs)
    adapter = AnemoiTransformerProcessor(**ANEMOI_PROCESSOR)
    adapter.load_state_dict(theirs)
    assert adapter.state_dict().keys() == theirs.keys()
    with pytest.raises(ValueError, match="shard sizes"):
        adapter(torch.zeros(2 * 10, 16), batch_size=2, shard_shapes=[[7, 16]])
