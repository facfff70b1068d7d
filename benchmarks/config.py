"""Typed schema of one benchmark point. Hydra merges ``configs/benchmark.yaml`` into it, so an
unknown key or a wrong type fails at start naming the key; :func:`check_point` adds ranges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from benchmarks.torchrun_world import world_skip_reason
from processor import ConfigError
from processor.grids import grid_points
from processor.runtime.placement import PLACEMENTS
from processor.strategies import BUILT_IN
from processor.strategies import strategy_options as strategy_option_names
from training.config import processor_config, processor_schema

TARGETS = ("processor", "train_step")

# The processor's settings (every ProcessorConfig field but the strategy, a key of its own).
BenchModelConfig = processor_schema(
    "BenchModelConfig",
    dict(num_layers=2, num_channels=64, num_heads=4, window_size=128, mlp_hidden_ratio=4.0, num_chunks=0),
)


@dataclass
class BenchLoggingConfig:
    mlflow: bool = True
    tracking_uri: str | None = None  # None: sqlite store beside the results
    experiment: str = "gridshard-benchmarks"


@dataclass
class ProbeConfig:
    """The memory/scale probe (``python -m benchmarks.scale_probe``)."""

    budget_gib: float = 20.0  # CPU: the machine's memory shared by all ranks; cuda: each GPU's
    fit_grids: list[str] = field(default_factory=lambda: ["o32", "o64"])  # measured to fit the memory model
    family: str = "o"  # candidate grids: oN or fN, N a multiple of `step`
    step: int = 8
    margin: float = 0.95  # aim below the budget by this factor
    verify: bool = True  # measure the predicted grid (and step down while it does not fit)
    max_tries: int = 3


@dataclass
class BenchmarkConfig:
    target: str = "processor"  # processor: its forward+backward; train_step: the whole forecaster step
    grid: str = "o32"  # the processor's grid (oN, fN, nN)
    data_grid: str | None = None  # train_step only: the data grid (None: same as grid)
    num_variables: int = 8  # train_step only
    strategy: str = "shard_sequence"
    ring: bool | None = None  # shard_sequence, shard_hybrid: ring (true), halo (false), by the reach (null)
    head_group_size: int | None = None  # shard_hybrid: ranks per head group (null: largest divisor <= heads, <= 8)
    ranks: int = 1
    placement: str = "within_nodes"  # under torchrun: the point's ranks inside a node, or across_nodes
    device: str = "cpu"  # cpu (gloo) | cuda (NCCL, one GPU per rank)
    threads_per_rank: int = 1
    batch_size: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    segments: int = 0  # processor only: pack this many equal segments into the points (segment ids); 0: none

    retain_freed_memory: bool = True  # CPU: keep freed memory (fast steps); false: return it at once (lean peaks)
    compare_local_copy: bool = False  # shard_sequence: also time each step with the halo exchange as a local copy
    profile: bool = False  # rank 0 profiles one more step: time split by kernel
    warmup: int = 1
    steps: int = 3
    seed: int = 0
    timeout_s: float = 900.0
    results_root: str = "benchmarks/results"  # the sweep's MLflow store lives here
    model: BenchModelConfig = field(default_factory=BenchModelConfig)
    logging: BenchLoggingConfig = field(default_factory=BenchLoggingConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)


_RANGES: list[tuple[str, Any, str]] = [
    ("target", lambda v: v in TARGETS, "|".join(TARGETS)),
    ("ranks", lambda v: v >= 1, ">= 1"),
    ("placement", lambda v: v in PLACEMENTS, "|".join(PLACEMENTS)),
    ("device", lambda v: v in ("cpu", "cuda"), "cpu|cuda"),
    ("threads_per_rank", lambda v: v >= 1, ">= 1"),
    ("batch_size", lambda v: v >= 1, ">= 1"),
    ("precision", lambda v: v in ("fp32", "bf16"), "fp32|bf16"),
    ("segments", lambda v: v >= 0, ">= 0 (0: no segment ids)"),
    ("warmup", lambda v: v >= 0, ">= 0"),
    ("steps", lambda v: v >= 1, ">= 1"),
    ("num_variables", lambda v: v >= 1, ">= 1"),
    ("timeout_s", lambda v: v > 0, "> 0"),
    ("probe.budget_gib", lambda v: v > 0, "> 0"),
    ("probe.family", lambda v: v in ("o", "f"), "o|f"),
    ("probe.step", lambda v: v >= 1, ">= 1"),
    ("probe.margin", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("probe.max_tries", lambda v: v >= 1, ">= 1"),
]


STRATEGY_OPTIONS = ("ring", "head_group_size")  # top-level keys passed to the strategies that have them


def strategy_options(cfg: Any) -> dict[str, Any]:
    """:func:`training.config.processor_config`'s arguments for the strategy's options: the
    top-level keys here (``ring=false``) that the point's strategy has, so that a sweep over
    strategies may set an option of one of them."""
    known = strategy_option_names(cfg["strategy"]) if cfg["strategy"] in BUILT_IN else ()
    return {"options": {key: cfg[key] for key in STRATEGY_OPTIONS if key in known}, "option_prefix": ""}


def check_point(cfg: Any) -> None:
    """Raise ``ValueError`` naming the first key that is out of range or an unknown grid."""
    from omegaconf import OmegaConf

    for key, ok, expected in _RANGES:
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ValueError(f"config key {key} = {value!r} is out of range: expected {expected}")
    for key in ("grid", "data_grid"):
        value = OmegaConf.select(cfg, key)
        if value is not None:
            grid_points(value)  # raises ValueError naming the grid
    if cfg.target == "train_step" and cfg.segments:
        raise ValueError("config key segments: segment ids are a processor benchmark (target=processor)")
    if cfg.target == "train_step":
        for name in (cfg.grid, cfg.data_grid or cfg.grid):
            if not name.startswith(("o", "f")):
                raise ValueError(f"target=train_step needs grid coordinates: use an oN or fN grid, not {name}")
    processor_config(cfg.model, cfg.strategy, key_prefix="model.", strategy_key="strategy", **strategy_options(cfg))


def skip_reason(cfg: Any) -> str | None:
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
