from dataclasses import replace

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from training.config.checks import check_config
from training.config.schema import RunConfig, run_config

TWO_RANKS = (
    "trainer.nprocs=2",
    "trainer.ranks_per_model=2",
    "trainer.batch_size=1",
)  # what the store derives is not read here


def _compose(*overrides):
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="config", overrides=["run_dir=/tmp/x", *overrides])


def _typed(*overrides) -> RunConfig:
    return run_config(_compose(*overrides))


def test_defaults_compose_and_pass_checks():
    cfg = _typed()
    assert isinstance(cfg, RunConfig) and cfg.strategy.name == "shard_sequence"
    assert cfg.trainer.nprocs is None and cfg.trainer.ranks_per_model is None  # derived from the store
    check_config(cfg)
    check_config(_typed("trainer.nprocs=2"))


@pytest.mark.parametrize("name", ["none", "shard_heads", "shard_sequence", "shard_hybrid"])
def test_strategy_is_one_switch(name):
    assert _compose(f"strategy={name}").strategy.name == name


DATA_PRESETS = [
    "era5_uk_2t",
    "ncep_msl_daily",
    "inca_graz",
    "ncep_iberia_t850",
    "ncep_iberia_t_q_msl",
    "eobs_iberia_pr",
    "eobs_iberia_2t",
    "value_iberia_2t",
    "cordex_iberia",
    "wfde5_uk_land",
    "regional_t2m",
]


@pytest.mark.parametrize("data", DATA_PRESETS)
def test_a_data_preset_names_a_store_and_nothing_of_the_model_or_trainer(data):
    """The store, its forcings and how it is scored; the run is derived from the store."""
    preset, plain = _typed(f"data={data}"), _typed()
    assert preset.model == plain.model and preset.trainer == plain.trainer and preset.strategy == plain.strategy
    assert preset.data.path.endswith(".zarr") and preset.data.lead_time is None
    check_config(preset)


def _sharded_on_two_ranks(experiment: str) -> None:
    ranks = ("trainer.nprocs=2", "trainer.ranks_per_model=2")
    sharded = _typed(f"experiment={experiment}", "strategy=shard_sequence", *ranks)
    assert (sharded.strategy.name, sharded.trainer.nprocs, sharded.trainer.ranks_per_model) == ("shard_sequence", 2, 2)
    check_config(sharded)


def test_the_era5_experiment_is_the_whole_run_tuned_on_its_store_and_one_rank_unless_sharded():
    tuned = _typed("experiment=era5_uk_2t")
    t = tuned.trainer
    assert tuned.data.path.endswith("era5_uk_2t.zarr") and tuned.model.trainable_size == 8
    assert (tuned.strategy.name, t.nprocs, t.ranks_per_model, t.threads_per_rank) == ("none", 1, 1, 0)
    check_config(tuned)
    _sharded_on_two_ranks("era5_uk_2t")


def test_the_daily_experiment_is_the_derived_run_with_a_rollout_of_three_days():
    """``experiment=ncep_msl_daily`` sets only what the store does not derive: the rollout."""
    tuned, named = _typed("experiment=ncep_msl_daily"), _typed("data=ncep_msl_daily")
    assert tuned.data == named.data and tuned.model == named.model and tuned.strategy == named.strategy
    rollout = tuned.trainer.rollout
    assert (rollout.start, rollout.max, rollout.increase_every) == (1, 3, 450)
    assert replace(tuned.trainer, rollout=named.trainer.rollout) == named.trainer
    check_config(tuned)
    _sharded_on_two_ranks("ncep_msl_daily")


def test_a_strategy_option_reaches_the_processor():
    from training.config.schema import processor_config, strategy_settings

    cfg = _typed("strategy.ring=false")
    check_config(cfg)
    processor = processor_config(cfg.model, cfg.strategy.name, options=strategy_settings(cfg.strategy))
    assert processor.describe()["strategy"] == "ShardSequence(ring=False)"


@pytest.mark.parametrize("override", ["trainer.loss.variable_weights={u: 4.0}", "+trainer.loss.variable_weights.u=4"])
def test_variable_weights_take_new_names_as_the_readme_writes_them(override):
    cfg = _typed(override)
    assert cfg.trainer.loss.variable_weights == {"u": 4.0}
    check_config(cfg)


def test_unknown_key_fails_naming_it():
    with pytest.raises((ConfigCompositionException, ValidationError), match="num_layer"):
        _compose("model.num_layer=3")


def test_wrong_type_fails_naming_the_key():
    with pytest.raises((ConfigCompositionException, ValidationError), match="steps"):
        _compose("trainer.steps=many")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.lr=-1"], r"config key trainer.lr = -1.0 is out of range: expected > 0"),
        (["trainer.rollout.max=0"], r"trainer.rollout.max = 0 is out of range: expected >= 1"),
        (["data.val_fraction=1.0"], r"data.val_fraction = 1.0 is out of range: expected in \(0, 1\)"),
        (["model.window_size=-2"], "model.window_size"),
        (["trainer.precision=fp8"], "trainer.precision"),
        (["trainer.threads_per_rank=-1"], r"trainer.threads_per_rank = -1 is out of range: expected >= 0 \(0: "),
        (["trainer.ranks_per_model=3"], "does not divide the world size 2"),
        (["strategy=none"], "runs on one rank"),
        (["strategy=shard_heads", "model.num_heads=1", "model.num_channels=8"], "num_heads"),
        (["model.num_heads=3"], "not divisible"),
        (["strategy=shard_heads", "strategy.ring=true"], "strategy.ring: strategy 'shard_heads' has no such option"),
        (["strategy=shard_hybrid", "strategy.head_group_size=4"], "head_group_size = 4 does not divide the 2"),
        (
            ["strategy=shard_hybrid", "strategy.head_group_size=2", "model.num_heads=1", "model.num_channels=8"],
            "head_group_size = 2 gives a head group more ranks than the 1 heads",
        ),
        (["strategy=shard_hybrid", "strategy.head_group_size=0"], "strategy.head_group_size: 0 is out of range"),
    ],
)
def test_out_of_range_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_config(_typed("trainer.nprocs=2", *overrides))  # 2 ranks, as the run the store derives


def test_auto_picks_a_strategy_and_keeps_its_prediction(capsys):
    from training.config.auto_strategy import resolve_auto
    from training.config.schema import strategy_settings

    cfg = resolve_auto(_typed("strategy=auto", "strategy.machine=h100_nvlink_ib", *TWO_RANKS), 1600)
    check_config(cfg)  # the pick is a strategy like any other
    assert cfg.strategy.name in ("shard_sequence", "shard_heads", "shard_channels")
    assert cfg.strategy.auto["choice"] == cfg.strategy.name and cfg.strategy.auto["machine"] == "h100_nvlink_ib"
    assert set(cfg.strategy.auto["predicted"]) >= {"shard_sequence", "shard_heads"}
    assert "machine" not in strategy_settings(cfg.strategy)  # auto's own keys are no strategy options
    assert f"picked {cfg.strategy.name}" in capsys.readouterr().out


def test_auto_with_an_unknown_machine_names_it():
    from training.config.auto_strategy import resolve_auto

    with pytest.raises(ValueError, match="strategy=auto: machine 'cray'"):
        resolve_auto(_typed("strategy=auto", "strategy.machine=cray"), 1600)


def test_an_added_key_is_named_when_the_composition_is_made_typed():
    with pytest.raises(ValueError, match="config key trainer.stpes is not a setting of the schema: did you mean"):
        _typed("+trainer.stpes=5")


def test_settings_saved_before_the_debug_section_continue_under_it():
    from pathlib import Path

    from training.config.saved_names import current_names
    from training.launch.run_settings import SavedRun, continue_from

    old = {"trainer": {"steps": 60, "debug_share_gpu": True}, "model": {"num_layers": 3}, "data": {"lead_time": 6}}
    saved = current_names(old)
    # a run saved before mappers were chosen ran mean_mlp, before node parameters none
    # and, before the recipe was derived from the store, persistence, one input state, batches of one
    model = {
        **old["model"],
        "mapper": "mean_mlp",
        "trainable_size": 0,
        "valid_time_forcing": False,
        "multistep_input": 1,
        "baseline": "persistence",
        "field_input": False,  # and before the whole-field forecast, none: its model has no channels for it
    }
    # it scored its last model, and ran torch's GEMM
    trainer = {"steps": 60, "batch_size": 1, "keep_best": False, "matmul": "aten"}
    # it calibrated on training dates, which it trained on: no calibration period
    data = {"lead_time": 6, "calibration_fraction": 0.0}
    assert saved == {"trainer": trainer, "debug": {"share_gpu": True}, "model": model, "data": data}
    cfg = continue_from(_typed(), SavedRun(saved, 30, Path("x")), given=[])
    assert (cfg.trainer.steps, cfg.model.num_layers) == (60, 3)
    assert cfg.debug.share_gpu is False  # a setting of the invocation, never the saved run's
    assert cfg.model.mapper == "mean_mlp" and _typed().model.mapper == "graph_transformer"
    assert cfg.model.valid_time_forcing is False and _typed().model.valid_time_forcing is True
    assert cfg.model.valid_time_forcing is False  # it ran with the input date's forcings
    assert cfg.model.field_input is False and _typed().model.field_input is None  # None: derived
    assert cfg.data.calibration_fraction == 0.0 and _typed().data.calibration_fraction is None
    assert current_names({"model": {"mapper": "graph_transformer"}})["model"]["mapper"] == "graph_transformer"


def test_the_typed_config_round_trips_through_its_plain_form():
    from training.config.settings import from_settings, to_settings

    cfg = _typed("strategy=shard_hybrid", "strategy.head_group_size=2", "trainer.loss.variable_weights={u: 2.0}")
    settings = to_settings(cfg)
    assert from_settings(RunConfig, settings) == cfg
    newer = {**settings, "gone": 1, "trainer": {**settings["trainer"], "removed_key": 3}}  # another version's keys
    assert from_settings(RunConfig, newer) == cfg


def test_auto_weighs_your_own_strategies_too(tmp_path, capsys):
    """strategy.consider names strategies of your own: auto costs them like the built-ins and
    picks one where it is cheapest (here a machine whose every message costs a second)."""
    import dataclasses
    import json

    from tests.processor.plan.test_own_strategy import CHATTY_LINKS
    from training.config.auto_strategy import resolve_auto

    machine = tmp_path / "chatty.json"
    machine.write_text(json.dumps(dataclasses.asdict(CHATTY_LINKS)))
    own = "tests.processor.plan.test_own_strategy:GatherKeys"
    chatty = _typed("strategy=auto", f"strategy.machine={machine}", f"strategy.consider=[{own}]", *TWO_RANKS)
    cfg = resolve_auto(chatty, 1600)
    assert cfg.strategy.name == own and cfg.strategy.auto["choice"] == "gather_keys"
    assert "gather_keys" in capsys.readouterr().out
    check_config(cfg)  # the pick is a strategy the run can start with
    with pytest.raises(ValueError, match="strategy=auto: strategy 'no_such:Thing' cannot be imported"):
        resolve_auto(_typed("strategy=auto", "strategy.consider=[no_such:Thing]", *TWO_RANKS), 1600)  # before any probe


@pytest.mark.parametrize(
    "overrides,mesh",
    [
        (["strategy=shard_sequence"], "(mesh: points 2 x channels 1 x heads 1)"),
        (["strategy=shard_channels"], "(mesh: points 1 x channels 2 x heads 1)"),
        (
            ["strategy=shard_hybrid", "strategy.head_group_size=2", "trainer.nprocs=4", "trainer.ranks_per_model=4"],
            "(mesh: points 2 x channels 1 x heads 2)",
        ),
    ],
)
def test_the_startup_line_shows_how_the_strategy_lays_out_the_model_group(overrides, mesh):
    from training.launch.run_start import startup_line

    derived = (*TWO_RANKS, "model.hidden_grid=o16", "model.hidden_stride=1")  # as prepare leaves them
    cfg = _typed(*derived, *overrides, "run_dir=/tmp/x", "logging.mlflow=false")
    assert mesh in startup_line(cfg, 5248, 1600)


def test_a_checkpoint_from_before_the_node_parameters_continues_as_it_ran():
    """A run saved before ``model.trainable_size``, ``valid_time_forcing`` and ``multistep_input``
    existed continues under the values it ran with, and its checkpoint is not refused for them."""
    from pathlib import Path

    from training.checkpoint.resume import check_compatible
    from training.config.saved_names import current_names
    from training.config.settings import to_settings
    from training.launch.run_settings import SavedRun, continue_from

    saved = {k: to_settings(getattr(_typed(), k)) for k in ("model", "data", "strategy")}
    for key in ("trainable_size", "valid_time_forcing", "multistep_input", "normalise_increments"):
        del saved["model"][key]
    cfg = continue_from(_typed(), SavedRun(current_names(saved), 30, Path("x")), given=[])
    assert (cfg.model.trainable_size, cfg.model.valid_time_forcing, cfg.model.multistep_input) == (0, False, 1)
    assert check_compatible(saved, cfg) == []
    saved["model"]["num_layers"] += 1
    with pytest.raises(Exception, match="model.num_layers"):
        check_compatible(saved, cfg)


def test_a_rollout_saved_before_its_step_decay_resumes_without_a_change():
    """``trainer.rollout`` is compared whole on resume: a checkpoint written before
    ``step_decay`` existed ran every step alike (1.0), and is not noted as changed; another
    decay is."""
    from pathlib import Path

    from training.checkpoint.resume import check_compatible
    from training.config.saved_names import current_names
    from training.config.settings import to_settings
    from training.launch.run_settings import SavedRun, changed_settings, continue_from

    saved = {k: to_settings(getattr(_typed(), k)) for k in ("model", "data", "strategy", "trainer")}
    del saved["trainer"]["rollout"]["step_decay"]
    cfg = continue_from(_typed(), SavedRun(current_names(saved), 30, Path("x")), given=[])
    assert cfg.trainer.rollout.step_decay == 1.0
    assert check_compatible(saved, cfg) == []
    assert not [c for c in changed_settings(current_names(saved), cfg) if "rollout" in c]
    cfg.trainer.rollout.step_decay = 0.5
    assert any("trainer.rollout" in note for note in check_compatible(saved, cfg))
