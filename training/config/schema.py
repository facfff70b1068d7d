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
from processor.runtime.placement import PLACEMENTS
from processor.strategies import BUILT_IN, StrategyOptionError, resolve_strategy
from training.config.library_schemas import LAUNCH_KEYS, processor_schema, strategy_options_schema
from training.config.parity_settings import ParityConfig
from training.config.settings import (
    ConfigValueError,
    above,
    at_least,
    from_settings,
    one_of,
    or_null,
    setting,
    to_settings,
    within,
)

__all__ = [
    "ConfigValueError",
    "DebugConfig",
    "ParityConfig",
    "RunConfig",
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
)
# The processor's settings, then the forecaster's own (FORECASTER_KEYS). A model preset
# (configs/model/) gives the sizes, which have no default here; the rest is the processor's
# default or the app's own choice below.
ModelConfig = processor_schema(
    "ModelConfig",
    dict(window_size=MISSING, mlp_hidden_ratio=2.0, num_chunks=0, qk_norm=True),
    extra=[
        ("hidden_grid", str, field(default=MISSING)),  # the processor's grid: oN or data (model/hidden_grid.py)
        ("hidden_stride", int, setting(1, at_least(1))),  # hidden_grid=data: every k-th row and column of the data
        ("encoder_neighbours", int, setting(4, at_least(1))),  # data points feeding each hidden point
        ("decoder_neighbours", int, setting(3, at_least(1))),  # hidden points feeding each data point
        # the encoder's and decoder's kind: attention over each point's edges, or anemoi-free mean messages
        ("mapper", str, setting("graph_transformer", one_of("graph_transformer", "mean_mlp"))),
        ("mapper_heads", int, setting(4, at_least(1))),  # the graph transformer's heads
        # learned features per data and hidden point, as anemoi's trainable_size: each point's
        # local climate, coast and hills, which its coordinates do not tell. 8 on real data
        # (data=zarr, data=era5_uk_2t: docs/real-data.md); 0 here: on the synthetic default, whose
        # points have no local climate, they cost 20% of the 24 h skill
        ("trainable_size", int, setting(0, at_least(0))),
        # predict each step's change in units of the changes' own spread over the training period
        # (anemoi's tendency statistics), not the field's (training/data/tendencies.py); off: on real
        # data it did not help (docs/real-data.md)
        ("normalise_increments", bool, field(default=False)),
        # each step is given the forcings at the date it forecasts too, not only at its input
        # date: the sun of the valid hour (docs/real-data.md)
        ("valid_time_forcing", bool, field(default=True)),
        # the states the model is given: the input date's and multistep_input - 1 before it, a lead
        # time apart (anemoi's training.multistep_input): what is changing, not only what is
        ("multistep_input", int, setting(1, at_least(1))),
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
    machine: str = "probe"  # auto: the machine it predicts for: probe | a preset (h100_nvlink_ib) | a probe's JSON
    consider: list[str] = field(default_factory=list)  # auto: your own strategies too ('package.module:ClassName')
    auto: Any = None  # filled by strategy=auto: its pick and every candidate's predicted step time


@dataclass
class DataConfig:
    """The dataset: an anemoi-datasets Zarr store, or anything anemoi.datasets.open_dataset reads."""

    # A data preset (configs/data/) says where the data is, its grid, and whether to generate it.
    path: str | None = MISSING  # an anemoi-datasets Zarr store (None: data.open_dataset must be set)
    grid: str | None = MISSING  # grid of the dataset's points, checked by coordinates; None: inferred from the store
    variables: list[str] | None = None  # None: every variable in the store
    # Inputs the model is given and never predicts, as anemoi's data.forcing: store variables
    # (lsm, z) and computed ones (cos_latitude, cos_local_time, insolation, ...: training/data/forcings.py).
    forcing: list[str] = field(default_factory=list)
    diagnostic: list[str] = field(default_factory=list)  # store variables predicted, never given as inputs
    lead_time: int | None = None  # hours from input to target, a multiple of the store's frequency; None: one step
    members: list[int] | None = None  # ensemble members to train on, each its own sample; None: all
    # Arguments of anemoi.datasets.open_dataset (select, start/end, frequency, join, ...): read through
    # anemoi-datasets instead of data.path, which is then not read. None: the store at data.path.
    open_dataset: Any = None  # a mapping; typed Any as OmegaConf cannot merge a mapping into a None Dict node
    generate: bool = MISSING  # write the built-in synthetic dataset first if ``path`` does not exist
    generate_steps: int = setting(400, at_least(8))
    generate_seed: int = 1
    val_fraction: float = setting(0.1, within(0, 1, "()"))
    check_finite: bool = True  # scan the store for NaN/inf before training (chunk by chunk; missing dates excepted)
    # Read each rank's points of every date into memory at start when they fit in half of the 1 GiB
    # a rank keeps of the store (a small store: no step then waits for a read); false: read as needed.
    preload: bool = True


@dataclass
class RolloutConfig:
    """Autoregressive rollout of the training loss, raised on a schedule as anemoi does: the
    loss at step ``s`` averages ``min(max, start + s // increase_every)`` forecast steps, each
    fed the previous one's output, with gradients through all of them."""

    start: int = setting(1, at_least(1))
    max: int = setting(1, at_least(1, " (and >= trainer.rollout.start)"))
    increase_every: int = setting(0, at_least(0, " (0: no schedule)"))  # optimiser steps between raises


@dataclass
class LossConfig:
    # Weight points by their cell's area (the dataset's area_weights: Gaussian quadrature weights,
    # latitude bands, box cells, Delaunay duals), as anemoi does; false: every point alike.
    area_weights: bool = True
    # {name: weight}, unlisted variables weigh 1. Typed Any: a struct Dict node refuses the
    # new keys of `trainer.loss.variable_weights={u: 2}` (Hydra would ask for a `+`).
    variable_weights: Any = None


@dataclass
class TrainerConfig:
    steps: int = setting(1000, at_least(1))  # 600 -> 1000: RMSE / persistence at 24 h 0.27 -> 0.15 (docs/mappers.md)
    batch_size: int = setting(1, at_least(1))  # samples per data-parallel replica
    lr: float = setting(3e-3, above(0))
    weight_decay: float = 0.01
    warmup_steps: int = setting(20, at_least(0))
    min_lr_ratio: float = setting(0.3, within(0, 1))  # the cosine ends at 0.3 lr: u's tendency is learned late
    grad_clip: float = setting(1.0, at_least(0, " (0: off)"))
    precision: str = setting("fp32", one_of("fp32", "bf16"))  # bf16: autocast
    # torch.compile the model for training (inductor: C++/OpenMP on a CPU, Triton on a GPU): fewer,
    # fused kernels; the first steps compile (cached for later runs on the machine). docs/training.md
    compile: bool = False
    val_interval: int = setting(50, at_least(1))
    val_batches: int = setting(8, at_least(1))
    checkpoint_interval: int = setting(200, at_least(1))
    resume: bool = True
    stop_at_step: int | None = setting(None, or_null(at_least(1)))  # end this run early (checkpointed); resumable
    # auto: cuda when torch sees a GPU, else cpu. On cuda each local rank owns one GPU (NCCL).
    device: str = setting("auto", one_of("auto", "cpu", "cuda"))
    nprocs: int = setting(2, at_least(1))  # local ranks to spawn when not started by torchrun
    ranks_per_model: int = setting(2, at_least(1))  # model-parallel group size
    # within_nodes: a model group's ranks are consecutive, inside one node when ranks_per_model
    # divides the ranks per node; across_nodes: one rank per node (processor/runtime/placement.py)
    placement: str = setting("within_nodes", one_of(*PLACEMENTS))
    threads_per_rank: int = setting(1, at_least(0, " (0: the node's cores shared among its local ranks)"))
    timeout_s: float = setting(300.0, above(0))  # bounds every collective; a lost or stuck rank fails the run by then
    heartbeat_s: float = setting(1.0, above(0))  # a rank silent for 3 heartbeats is named as lost
    # CPU: keep freed memory in the process. Faster steps (no page faults), but the heap can
    # fragment: turn off when memory, not time, is what limits the grid.
    retain_freed_memory: bool = True
    seed: int = 0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)


@dataclass
class DebugConfig:
    """Aids for finding what went wrong, and code from outside the stages that the training loop
    calls (:mod:`training.hooks`): the test suite's fault injection, the parity check's
    perturbation (docs/reliability.md). All off."""

    # Local ranks share one GPU over gloo, messages staged through host memory
    # (processor.distributed.HostStagedTransport): slow; for tests and debugging on one GPU.
    share_gpu: bool = False
    # Step hooks, each 'package.module:ClassName' (a training.hooks.StepHook), called in this order.
    hooks: list[str] = field(default_factory=list)
    # The named hooks' settings, {name: value} (each hook takes the keys of its Settings
    # dataclass). Typed Any: a struct Dict node refuses new keys without Hydra's `+`.
    hook_settings: Any = None


@dataclass
class LoggingConfig:
    mlflow: bool = True
    tracking_uri: str | None = None  # None: sqlite:///<run_dir>/mlflow.db; or http://host:5000
    experiment: str = "gridshard"
    run_name: str | None = None
    log_interval: int = setting(1, at_least(1))
    # Profile the step after this many steps of the run (once; null: never) and log the share of
    # that step in the model's matmuls, attention and message passing (model_compute_share; CPU
    # runs without trainer.compile).
    profile_after: int | None = setting(20, or_null(at_least(0)))


@dataclass
class EvaluateConfig:
    """Skill by lead time (``python -m training.evaluate``, and at the end of a training run)."""

    checkpoint: str | None = None  # a training checkpoint; None: the run directory's latest
    steps: int = setting(8, at_least(1))  # forecast steps of the data's lead time to roll out to
    samples: int = setting(16, at_least(1))  # initial dates, evenly spread over the validation period
    at_end_of_training: bool = True  # a training run evaluates its final model
    at_stop: bool = False  # ... also when it stops early (trainer.stop_at_step, Ctrl-C, SIGTERM)
    # the variable whose centroid position error is scored (training/skill/centroid.py); null: none.
    # The default is skipped on a dataset without it; another name must be a dataset variable.
    centroid_variable: str | None = "tracer"


@dataclass
class PredictConfig:
    """Forecasts to Zarr stores in the anemoi-datasets layout (``python -m training.predict``)."""

    checkpoint: str | None = None  # a training checkpoint; None: the run directory's latest
    initial_dates: list[str] | None = None  # ISO dates in the dataset; None: the first validation date
    steps: int = setting(8, at_least(1))  # forecast steps of the data's lead time
    output: str | None = None  # directory of the stores; None: predictions/ in the checkpoint's run directory


@dataclass
class RunConfig:
    """A training run's whole configuration (also evaluation's and prediction's)."""

    model: ModelConfig = field(default_factory=ModelConfig)  # type: ignore[valid-type]
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)
    run_dir: str = MISSING  # configs/config.yaml: Hydra's output directory (hydra.run.dir)


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
