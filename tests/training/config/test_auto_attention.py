"""``model.attention_path=auto`` in a run: one rank's call shape per strategy, the measured pick
in the model section (and its figures under ``model.attention_auto``), the switches off, and a
checkpoint continuing under another path."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from processor.strategies import resolve_strategy
from training.checkpoint.files import CheckpointError
from training.checkpoint.resume import check_compatible
from training.config.auto_attention import rank_probe_shape, resolve_attention_path
from training.config.schema import ModelConfig, processor_config, run_config
from training.config.settings import to_settings


def _model(**changes):
    model = ModelConfig(hidden_grid="o16", num_layers=1, num_channels=64, num_heads=4, window_size=40)
    for key, value in changes.items():
        setattr(model, key, value)
    return model


@pytest.mark.parametrize(
    "strategy,options,ranks,expected",  # expected: (heads, n_q, n_k) of one rank, 1000 points
    [
        ("shard_sequence", {}, 4, (4, 250, 330)),  # its block and a halo of W each side
        ("shard_heads", {}, 4, (1, 1000, 1000)),  # every point, its heads
        ("shard_channels", {}, 2, (2, 1000, 1000)),  # all-gathered points, its heads
        ("shard_hybrid", {"head_group_size": 2}, 4, (2, 500, 580)),  # heads over 2, points over 2
        ("none", {}, 1, (4, 1000, 1000)),
    ],
)
def test_a_rank_sees_the_heads_and_points_its_strategy_gives_it(strategy, options, ranks, expected):
    shape = rank_probe_shape(_model(), resolve_strategy(strategy, options), 1000, ranks, 2, "fp32")
    assert (shape.heads, shape.n_q, shape.n_k) == expected
    assert (shape.batch, shape.head_dim, shape.window, shape.dtype, shape.needs_grad) == (2, 16, 40, "float32", True)


@pytest.mark.parametrize(
    "strategy,ranks,expected",
    [
        ("shard_sequence", 4, (4, 250, 1000)),
        ("none", 1, (4, 1000, 1000)),
    ],
)
def test_a_global_window_is_probed_over_every_key(strategy, ranks, expected):
    shape = rank_probe_shape(_model(window_size=None), resolve_strategy(strategy), 1000, ranks, 2, "fp32")
    assert (shape.heads, shape.n_q, shape.n_k, shape.window) == (*expected, None)


def test_bf16_and_inference_are_probed_as_such():
    shape = rank_probe_shape(_model(), resolve_strategy("shard_sequence"), 1000, 2, 1, "bf16", needs_grad=False)
    assert shape.dtype == "bfloat16" and not shape.needs_grad and shape.q_offset == 40


def test_auto_becomes_the_measured_path_with_its_figures(monkeypatch, tmp_path):
    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", "1")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    model = _model()
    shape = rank_probe_shape(model, resolve_strategy("shard_sequence"), 1600, 2, 1, "fp32")
    choice = resolve_attention_path(model, shape, "cpu", 1)
    assert choice is not None and model.attention_path == choice.path != "auto"
    assert model.attention_auto["choice"] == choice.path and set(model.attention_auto["seconds"]) == set(choice.seconds)
    assert (tmp_path / "attention_paths.json").exists()
    processor_config(model, "shard_sequence")  # the launcher's keys are not the processor's


@pytest.mark.parametrize(
    "changes,env",
    [
        ({"attention_probe": False}, "1"),
        ({}, "0"),
        ({"attention_path": "banded"}, "1"),
        ({"dropout_p": 0.1}, "1"),  # the probe times plain calls: these keep auto's per-call rule
        ({"softcap": 30.0}, "1"),
        ({"use_alibi_slopes": True, "window_size": None}, "1"),
    ],
)
def test_nothing_is_measured_when_off_set_or_not_plain(monkeypatch, tmp_path, changes, env):
    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", env)
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    model = _model(**changes)
    before = model.attention_path
    shape = rank_probe_shape(_model(), resolve_strategy("shard_sequence"), 1600, 2, 1, "fp32")
    assert resolve_attention_path(model, shape, "cpu", 1) is None
    assert model.attention_path == before and model.attention_auto is None
    assert not (tmp_path / "attention_paths.json").exists()


def test_one_path_that_can_run_the_call_leaves_auto(monkeypatch, tmp_path):
    from processor.attention import dispatch

    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", "1")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dispatch, "native_available", lambda: False)  # a global window: dense alone
    model = _model(window_size=None)
    shape = rank_probe_shape(model, resolve_strategy("none"), 500, 1, 1, "fp32")
    assert resolve_attention_path(model, shape, "cpu", 1) is None
    assert model.attention_path == "auto" and model.attention_auto is None
    processor_config(model, "none")


def test_a_checkpoint_continues_under_another_path_and_from_before_the_probe():
    """The attention path picks a kernel, not weights: a checkpoint written with another one, or
    before ``attention_probe`` and ``attention_auto`` existed, continues (with a note)."""
    with initialize_config_module(config_module="configs", version_base="1.3"):
        cfg = run_config(compose(config_name="config", overrides=["run_dir=/tmp/x"]))
    cfg.model.attention_path, cfg.model.attention_auto = "native", {"choice": "native"}
    saved = {"model": to_settings(cfg.model), "data": to_settings(cfg.data)}
    del saved["model"]["attention_probe"], saved["model"]["attention_auto"]
    saved["model"]["attention_path"] = "banded"
    notes = check_compatible(saved, cfg)
    assert any("attention_path = banded in the checkpoint, native in this run" in n for n in notes)
    saved["model"]["num_channels"] += 1
    with pytest.raises(CheckpointError, match="num_channels"):
        check_compatible(saved, cfg)
