"""``model.attention_path=auto`` in a run: one rank's call shape per strategy, the measured pick
in the model section (and its figures under ``model.attention_auto``), and the switches off."""

from __future__ import annotations

import pytest

from training.auto_attention import rank_probe_shape, resolve_attention_path
from training.config import ModelConfig, processor_config


def _model(**changes):
    model = ModelConfig(hidden_grid="o16", num_layers=1, num_channels=64, num_heads=4, window_size=40)
    for key, value in changes.items():
        setattr(model, key, value)
    return model


def test_a_rank_sees_its_points_and_a_halo_or_every_point_and_its_heads():
    model = _model()
    sequence = rank_probe_shape(model, "shard_sequence", 1000, 4, 2, "fp32")
    assert (sequence.batch, sequence.heads, sequence.n_q, sequence.n_k, sequence.head_dim) == (2, 4, 250, 330, 16)
    assert sequence.q_offset == 40 and sequence.dtype == "float32"
    heads = rank_probe_shape(model, "shard_heads", 1000, 4, 1, "bf16")
    assert (heads.heads, heads.n_q, heads.n_k, heads.dtype) == (1, 1000, 1000, "bfloat16")
    alone = rank_probe_shape(model, "none", 1000, 1, 1, "fp32")
    assert (alone.n_q, alone.n_k) == (1000, 1000)


def test_auto_becomes_the_measured_path_with_its_figures(monkeypatch, tmp_path):
    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", "1")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    model = _model()
    choice = resolve_attention_path(model, "shard_sequence", 1600, 2, 1, "fp32", "cpu", 1)
    assert choice is not None and model.attention_path == choice.path != "auto"
    assert model.attention_auto["choice"] == choice.path and set(model.attention_auto["seconds"]) == set(choice.seconds)
    assert (tmp_path / "attention_paths.json").exists()
    processor_config(model, "shard_sequence")  # the launcher's keys are not the processor's


@pytest.mark.parametrize(
    "changes,env",
    [({"attention_probe": False}, "1"), ({}, "0"), ({"attention_path": "banded"}, "1"), ({"window_size": None}, "1")],
)
def test_nothing_is_measured_when_off_set_or_global(monkeypatch, tmp_path, changes, env):
    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", env)
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    model = _model(**changes)
    before = model.attention_path
    assert resolve_attention_path(model, "shard_sequence", 1600, 2, 1, "fp32", "cpu", 1) is None
    assert model.attention_path == before and model.attention_auto is None
    assert not (tmp_path / "attention_paths.json").exists()
