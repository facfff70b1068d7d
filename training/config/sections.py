"""The sections of a training run's configuration beside the model and the strategy
(:class:`training.config.schema.RunConfig` holds them): data, trainer (with its rollout and loss),
debug, logging, evaluate, predict. Each field's default and range are declared on it
(:func:`training.config.settings.setting`), its meaning in the docstring beneath it; measured
reasons for a default are in docs/training.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from processor.matmul import BACKENDS as MATMUL_BACKENDS
from processor.runtime.placement import PLACEMENTS
from training.config.settings import Range, above, at_least, one_of, or_null, setting, within


@dataclass
class DataConfig:
    """The dataset: an anemoi-datasets Zarr store, or anything anemoi.datasets.open_dataset reads.
    A data preset (configs/data/) says where the data is, its grid, and whether to generate it."""

    path: str | None = MISSING
    """An anemoi-datasets Zarr store; None: ``data.open_dataset`` must be set."""
    grid: str | None = MISSING
    """The grid of the dataset's points, checked by coordinates; None: inferred from the store."""
    variables: list[str] | None = None
    """The store variables to use; None: every one."""
    forcing: list[str] = field(default_factory=list)
    """Inputs the model is given and never predicts, as anemoi's ``data.forcing``: store variables
    (lsm, z) and computed ones (cos_latitude, cos_local_time, insolation, ...:
    training/data/forcings.py)."""
    diagnostic: list[str] = field(default_factory=list)
    """Store variables predicted, never given as inputs."""
    lead_time: int | None = setting(None, or_null(at_least(1)))
    """Hours from input to target, a multiple of the store's frequency; None: derived from the
    store (6 h on a finer store that divides it, else one step; training/launch/store_settings.py)."""
    members: list[int] | None = None
    """Ensemble members to train on, each its own sample; None: all."""
    open_dataset: Any = None
    """Arguments of anemoi.datasets.open_dataset (select, start/end, frequency, join, ...), read
    through anemoi-datasets instead of ``data.path``. A mapping, typed Any: OmegaConf cannot merge
    a mapping into a None Dict node."""
    generate: bool = MISSING
    """Write the built-in synthetic dataset first if ``data.path`` does not exist."""
    generate_steps: int = setting(400, at_least(8))
    """Dates of the built-in dataset."""
    generate_seed: int = 1
    """Seed of the built-in dataset."""
    val_fraction: float | None = setting(None, or_null(within(0, 1, "()")))
    """The last part of the dates, held out for validation; None: derived from the store (from
    0.1 up to 0.3, enough for 64 initial dates where it allows)."""
    calibration_fraction: float | None = setting(None, or_null(within(0, 0.5, "[)")))
    """The part of the dates just before the validation period held out of training, on which
    the skill table's calibration is fitted (training/skill/calibration.py); 0: none, it is
    fitted on training dates; None: derived from the store (0.1 where the field input is on and
    1,024 one-step training samples are left, else 0)."""
    check_finite: bool = True
    """Scan the store for NaN/inf before training (chunk by chunk; missing dates excepted)."""
    preload: bool = True
    """Read each rank's points of every date into memory at start when they fit in half of the
    1 GiB a rank keeps of the store; false: read as needed."""


@dataclass
class RolloutConfig:
    """Autoregressive rollout of the training loss, raised on a schedule as anemoi does: the
    loss at step ``s`` is the mean, weighed by ``step_decay``, over ``min(max, start + s //
    increase_every)`` forecast steps, each fed the previous one's output, with gradients
    through all of them."""

    start: int = setting(1, at_least(1))
    """Forecast steps in the loss at the first step."""
    max: int = setting(1, at_least(1, " (and >= trainer.rollout.start)"))
    """The most forecast steps in the loss."""
    increase_every: int = setting(0, at_least(0, " (0: no schedule)"))
    """Optimiser steps between raises."""
    step_decay: float = setting(1.0, within(0, 1, "(]"))
    """The weight of each forecast step in the loss against the one before: step ``k`` (from 0)
    weighs ``step_decay ** k``, the weights scaled to average 1; 1: every step alike."""

    @property
    def most(self) -> int:
        """The most forecast steps the loss reaches (``start`` without raises)."""
        return self.max if self.increase_every else self.start

    def steps_at(self, step: int) -> int:
        """Forecast steps of the loss at optimiser step ``step``."""
        if self.increase_every == 0:
            return self.start
        return min(self.max, self.start + step // self.increase_every)


@dataclass
class LossConfig:
    """How the squared errors of the loss are weighted."""

    area_weights: bool = True
    """Weight points by their cell's area (Gaussian quadrature weights, latitude bands, box cells,
    Delaunay duals), as anemoi does; false: every point alike."""
    variable_weights: Any = None
    """``{name: weight}``; unlisted variables weigh 1. Typed Any: a struct Dict node refuses the
    new keys of ``trainer.loss.variable_weights={u: 2}`` (Hydra would ask for a ``+``)."""


@dataclass
class TrainerConfig:
    """The optimisation, the ranks and devices, validation and checkpoints."""

    steps: int = setting(1000, at_least(1))
    """Optimiser steps of the run."""
    batch_size: int | None = setting(None, or_null(at_least(1)))
    """Samples per data-parallel replica; None: derived from the store (the most, a power of two
    up to 16, whose data points fit in 16,384 on a limited area, 8,192 on global data; one on the
    built-in data's 5,248)."""
    lr: float | None = setting(None, or_null(above(0)))
    """AdamW's peak learning rate; None: derived from the store (1e-3 on a limited area, 3e-3 on
    global data)."""
    weight_decay: float = 0.01
    """AdamW's weight decay."""
    warmup_steps: int = setting(20, at_least(0))
    """Steps of the linear warm-up to ``lr``."""
    min_lr_ratio: float = setting(0.3, within(0, 1))
    """Where the cosine decay ends, as a fraction of ``lr``."""
    grad_clip: float = setting(1.0, at_least(0, " (0: off)"))
    """The largest gradient norm of the whole model (split parameters included)."""
    precision: str = setting("fp32", one_of("fp32", "bf16"))
    """``bf16``: autocast."""
    compile: bool = False
    """torch.compile the model for training (inductor: C++/OpenMP on a CPU, Triton on a GPU);
    the first steps compile, cached for later runs on the machine."""
    val_interval: int = setting(50, at_least(1))
    """Steps between validations (and the last step)."""
    val_batches: int = setting(8, at_least(1))
    """Batches of validation samples each validation scores."""
    checkpoint_interval: int = setting(200, at_least(1))
    """Steps between checkpoints (and the last step, and an early stop)."""
    weight_average: float | None = setting(None, or_null(within(0, 1, "()")))
    """The decay per step of a moving average of the parameters that is validated, kept as
    ``best.pt`` and scored (training/loop/weight_average.py); None: the parameters themselves."""
    keep_best: bool = True
    """Keep the model of the lowest validation loss as ``checkpoints/best.pt`` and score it at the
    end of the run (skill table, plots); false: score the last model."""
    patience: int | None = setting(None, or_null(at_least(1)))
    """Stop after this many validations in a row without a lower validation loss, then evaluate;
    None: train every ``trainer.steps``."""
    time_budget_min: float | None = setting(None, or_null(above(0)))
    """Stop after this many minutes of training (steps and validations, summed over resumed
    runs), checkpointed, then evaluate; None: no limit. The learning-rate schedule still spans
    ``trainer.steps``."""
    resume: bool = True
    """Continue the run directory's checkpoint when there is one."""
    stop_at_step: int | None = setting(None, or_null(at_least(1)))
    """End this run early at this step, checkpointed; a later command resumes it."""
    device: str = setting("auto", one_of("auto", "cpu", "cuda"))
    """``auto``: cuda when torch sees a GPU, else cpu. On cuda each local rank owns one GPU (NCCL)."""
    nprocs: int | None = setting(None, or_null(at_least(1)))
    """Local ranks to start when not started by torchrun; None: derived (one rank on every core
    for a hidden grid of up to 4,096 points on a CPU, else 2; one a GPU; torchrun's world)."""
    ranks_per_model: int | None = setting(None, or_null(at_least(1)))
    """The model-parallel group's size; None: every rank of the launch in one model."""
    placement: str = setting("within_nodes", one_of(*PLACEMENTS))
    """``within_nodes``: a model group's ranks are consecutive, inside one node when
    ``ranks_per_model`` divides the ranks per node; ``across_nodes``: one rank per node
    (processor/runtime/placement.py)."""
    threads_per_rank: int = setting(0, at_least(0, " (0: the node's cores shared among its local ranks)"))
    """CPU threads of each rank."""
    matmul: str = setting("auto", one_of("auto", *MATMUL_BACKENDS))
    """The float32 GEMM of the model's linear layers on a CPU (processor/matmul): ``aten``
    (torch's: MKL), ``onednn``, or ``auto``: the one measured faster on this host at the
    rank's thread count (cached per host; MKL runs its AVX2 code on AMD processors)."""
    timeout_s: float = setting(300.0, above(0))
    """Bounds every collective: a lost or stuck rank fails the run by then."""
    heartbeat_s: float = setting(1.0, above(0))
    """Heartbeat period; a rank silent for 3 heartbeats is named as lost."""
    retain_freed_memory: bool = True
    """CPU: keep freed memory in the process: no page faults in the steps, but the heap can
    fragment; turn off when memory, not time, is what limits the grid."""
    seed: int = 0
    """Seed of the initial parameters and of the samples' order."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout of the loss."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The weights of the loss."""


@dataclass
class DebugConfig:
    """Aids for finding what went wrong, and code from outside the stages that the training loop
    calls (:mod:`training.hooks`): the test suite's fault injection, the parity check's
    perturbation (docs/reliability.md). All off."""

    share_gpu: bool = False
    """Local ranks share one GPU over gloo, messages staged through host memory
    (processor.distributed.HostStagedTransport): slow; for tests and debugging on one GPU."""
    hooks: list[str] = field(default_factory=list)
    """Step hooks, each ``'package.module:ClassName'`` (a :class:`training.hooks.StepHook`),
    called in this order."""
    hook_settings: Any = None
    """The named hooks' settings, ``{name: value}`` (each hook takes the keys of its Settings
    dataclass). Typed Any: a struct Dict node refuses new keys without Hydra's ``+``."""


@dataclass
class LoggingConfig:
    """MLflow, and what the run measures of itself. The run directory's own record
    (``metrics.jsonl``, ``evaluations.jsonl``, the plots) is written either way."""

    mlflow: bool = True
    """Log to MLflow too."""
    plots: bool = True
    """Draw the pictures of a run's end and of an evaluation (loss curve, forecast map, skill by
    lead time), and log them to MLflow; false: the tables, metrics and checkpoints only (sweeps,
    tests: the pictures of a small run cost more than its training)."""
    tracking_uri: str | None = None
    """None: ``sqlite:///<run_dir>/mlflow.db``; or a tracking server, ``http://host:5000``."""
    experiment: str = "gridshard"
    """The MLflow experiment."""
    run_name: str | None = None
    """The MLflow run's name; None: MLflow's."""
    log_interval: int = setting(1, at_least(1))
    """Steps between logged metrics (validations and the profiled step always)."""
    profile_after: int | None = setting(20, or_null(at_least(0)))
    """Profile the step after this many steps of the run (once; null: never) and log the share of
    that step in the model's matmuls, attention and message passing (``model_compute_share``;
    CPU runs without ``trainer.compile``)."""


AREA_EXPECTED = "[north, west, south, east] in degrees, -90 <= south < north <= 90, or null"


@dataclass
class EvaluateConfig:
    """Skill by lead time (``python -m training.evaluate``, and at the end of a training run)."""

    checkpoint: str | None = None
    """A training checkpoint; None: the run directory's latest."""
    steps: int = setting(8, at_least(1))
    """Forecast steps of the data's lead time to roll out to."""
    samples: int | None = setting(None, or_null(at_least(1)))
    """Initial dates, evenly spread over the validation period; None: every validation initial
    date, at most 100."""
    calibrate: bool = True
    """The model's forecast is scored calibrated per lead toward the climatology and damped
    persistence (and the field map of each lead where ``data.calibration_fraction`` holds a period
    out; training/skill/calibration.py), its own forecast beside it as ``model_uncalibrated``."""
    at_end_of_training: bool = True
    """A training run evaluates its final model."""
    at_stop: bool = False
    """... also when it stops early (``trainer.stop_at_step``, Ctrl-C, SIGTERM)."""
    area: list[float] | None = setting(None, Range(lambda v: v is None or _is_area(v), AREA_EXPECTED))
    """Score only the points inside this box, ``[north, west, south, east]`` in degrees (anemoi's
    and MARS's order; west > east crosses the antimeridian): the region of interest of a larger
    domain the model runs on, as a limited-area model is judged on its inner region. The skill
    table, its plots, the calibration's fit and the validation's RMSE weigh those points alone;
    the loss still weighs every point. None: every point."""
    centroid_variable: str | None = "tracer"
    """The variable whose centroid position error is scored (training/skill/centroid.py); null:
    none. The default is skipped on a dataset without it; another name must be a dataset variable."""


@dataclass
class PredictConfig:
    """Forecasts to Zarr stores in the anemoi-datasets layout (``python -m training.predict``)."""

    checkpoint: str | None = None
    """A training checkpoint; None: the run directory's latest."""
    initial_dates: list[str] | None = None
    """ISO dates in the dataset; None: the first validation date."""
    steps: int = setting(8, at_least(1))
    """Forecast steps of the data's lead time."""
    output: str | None = None
    """The stores' directory; None: ``predictions/`` in the checkpoint's run directory."""


def _is_area(value: Any) -> bool:
    """Whether ``value`` is ``[north, west, south, east]``: four numbers, -90 <= south < north <= 90."""
    try:
        north, _, south, _ = (float(v) for v in value)
    except (TypeError, ValueError):
        return False
    return -90 <= south < north <= 90
