"""Typed schema of a training run. Hydra merges ``configs/`` into it, so an unknown key or a
value of the wrong type fails at start naming the key; :func:`run_config` turns the composition
into :class:`RunConfig` once, and every function from there on takes the typed sections.

Each setting's default and allowed range are declared together, on its field
(:func:`training.config.settings.setting`); ``configs/`` holds only what a choice changes (a model
preset's sizes, a strategy preset's name, a dataset's path), never a default again.
:func:`check_config` checks the ranges and what spans several keys."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from processor import ConfigError, ProcessorConfig
from processor.strategies import BUILT_IN, StrategyOptionError, resolve_strategy
from training.config.library_schemas import LAUNCH_KEYS, processor_schema, strategy_options_schema
from training.config.parity_settings import ParityConfig
from training.config.sections import (
    DataConfig,
    DebugConfig,
    EvaluateConfig,
    LoggingConfig,
    LossConfig,
    PredictConfig,
    RolloutConfig,
    TrainerConfig,
)
from training.config.settings import (
    ConfigValueError,
    at_least,
    from_settings,
    one_of,
    or_null,
    setting,
    to_settings,
)

__all__ = [
    "ConfigValueError",
    "DataConfig",
    "DebugConfig",
    "EvaluateConfig",
    "LoggingConfig",
    "LossConfig",
    "ParityConfig",
    "PredictConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "processor_config",
    "run_config",
]

FORECASTER_KEYS = (
    "hidden_grid",
    "hidden_stride",
    "encoder_neighbours",
    "decoder_neighbours",
    "mapper",
    "mapper_heads",
    "trainable_size",
    "normalise_increments",
    "valid_time_forcing",
    "multistep_input",
    "baseline",
    "field_input",
    "climatology_input",
)
# The processor's settings, then the forecaster's own (FORECASTER_KEYS). A model preset
# (configs/model/) gives the sizes, which have no default here; the rest is the processor's
# default or the app's own choice below.
ModelConfig = processor_schema(
    "ModelConfig",
    dict(window_size=MISSING, mlp_hidden_ratio=2.0, num_chunks=0, qk_norm=True),
    extra=[
        # the processor's grid: oN, data (model/hidden_grid.py) or auto: derived from the store's
        # extent (training/launch/store_settings.py)
        ("hidden_grid", str, field(default="auto")),
        # hidden_grid=data: one row and column in k (one point in k^2 of an unstructured set); None: derived
        ("hidden_stride", int | None, setting(None, or_null(at_least(1)))),
        ("encoder_neighbours", int, setting(4, at_least(1))),  # data points feeding each hidden point
        ("decoder_neighbours", int, setting(3, at_least(1))),  # hidden points feeding each data point
        # the encoder's and decoder's kind: attention over each point's edges, or anemoi-free mean messages
        ("mapper", str, setting("graph_transformer", one_of("graph_transformer", "mean_mlp"))),
        ("mapper_heads", int, setting(4, at_least(1))),  # the graph transformer's heads
        # learned features per data and hidden point, as anemoi's trainable_size: each point's
        # local climate, coast and hills, which its coordinates do not tell; None: derived from
        # the store (training/launch/store_settings.py: 8 on a limited area, 0 on global data)
        ("trainable_size", int | None, setting(None, or_null(at_least(0)))),
        # predict each step's change in units of the changes' own spread over the training period
        # (anemoi's tendency statistics), not the field's (training/data/tendencies.py)
        ("normalise_increments", bool, field(default=False)),
        # each step is given the forcings at the date it forecasts too, not only at its input
        # date: the sun of the valid hour (docs/real-data.md)
        ("valid_time_forcing", bool, field(default=True)),
        # the states the model is given: the input date's and multistep_input - 1 before it, a lead
        # time apart (anemoi's training.multistep_input): what is changing, not only what is;
        # None: derived from the store (2 on a limited area, 1 on global data)
        ("multistep_input", int | None, setting(None, or_null(at_least(1)))),
        # what each step is learned over: the latest state (persistence), or a ridge regression
        # per point on the step's inputs fitted on the training dates (training/model/linear_baseline.py);
        # auto: derived from the store (the regression on a limited area, persistence on global data)
        ("baseline", str, setting("auto", one_of("auto", "persistence", "linear_regression"))),
        # each step is also given a forecast from every point's inputs at once: the regression's
        # plus a kernel ridge map of what it leaves, fitted on the training dates and, for the training
        # steps, out of fold (training/model/field_forecast.py); needs model.baseline=linear_regression
        # and one rank a model; None: derived (on where it fits)
        ("field_input", bool | None, field(default=None)),
        # each step is also given, at its dates, the mean of each prognostic variable over the
        # training dates of the same UTC hour, per point (training/data/climatology_input.py)
        ("climatology_input", bool, field(default=False)),
    ],
    module=__name__,
)

StrategyOptions = strategy_options_schema(module=__name__)


def processor_config(
    model: Any,
    strategy: str,
    key_prefix: str = "model.",
    strategy_key: str = "strategy.name",
    options: dict[str, Any] | None = None,
    option_prefix: str = "strategy.",
) -> ProcessorConfig:
    """The processor's configuration from a model section (a :func:`processor_schema` dataclass:
    its keys, and the forecaster's :data:`FORECASTER_KEYS`), the strategy's name and its
    ``options`` (those set, not None).

    Raises:
        ValueError: naming the config key (``key_prefix`` + field, ``strategy_key``, or
            ``option_prefix`` + option).
    """
    settings = {k: v for k, v in to_settings(model).items() if k not in FORECASTER_KEYS + LAUNCH_KEYS}
    set_options = {k: v for k, v in (options or {}).items() if v is not None}
    try:
        built = resolve_strategy(strategy, set_options) if strategy in BUILT_IN else strategy
        return ProcessorConfig.from_mapping(settings, strategy=built)
    except StrategyOptionError as exc:
        raise ValueError(f"config key {option_prefix}{exc.option}: {exc.message}") from None
    except ConfigError as exc:
        key = strategy_key if exc.key == "strategy" else key_prefix + exc.key
        raise ValueError(f"config key {key}: {exc.message}") from None


def run_processor_config(cfg: RunConfig) -> ProcessorConfig:
    """The processor's configuration of a run: its model section, strategy and options."""
    return processor_config(cfg.model, cfg.strategy.name, options=strategy_settings(cfg.strategy))


def strategy_settings(strategy: Any) -> dict[str, Any]:
    """The options of a strategy section (a :class:`StrategyOptions`) as a dict: what
    :func:`processor_config` takes (strategy=auto's own keys are not among them)."""
    return {f.name: getattr(strategy, f.name) for f in dataclasses.fields(StrategyOptions)}


@dataclass
class StrategyConfig(StrategyOptions):  # type: ignore[misc, valid-type]
    """The model-parallel strategy by name (a preset in configs/strategy/ names it), and its
    options (None: the strategy's default), which are the built-in strategies' own fields."""

    name: str = MISSING
    """The strategy: a built-in's name (configs/strategy/), ``auto``, or ``'package.module:ClassName'``."""
    machine: str = "probe"
    """``auto``: the machine it predicts for: ``probe`` (this one, measured), a preset
    (``h100_nvlink_ib``) or a saved probe's JSON."""
    consider: list[str] = field(default_factory=list)
    """``auto``: your own strategies too (``'package.module:ClassName'``)."""
    auto: Any = None
    """Filled by ``strategy=auto``: its pick and every candidate's predicted step time."""


@dataclass
class RunConfig:
    """A training run's whole configuration (also evaluation's and prediction's)."""

    model: ModelConfig = field(default_factory=ModelConfig)  # type: ignore[valid-type]
    """The processor's sizes and attention (a preset in configs/model/), and the forecaster's
    grids, mappers and inputs."""
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    """How the processor is split over a model's ranks."""
    data: DataConfig = field(default_factory=DataConfig)
    """The dataset."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The optimisation, the ranks and devices, validation and checkpoints."""
    debug: DebugConfig = field(default_factory=DebugConfig)
    """Aids for users and the step hooks."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """MLflow and the run's measurements of itself."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Skill by lead time."""
    predict: PredictConfig = field(default_factory=PredictConfig)
    """Forecasts to Zarr stores."""
    parity: ParityConfig = field(default_factory=ParityConfig)
    """``python -m training.parity``'s comparison."""
    run_dir: str = MISSING
    """Hydra's output directory (``hydra.run.dir``; configs/config.yaml)."""


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=RunConfig)


def run_config(composed: Any) -> RunConfig:
    """The typed configuration of Hydra's composition ``composed`` (a ``DictConfig``; a
    :class:`RunConfig` is returned as it is), interpolations resolved.

    Raises:
        ConfigValueError: for a key the schema does not have (see :func:`added_keys`) or a
            required value that is not set (``???``).
    """
    if isinstance(composed, RunConfig):
        return composed
    added = added_keys(composed)
    if added:
        key, near = added[0]
        hint = f": did you mean {near}?" if near else ""
        raise ConfigValueError(f"config key {key} is not a setting of the schema{hint}")
    try:
        typed = OmegaConf.to_object(composed)
    except MissingMandatoryValue as exc:
        raise ConfigValueError(f"config key {exc.full_key} is not set: give it on the command line") from None
    return typed if isinstance(typed, RunConfig) else from_settings(RunConfig, typed)


def schema_keys(node: Any = None, prefix: str = "") -> dict[str, bool]:
    """Every key of the schema (:class:`RunConfig`, or the typed section ``node``) as a dotted
    path, mapped to whether it is a typed section itself (whose keys are checked in turn).
    Fields typed ``Any`` or ``dict`` (``data.open_dataset``, ``trainer.loss.variable_weights``)
    are not sections: they take any keys."""
    node = OmegaConf.structured(RunConfig) if node is None else node
    keys: dict[str, bool] = {}
    for key in node:
        child = node._get_node(key)
        typed = isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child))
        keys[prefix + str(key)] = typed
        if typed:
            keys.update(schema_keys(child, f"{prefix}{key}."))
    return keys


def added_keys(cfg: Any) -> list[tuple[str, str | None]]:
    """The keys of the composition ``cfg`` that the schema does not have, each with the nearest
    known key (or None).

    Hydra keeps the schema's struct flag through composition, so ``trainer.stpes=5`` fails
    there; but ``+trainer.stpes=5`` is Hydra's explicit *add*, which bypasses the struct flag
    (Hydra's own error for the first form even suggests it), so the added key is caught here.
    """
    known = schema_keys()
    plain = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg)
    plain.pop("hydra", None)  # present when composed with return_hydra_config=True
    found: list[tuple[str, str | None]] = []

    def walk(section: dict[str, Any], prefix: str) -> None:
        for key, value in section.items():
            path = f"{prefix}{key}"
            if path not in known:
                near = difflib.get_close_matches(path, list(known), n=1, cutoff=0.6)
                found.append((path, near[0] if near else None))
            elif known[path] and isinstance(value, dict):
                walk(value, path + ".")

    walk(plain, "")
    return found


register_configs()  # importing the schema makes it available to Hydra's compose API too
