"""Typed schema of a training run. Hydra merges ``configs/`` into it, so an unknown key or a
value of the wrong type fails at start naming the key; :func:`check_config` adds ranges."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from processor import ConfigError, ProcessorConfig
from processor.runtime.placement import PLACEMENTS
from processor.strategies import BUILT_IN, StrategyOptionError, resolve_strategy

FORECASTER_KEYS = ("hidden_grid", "encoder_neighbours", "decoder_neighbours")


def processor_schema(name: str, defaults: dict[str, Any], extra: list[tuple[str, type, Any]] = ()) -> type:
    """A Hydra schema (a dataclass) whose fields are :class:`processor.ProcessorConfig`'s, the
    strategy aside (it is a key of its own), with ``defaults``, after the ``extra`` fields.
    Derived, not copied: a setting added to the processor appears here."""
    specs: list[tuple[str, Any, Any]] = [(key, kind, field(default=value)) for key, kind, value in extra]
    for f in dataclasses.fields(ProcessorConfig):
        if f.name != "strategy":
            default = defaults.get(f.name, MISSING if f.default is dataclasses.MISSING else f.default)
            specs.append((f.name, f.type, field(default=default)))
    return dataclasses.make_dataclass(name, specs)


# The processor's settings, then the forecaster's own (FORECASTER_KEYS).
ModelConfig = processor_schema(
    "ModelConfig",
    dict(num_layers=4, num_channels=64, num_heads=4, window_size=64, mlp_hidden_ratio=2.0, num_chunks=0, qk_norm=True),
    extra=[
        ("hidden_grid", str, "o16"),  # the processor's grid
        ("encoder_neighbours", int, 4),  # data points feeding each hidden point
        ("decoder_neighbours", int, 3),  # hidden points feeding each data point
    ],
)


def processor_config(
    model: Any,
    strategy: str,
    key_prefix: str = "model.",
    strategy_key: str = "strategy.name",
    options: Mapping[str, Any] | None = None,
    option_prefix: str = "strategy.",
) -> ProcessorConfig:
    """The processor's configuration from a ``model`` section (its keys, and the forecaster's
    :data:`FORECASTER_KEYS`), the strategy's name and its ``options`` (those set, not None).

    Raises:
        ValueError: naming the config key (``key_prefix`` + field, ``strategy_key``, or
            ``option_prefix`` + option).
    """
    settings = {k: v for k, v in dict(model).items() if k not in FORECASTER_KEYS}
    set_options = {k: v for k, v in dict(options or {}).items() if v is not None}
    try:
        built = resolve_strategy(strategy, set_options) if strategy in BUILT_IN else strategy
        return ProcessorConfig.from_mapping(settings, strategy=built)
    except StrategyOptionError as exc:
        raise ValueError(f"config key {option_prefix}{exc.option}: {exc.message}") from None
    except ConfigError as exc:
        key = strategy_key if exc.key == "strategy" else key_prefix + exc.key
        raise ValueError(f"config key {key}: {exc.message}") from None


AUTO_KEYS = ("machine", "auto")  # strategy=auto's own settings, not options of the strategy it picks


def strategy_settings(strategy: Any) -> dict[str, Any]:
    """A ``strategy`` section's options (every key but ``name`` and auto's) as a dict."""
    return {k: v for k, v in dict(strategy).items() if k not in ("name", *AUTO_KEYS)}


@dataclass
class StrategyConfig:
    """The model-parallel strategy by name, and its options (None: the strategy's default)."""

    name: str = "shard_sequence"
    ring: bool | None = None  # shard_sequence, shard_hybrid: ring (true), halo (false), by the reach (null)
    head_group_size: int | None = None  # shard_hybrid: ranks per head group (null: largest divisor <= heads, <= 8)
    machine: str = "probe"  # auto: the machine it predicts for: probe | a preset (h100_nvlink_ib) | a probe's JSON
    auto: Any = None  # filled by strategy=auto: its pick and every candidate's predicted step time


@dataclass
class DataConfig:
    path: str | None = None  # an anemoi-datasets Zarr store (None: data.open_dataset must be set)
    grid: str | None = "o32"  # grid of the dataset's points, checked by coordinates; None: inferred from the store
    variables: list[str] | None = None  # None: every variable in the store
    lead_time: int | None = None  # hours from input to target, a multiple of the store's frequency; None: one step
    members: list[int] | None = None  # ensemble members to train on, each its own sample; None: all
    # Arguments of anemoi.datasets.open_dataset (select, start/end, frequency, join, ...): read through
    # anemoi-datasets instead of data.path, which is then not read. None: the store at data.path.
    open_dataset: Any = None  # a mapping; typed Any as OmegaConf cannot merge a mapping into a None Dict node
    generate: bool = True  # write the synthetic dataset first if ``path`` does not exist
    generate_steps: int = 400
    generate_seed: int = 1
    val_fraction: float = 0.1
    check_finite: bool = True  # scan the store for NaN/inf before training (chunk by chunk)


@dataclass
class RolloutConfig:
    """Autoregressive rollout of the training loss, raised on a schedule as anemoi does: the
    loss at step ``s`` averages ``min(max, start + s // increase_every)`` forecast steps, each
    fed the previous one's output, with gradients through all of them."""

    start: int = 1
    max: int = 1
    increase_every: int = 0  # optimiser steps between raises; 0: always ``start``


@dataclass
class LossConfig:
    area_weights: bool = False  # weight points by area (grid quadrature weights, else cos latitude)
    # {name: weight}, unlisted variables weigh 1. Typed Any: a struct Dict node refuses the
    # new keys of `trainer.loss.variable_weights={u: 2}` (Hydra would ask for a `+`).
    variable_weights: Any = None


@dataclass
class TrainerConfig:
    steps: int = 300
    batch_size: int = 1  # samples per data-parallel replica
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    val_interval: int = 50
    val_batches: int = 4
    checkpoint_interval: int = 100
    resume: bool = True
    stop_at_step: int | None = None  # end this run early (checkpointed); a later run resumes
    # auto: cuda when torch sees a GPU, else cpu. On cuda each local rank owns one GPU (NCCL).
    device: str = "auto"
    # Tests and debugging only: local ranks share one GPU over gloo, messages staged through host
    # memory (processor.distributed.HostStagedTransport); slow, never chosen by itself.
    debug_share_gpu: bool = False
    nprocs: int = 2  # local ranks to spawn when not started by torchrun
    ranks_per_model: int = 2  # model-parallel group size
    # within_nodes: a model group's ranks are consecutive, inside one node when ranks_per_model
    # divides the ranks per node; across_nodes: one rank per node (processor/runtime/placement.py)
    placement: str = "within_nodes"
    threads_per_rank: int = 1
    timeout_s: float = 300.0  # bounds every collective; a lost or stuck rank fails the run by then
    heartbeat_s: float = 1.0  # a rank silent for 3 heartbeats is named as lost
    # CPU: keep freed memory in the process. Faster steps (no page faults), but the heap can
    # fragment: turn off when memory, not time, is what limits the grid.
    retain_freed_memory: bool = True
    seed: int = 0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    fault_at_step: int | None = None  # test hook: fault_rank SIGKILLs itself in this step, once
    fault_rank: int = 1
    fault_scope: str = "rank"  # test hook: rank | node (the rank's torchrun agent and all its ranks)
    fault_every: int | None = None  # test hook: a rank SIGKILLed about every this many steps (training/faults.py)
    fault_seed: int = 0


@dataclass
class LoggingConfig:
    mlflow: bool = True
    tracking_uri: str | None = None  # None: sqlite store in the run directory
    experiment: str = "gridshard"
    run_name: str | None = None
    log_interval: int = 1


@dataclass
class EvaluateConfig:
    """Skill by lead time (``python -m training.evaluate``, and at the end of a training run)."""

    checkpoint: str | None = None  # a training checkpoint; None: the run directory's latest
    steps: int = 8  # forecast steps of the data's lead time to roll out to
    samples: int = 16  # initial dates, evenly spread over the validation period
    at_end_of_training: bool = True  # a training run evaluates its final model
    at_stop: bool = False  # ... also when it stops early (trainer.stop_at_step, Ctrl-C, SIGTERM)


@dataclass
class PredictConfig:
    """Forecasts to Zarr stores in the anemoi-datasets layout (``python -m training.predict``)."""

    checkpoint: str | None = None  # a training checkpoint; None: the run directory's latest
    initial_dates: list[str] | None = None  # ISO dates in the dataset; None: the first validation date
    steps: int = 8  # forecast steps of the data's lead time
    output: str | None = None  # directory of the stores; None: predictions/ in the checkpoint's run directory


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    run_dir: str = "."


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


# The app's own keys; the processor's are checked by ProcessorConfig.
_RANGES: list[tuple[str, Any, str]] = [
    ("model.encoder_neighbours", lambda v: v >= 1, ">= 1"),
    ("model.decoder_neighbours", lambda v: v >= 1, ">= 1"),
    ("data.val_fraction", lambda v: 0 < v < 1, "in (0, 1)"),
    ("data.generate_steps", lambda v: v >= 8, ">= 8"),
    ("trainer.steps", lambda v: v >= 1, ">= 1"),
    ("trainer.batch_size", lambda v: v >= 1, ">= 1"),
    ("trainer.lr", lambda v: v > 0, "> 0"),
    ("trainer.warmup_steps", lambda v: v >= 0, ">= 0"),
    ("trainer.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("trainer.grad_clip", lambda v: v >= 0, ">= 0 (0: off)"),
    ("trainer.precision", lambda v: v in ("fp32", "bf16"), "fp32|bf16"),
    ("trainer.val_interval", lambda v: v >= 1, ">= 1"),
    ("trainer.val_batches", lambda v: v >= 1, ">= 1"),
    ("trainer.checkpoint_interval", lambda v: v >= 1, ">= 1"),
    ("trainer.device", lambda v: v in ("auto", "cpu", "cuda"), "auto|cpu|cuda"),
    ("trainer.nprocs", lambda v: v >= 1, ">= 1"),
    ("trainer.ranks_per_model", lambda v: v >= 1, ">= 1"),
    ("trainer.timeout_s", lambda v: v > 0, "> 0"),
    ("trainer.heartbeat_s", lambda v: v > 0, "> 0"),
    ("trainer.fault_at_step", lambda v: v is None or v >= 0, ">= 0 or null"),
    ("trainer.fault_rank", lambda v: v >= 0, ">= 0"),
    ("trainer.fault_scope", lambda v: v in ("rank", "node"), "rank|node"),
    ("trainer.fault_every", lambda v: v is None or v >= 2, ">= 2 or null"),
    ("trainer.placement", lambda v: v in PLACEMENTS, "|".join(PLACEMENTS)),
    ("logging.log_interval", lambda v: v >= 1, ">= 1"),
    ("trainer.stop_at_step", lambda v: v is None or v >= 1, ">= 1 or null"),
    ("trainer.rollout.start", lambda v: v >= 1, ">= 1"),
    ("trainer.rollout.max", lambda v: v >= 1, ">= 1 (and >= trainer.rollout.start)"),
    ("trainer.rollout.increase_every", lambda v: v >= 0, ">= 0 (0: no schedule)"),
    ("evaluate.steps", lambda v: v >= 1, ">= 1"),
    ("evaluate.samples", lambda v: v >= 1, ">= 1"),
    ("predict.steps", lambda v: v >= 1, ">= 1"),
]


def check_config(cfg: Any, world_size: int | None = None) -> None:
    """Raise :class:`ConfigValueError` naming the first key that the schema does not know (see
    :func:`added_keys`) or whose value is out of range."""
    from omegaconf import OmegaConf

    added = added_keys(cfg)
    if added:
        key, near = added[0]
        hint = f": did you mean {near}?" if near else ""
        raise ConfigValueError(f"config key {key} is not a setting of the schema{hint}")
    for key, ok, expected in _RANGES:
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigValueError(f"config key {key} = {value!r} is out of range: expected {expected}")
    rollout = cfg.trainer.rollout
    if rollout.start > rollout.max:
        raise ConfigValueError(
            f"trainer.rollout.start = {rollout.start} is above trainer.rollout.max = {rollout.max}: need start <= max"
        )
    world = cfg.trainer.nprocs if world_size is None else world_size
    if world % cfg.trainer.ranks_per_model:
        raise ConfigValueError(
            f"trainer.ranks_per_model = {cfg.trainer.ranks_per_model} does not divide the world size {world}"
        )
    try:
        processor = processor_config(cfg.model, cfg.strategy.name, options=strategy_settings(cfg.strategy))
        processor.check_world_size(cfg.trainer.ranks_per_model)
    except ConfigError as exc:
        raise ConfigValueError(
            f"strategy={cfg.strategy.name} with trainer.ranks_per_model = {cfg.trainer.ranks_per_model}: {exc.message}"
        ) from None
    except ValueError as exc:  # processor_config's, naming the key
        raise ConfigValueError(str(exc)) from None


class ConfigValueError(ValueError):
    """A configuration the run cannot start with: an unknown key or a value out of range. The
    app prints it as one line (it is the user's to fix, not a bug)."""


def schema_keys(node: Any = None, prefix: str = "") -> dict[str, bool]:
    """Every key of the schema (:class:`TrainConfig`, or the typed section ``node``) as a dotted
    path, mapped to whether it is a typed section itself (whose keys are checked in turn).
    Fields typed ``Any`` or ``dict`` (``data.open_dataset``, ``trainer.loss.variable_weights``)
    are not sections: they take any keys."""
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.structured(TrainConfig) if node is None else node
    keys: dict[str, bool] = {}
    for key in node:
        child = node._get_node(key)
        typed = isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child))
        keys[prefix + str(key)] = typed
        if typed:
            keys.update(schema_keys(child, f"{prefix}{key}."))
    return keys


def added_keys(cfg: Any) -> list[tuple[str, str | None]]:
    """The keys of ``cfg`` that the schema does not have, each with the nearest known key (or None).

    Hydra keeps the schema's struct flag through composition, so ``trainer.stpes=5`` fails
    there; but ``+trainer.stpes=5`` is Hydra's explicit *add*, which bypasses the struct flag
    (Hydra's own error for the first form even suggests it), so the added key is caught here.
    """
    import difflib

    from omegaconf import DictConfig, OmegaConf

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
