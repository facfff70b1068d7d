"""Typed schema of one benchmark point. Hydra merges ``configs/benchmark/`` into it, so an unknown
key or a wrong type fails at start naming the key; :func:`point_config` makes the composition a
:class:`BenchmarkConfig` once, and :func:`check_point` checks it: the ranges declared beside each
field (:func:`training.config.settings.setting`), the grids and the processor's own checks."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from processor import ConfigError
from processor.grids import grid_points
from processor.matmul import BACKENDS as MATMUL_BACKENDS
from processor.runtime.placement import PLACEMENTS
from processor.runtime.torchrun import under_torchrun
from processor.strategies import BUILT_IN
from processor.strategies import strategy_options as strategy_option_names
from training.config.library_schemas import processor_schema
from training.config.schema import StrategyOptions, processor_config
from training.config.settings import ConfigValueError, above, at_least, check_ranges, one_of, setting, within

TARGETS = ("processor", "train_step")

# The processor's settings (every ProcessorConfig field but the strategy, a key of its own).
BenchModelConfig = processor_schema(
    "BenchModelConfig",
    dict(num_layers=2, num_channels=64, num_heads=4, window_size=128, mlp_hidden_ratio=4.0, num_chunks=0),
    module=__name__,
)


@dataclass
class BenchLoggingConfig:
    mlflow: bool = True
    tracking_uri: str | None = None  # None: sqlite store beside the results
    experiment: str = "gridshard-benchmarks"


@dataclass
class ProbeConfig:
    """The memory/scale probe (``python -m benchmarks.scale_probe``)."""

    budget_gib: float = setting(20.0, above(0))  # CPU: the machine's memory shared by all ranks; cuda: each GPU's
    fit_grids: list[str] = setting(factory=lambda: ["o32", "o64"])  # measured to fit the memory model
    family: str = setting("o", one_of("o", "f"))  # candidate grids: oN or fN, N a multiple of `step`
    step: int = setting(8, at_least(1))
    margin: float = setting(0.95, within(0, 1, "(]"))  # aim below the budget by this factor
    verify: bool = True  # measure the predicted grid (and step down while it does not fit)
    max_tries: int = setting(3, at_least(1))


@dataclass
class BenchmarkConfig(StrategyOptions):  # type: ignore[misc, valid-type]
    """One point: what is timed, on which grid, strategy and ranks. The strategy's options
    (``ring=false``, ``head_group_size=2``) are the built-in strategies' own fields, set at the
    top level so that a sweep over strategies may set an option of one of them."""

    target: str = setting("processor", one_of(*TARGETS))  # processor: its forward+backward; train_step: the whole step
    grid: str = "o32"  # the processor's grid (oN, fN, nN)
    data_grid: str | None = None  # train_step only: the data grid (None: same as grid)
    num_variables: int = setting(8, at_least(1))  # train_step only
    strategy: str = "shard_sequence"
    ranks: int = setting(1, at_least(1))
    # under torchrun: the point's ranks inside a node, or across_nodes
    placement: str = setting("within_nodes", one_of(*PLACEMENTS))
    device: str = setting("cpu", one_of("cpu", "cuda"))  # cpu (gloo) | cuda (NCCL, one GPU per rank)
    threads_per_rank: int = setting(1, at_least(1))
    matmul: str = setting("aten", one_of(*MATMUL_BACKENDS))  # the linears' float32 GEMM on a CPU (processor/matmul)
    batch_size: int = setting(1, at_least(1))
    precision: str = setting("fp32", one_of("fp32", "bf16"))  # bf16: autocast
    # processor only: pack this many equal segments into the points (segment ids); 0: none
    segments: int = setting(0, at_least(0, " (0: no segment ids)"))

    retain_freed_memory: bool = True  # CPU: keep freed memory (fast steps); false: return it at once (lean peaks)
    compare_local_copy: bool = False  # also time each step with every exchange a local copy of its bytes
    profile: bool = False  # rank 0 profiles one more step: time split by kernel
    warmup: int = setting(1, at_least(0))
    steps: int = setting(3, at_least(1))
    gemm_size: int = setting(2048, at_least(16))  # the side of the fp32 GEMM every efficiency is a share of
    seed: int = 0
    timeout_s: float = setting(900.0, above(0))
    results_root: str = "benchmarks/results"  # the sweep's MLflow store lives here
    model: BenchModelConfig = field(default_factory=BenchModelConfig)  # type: ignore[valid-type]
    logging: BenchLoggingConfig = field(default_factory=BenchLoggingConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)


def point_config(composed: Any) -> BenchmarkConfig:
    """The typed point of Hydra's composition ``composed`` (a ``DictConfig``; a
    :class:`BenchmarkConfig` is returned as it is), interpolations resolved."""
    from omegaconf import OmegaConf

    if isinstance(composed, BenchmarkConfig):
        return composed
    typed = OmegaConf.to_object(composed)
    assert isinstance(typed, BenchmarkConfig), type(typed)
    return typed


def strategy_options(cfg: BenchmarkConfig) -> dict[str, Any]:
    """:func:`training.config.schema.processor_config`'s arguments for the strategy's options: the
    top-level options here (``ring=false``) that the point's strategy has, so that a sweep over
    strategies may set an option of one of them."""
    known = strategy_option_names(cfg.strategy) if cfg.strategy in BUILT_IN else ()
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(StrategyOptions) if f.name in known}
    return {"options": options, "option_prefix": ""}


def check_point(cfg: BenchmarkConfig) -> None:
    """Raise ``ValueError`` naming the first key that is out of range or an unknown grid."""
    check_ranges(cfg)
    for key in ("grid", "data_grid"):
        value = getattr(cfg, key)
        if value is not None:
            grid_points(value)  # raises ValueError naming the grid
    if cfg.target == "train_step" and cfg.segments:
        raise ConfigValueError("config key segments: segment ids are a processor benchmark (target=processor)")
    if cfg.target == "train_step":
        for name in (cfg.grid, cfg.data_grid or cfg.grid):
            if not name.startswith(("o", "f")):
                raise ConfigValueError(f"target=train_step needs grid coordinates: use an oN or fN grid, not {name}")
    processor_config(cfg.model, cfg.strategy, key_prefix="model.", strategy_key="strategy", **strategy_options(cfg))


def world_skip_reason(ranks: int) -> str | None:
    """Why a point of ``ranks`` cannot run on this torchrun world (None outside torchrun)."""
    if not under_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world % ranks:
        return f"ranks = {ranks} does not divide the {world} ranks torchrun started"
    return None


def skip_reason(cfg: BenchmarkConfig) -> str | None:
    """Why a point of a cross-product sweep is not run (``None``: it is run)."""
    if cfg.strategy != "none" and cfg.ranks == 1:
        return "one rank is the strategy none baseline"
    reason = world_skip_reason(cfg.ranks)
    if reason is not None:
        return reason
    try:
        processor_config(cfg.model, cfg.strategy, strategy_key="strategy", **strategy_options(cfg)).check_world_size(
            cfg.ranks
        )
    except ConfigError as exc:
        return exc.message
    return None


ConfigStore.instance().store(name="benchmark_schema", node=BenchmarkConfig)
