"""The run's settings derived from the store, for every key the configuration leaves null: what a
practitioner would pick from what the store says, so that ``data=zarr data.path=S`` alone runs.

- ``model.hidden_grid``, from the data's extent: on global data the octahedral ``oN`` of at most
  a third of its points, from ``o8`` to ``o96`` (anemoi's for n320 data); on a regional box or
  point set ``data``, its own points.
- ``model.hidden_stride``: with ``data``, the smallest stride leaving at most
  :data:`MAX_DATA_HIDDEN` hidden points (1 with ``oN``).
- ``data.lead_time``, from the store's frequency: 6 h (anemoi's step) on a store finer than that
  which divides it, else one step of the store.
- ``data.val_fraction``: the smallest share of the dates, from 0.1 to :data:`MAX_VAL_FRACTION`,
  that leaves :data:`VAL_DATES` initial dates with their history and ``evaluate.steps`` targets.
- ``evaluate.samples``: every validation initial date, at most :data:`MAX_EVAL_SAMPLES`.
- ``trainer.nprocs``: on a CPU one rank, its threads every core, up to :data:`ONE_RANK_HIDDEN`
  hidden points, else 2; on CUDA one a GPU; under torchrun its world.
- ``trainer.ranks_per_model``: every rank in one model.
- The recipe, from the data's extent: on a limited area (a regional box or point set) each step
  is learned over the per-point regression (``model.baseline``), with :data:`AREA_NODE_FEATURES`
  learned features per point (``model.trainable_size``) and :data:`AREA_INPUT_STATES` input states
  (``model.multistep_input``), at the learning rate :data:`AREA_LR` (``trainer.lr``); on global
  data over persistence, with neither, at :data:`GLOBAL_LR`.
- ``model.field_input``: on where each step is learned over the per-point regression, one rank
  holds a model (``trainer.ranks_per_model=1``), the step is not compiled and the fit's samples
  and maps fit in :data:`~training.model.field_forecast.MAX_FIELD_VALUES` with at least
  :data:`~training.model.field_forecast.MIN_FIELD_SAMPLES` training samples; off elsewhere.
- ``data.calibration_fraction``: where the field input is on, :data:`CALIBRATION_FRACTION` of the
  dates before the validation period, held out of training for the calibration, if it holds
  :data:`CALIBRATION_DAYS` days of dates and
  :data:`~training.model.field_forecast.MIN_FIELD_SAMPLES` one-step training samples are left;
  0 elsewhere.
- ``trainer.batch_size``: the most samples, a power of two up to :data:`MAX_BATCH`, whose data
  points fit in :data:`AREA_POINTS_PER_STEP` on a limited area, :data:`GLOBAL_POINTS_PER_STEP` on
  global data (one where a sample alone is more).

Each derived value is logged with its reason (:func:`describe`); a value on the command line or
in a config file is never changed. Saved in the run's settings, a resumed run keeps them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from processor.host import usable_cores
from processor.point_sets import PointSet
from processor.runtime.torchrun import under_torchrun
from training.config.checks import AUTO, DATA
from training.config.schema import RunConfig
from training.data import DatasetError, ZarrDataset
from training.data.open_store import dataset_samples
from training.data.samples import build_samples, lead_steps, period_bounds, select_members
from training.model.build import forcings_per_step
from training.model.field_forecast import MIN_FIELD_SAMPLES, field_samples_that_fit
from training.model.hidden_grid import hidden_grid
from training.model.linear_baseline import LINEAR_REGRESSION, PERSISTENCE
from training.model.rollout import rollout_horizon

HIDDEN_SHARE = 3  # a global hidden grid: at most a third of the data's points
MIN_OCTAHEDRAL = 8  # o8: the coarsest global hidden grid (576 points)
MAX_OCTAHEDRAL = 96  # o96 (40,320 points): anemoi's hidden grid for n320 data, the finest derived
# hidden_grid=data: coarsened above this many points (1,000 before). On the two real stores of
# 500-1,000 points (docs/real-data.md, 2026-11-30) a stride of 2 (NCEP's 561 points -> 153
# hidden, CORDEX's 840 -> 210) in 50-62% of the run's time won at every lead of the pressure and
# the temperature on both seeds (+2.7 to +3.2 and +3.7 to +4.8 points at 1 day); the
# precipitation moved -0.4 to +1.1 points. The processor's window of 64 points then spans four
# times the area. Coarser than this cap did not pay: E-OBS's 330 points at stride 2 were level (seed 0:
# -1.0 to +0.8), INCA's 340 hourly ones lost up to 35 points at 6 h, and ERA5 at stride 3 (204
# hidden, not 425) lost 6-7 points at 12-24 h.
MAX_DATA_HIDDEN = 500
ANEMOI_STEP_H = 6
VAL_DATES = 64  # initial dates scored, where the store allows
MIN_VAL_FRACTION, MAX_VAL_FRACTION = 0.1, 0.3
MAX_EVAL_SAMPLES = 100
# One rank on every core up to here (measured on 2-core hosts only): one rank of 2 threads ran a
# step faster than 2 ranks of one at 404 hidden points (1.6x), at 1,600 on every kind measured
# (1.15-1.6x) and at 3,168 (o24: 1.03-1.6x); the halo exchanges cost more than the split saves.
ONE_RANK_HIDDEN = 4096
# The recipe on a limited area (docs/real-data.md: on the four real regional stores each of the
# three moved the first lead toward the regression's skill and past it; on the global built-in data
# they cost 20-130% of the model's RMSE).
AREA_BASELINE = LINEAR_REGRESSION
AREA_NODE_FEATURES = 8
AREA_INPUT_STATES = 2
# A third of the global run's rate on a limited area (docs/real-data.md, 2026-11-29): on the four
# real stores it moved the seeds' mean margin at the first lead by +6 points (ERA5, six seeds), +1
# to +10 (INCA's three variables, four seeds), +1.3 (NCEP) and +1.7 (Iberia), and most later leads
# with it; on the synthetic regional store by +10 to +31 points.
AREA_LR = 1e-3
GLOBAL_LR = 3e-3
# A step costs nearly the same from 35 to 1,617 points (#55): a batch of several samples buys
# gradient quality for little time (docs/real-data.md: batch 8 took Iberia's first lead from +1%
# to +17% and NCEP's from +1% to +19%). Up to a cap of data points a step: above, the work grows with
# the batch (NCEP's 16 x 561 points: 285 ms a step, a run over 5 minutes, at its own 561 hidden
# points), and the built-in data's 5,248 points keep batches of one. On a limited area twice that
# since the hidden grid is coarsened from 500 points (docs/real-data.md, 2026-11-30): batch 16 on
# NCEP (+3.1 / +4.6 points at 1 day, every lead on both seeds) and CORDEX (+2.0 / +2.5 for the
# temperature), 8 on ERA5 (seed means +6.7 points at 6 h, +4.3 at 24 h) and on the synthetic
# regional store (+10 to +14 points at every lead), each run at most 3.5 minutes on Zen 4.
# Where the field input is on, the last tenth of the dates before validation is held out of
# training and the calibration fitted there, with the field map of each lead beside the model
# (docs/real-data.md, 2026-12-07): fitted on dates the model trained on, the calibration
# weighed the model's later leads as if it had not overfit them.
CALIBRATION_FRACTION = 0.1
# ... where that period holds a year of dates: every season in the calibration. On NCEP's ten years
# (a year held out) every lead gained on both seeds; on the stores of 20 winters (two winters held
# out, about 180 dates) the later leads lost up to 3 points on most variables (docs/real-data.md).
CALIBRATION_DAYS = 365
GLOBAL_POINTS_PER_STEP = 8192
AREA_POINTS_PER_STEP = 16384
MAX_BATCH = 16


@dataclass(frozen=True)
class Derived:
    """A setting the store decided: its key, value and the reason, as the start-up log says it."""

    key: str
    value: Any
    why: str


def octahedral_points(n: int) -> int:
    """Points of the octahedral reduced Gaussian grid ``oN``: ``4 N^2 + 36 N``."""
    return 4 * n * n + 36 * n


def derive_hidden_grid(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """``model.hidden_grid`` and ``model.hidden_stride`` where null (see the module)."""
    model, points = cfg.model, dataset.point_set
    n_data, out = len(dataset.latitudes), []
    if model.hidden_grid == AUTO:
        if points.is_global and model.hidden_stride in (None, 1):
            n = MIN_OCTAHEDRAL
            while n < MAX_OCTAHEDRAL and octahedral_points(n + 1) <= n_data / HIDDEN_SHARE:
                n += 1
            model.hidden_grid = f"o{n}"
            why = f"global data of {n_data:,} points: o{n}, {octahedral_points(n):,} points"
        else:
            model.hidden_grid = DATA
            why = f"{points.name}: the data's own points" if not points.is_global else "model.hidden_stride given"
        out.append(Derived("model.hidden_grid", model.hidden_grid, why))
    if model.hidden_stride is None:
        stride = 1
        if model.hidden_grid == DATA:
            stride = max(1, math.ceil(math.sqrt(n_data / MAX_DATA_HIDDEN)))
        model.hidden_stride = stride
        if model.hidden_grid == DATA:
            kept = "all of them"
            if stride > 1:  # how PointSet.coarsened keeps them
                rows = points.rows is not None
                kept = f"one row and column in {stride}" if rows else f"one point in {stride**2} along the curve"
            why = f"{n_data:,} data points, about {MAX_DATA_HIDDEN:,} hidden at most: {kept}"
            out.append(Derived("model.hidden_stride", stride, why))
    return out


def derive_lead_time(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """``data.lead_time`` where null: 6 h on a finer store that divides it, else the store's step."""
    if cfg.data.lead_time is not None:
        return []
    frequency_h = dataset.frequency_s / 3600
    if frequency_h < ANEMOI_STEP_H and (ANEMOI_STEP_H * 3600) % dataset.frequency_s == 0:
        cfg.data.lead_time = ANEMOI_STEP_H
        why = f"a store every {frequency_h:g} h: anemoi's {ANEMOI_STEP_H} h step"
    else:
        cfg.data.lead_time = max(1, round(frequency_h))
        why = f"one step of the store ({frequency_h:g} h)"
    return [Derived("data.lead_time", cfg.data.lead_time, why)]


def validation_starts(cfg: RunConfig, dataset: ZarrDataset, fraction: float) -> int:
    """Distinct initial dates the validation period of ``fraction`` leaves for ``evaluate.steps``
    leads and the model's history (0 where no sample is left in a period)."""
    horizon = max(cfg.evaluate.steps, rollout_horizon(cfg.trainer))
    lead = lead_steps(cfg.data.lead_time, dataset.frequency_s, str(dataset.path))
    members = select_members(dataset.n_members, cfg.data.members)
    try:
        samples = build_samples(
            dataset.n_times, dataset.missing, members, lead, fraction, horizon, cfg.model.multistep_input - 1
        )
    except DatasetError:
        return 0
    return len({t for t, _ in samples.val})


def one_step_training_samples(cfg: RunConfig, dataset: ZarrDataset) -> int:
    """The one-step training samples the session fits its regressions on, 0 where none."""
    try:
        return len(dataset_samples(cfg.data, dataset, 1, cfg.model.multistep_input - 1).train)
    except DatasetError:
        return 0


def derive_validation(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """``data.val_fraction`` and ``evaluate.samples`` where null (see the module)."""
    out = []
    if cfg.data.val_fraction is None:
        fraction = MIN_VAL_FRACTION
        found = validation_starts(cfg, dataset, fraction)
        while found < VAL_DATES and fraction < MAX_VAL_FRACTION - 1e-9:
            fraction = round(fraction + 0.01, 2)
            found = validation_starts(cfg, dataset, fraction)
        cfg.data.val_fraction = fraction
        enough = "" if found >= VAL_DATES else f" (the store allows no more; {VAL_DATES} wanted)"
        why = f"the last {fraction:.0%} of {dataset.n_times:,} dates: {found} initial dates{enough}"
        out.append(Derived("data.val_fraction", fraction, why))
    elif cfg.evaluate.samples is None:
        found = validation_starts(cfg, dataset, cfg.data.val_fraction)
    if cfg.evaluate.samples is None:
        cfg.evaluate.samples = max(1, min(found, MAX_EVAL_SAMPLES))
        why = f"{found} validation initial dates, at most {MAX_EVAL_SAMPLES}"
        out.append(Derived("evaluate.samples", cfg.evaluate.samples, why))
    return out


def derive_recipe(cfg: RunConfig, points: PointSet) -> list[Derived]:
    """``model.baseline``, ``model.trainable_size``, ``model.multistep_input`` and ``trainer.lr``
    where not set, from the extent of the data's ``points`` (see the module)."""
    model, area = cfg.model, not points.is_global
    where = f"a limited area: {points.name}" if area else "global data"
    picks = {
        "baseline": AREA_BASELINE if area else PERSISTENCE,
        "trainable_size": AREA_NODE_FEATURES if area else 0,
        "multistep_input": AREA_INPUT_STATES if area else 1,
    }
    out = []
    for key, value in picks.items():
        if getattr(model, key) in (None, AUTO):
            setattr(model, key, value)
            out.append(Derived(f"model.{key}", value, where))
    if cfg.trainer.lr is None:
        cfg.trainer.lr = AREA_LR if area else GLOBAL_LR
        out.append(Derived("trainer.lr", cfg.trainer.lr, where))
    return out


def derive_batch_size(cfg: RunConfig, n_points: int, area: bool) -> list[Derived]:
    """``trainer.batch_size`` where null (see the module); ``area``: a limited area's data."""
    if cfg.trainer.batch_size is not None:
        return []
    most = AREA_POINTS_PER_STEP if area else GLOBAL_POINTS_PER_STEP
    batch = 1
    while 2 * batch * n_points <= most and batch < MAX_BATCH:
        batch *= 2
    cfg.trainer.batch_size = batch
    capped = f", at most {MAX_BATCH}" if batch == MAX_BATCH else f", at most {most:,}"
    why = f"{n_points:,} data points: {batch * n_points:,} a step{capped}"
    return [Derived("trainer.batch_size", batch, why)]


def derive_ranks(cfg: RunConfig, hidden_points: int) -> list[Derived]:
    """``trainer.nprocs`` and ``trainer.ranks_per_model`` where null (see the module)."""
    trainer, out = cfg.trainer, []
    if trainer.nprocs is None:
        if under_torchrun():
            trainer.nprocs, why = int(os.environ["WORLD_SIZE"]), "torchrun's world"
        elif trainer.device == "cuda":
            trainer.nprocs, why = max(1, torch.cuda.device_count()), "one rank a GPU"
        elif hidden_points <= ONE_RANK_HIDDEN:
            trainer.nprocs = 1
            why = f"{hidden_points:,} hidden points need no sharding: one rank, its threads the {usable_cores()} cores"
        else:
            trainer.nprocs, why = 2, f"{hidden_points:,} hidden points: sharded over 2 ranks"
        out.append(Derived("trainer.nprocs", trainer.nprocs, why))
    if trainer.ranks_per_model is None:
        trainer.ranks_per_model = trainer.nprocs
        out.append(Derived("trainer.ranks_per_model", trainer.nprocs, "every rank in one model"))
    return out


def derive_field_input(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """``model.field_input`` where null (see the module)."""
    if cfg.model.field_input is not None:
        return []
    m = cfg.model
    if m.baseline != LINEAR_REGRESSION:
        on, why = False, f"each step is learned over {m.baseline}"
    elif cfg.trainer.ranks_per_model != 1:
        on, why = False, f"{cfg.trainer.ranks_per_model} ranks a model: none holds every point"
    elif cfg.trainer.compile:
        on, why = False, "trainer.compile: the out-of-fold maps are chosen per sample"
    else:
        on, why = field_input_fits(cfg, dataset)
    m.field_input = on
    return [Derived("model.field_input", on, why)]


def field_input_fits(cfg: RunConfig, dataset: ZarrDataset) -> tuple[bool, str]:
    """Whether the field forecast's fit has its samples on ``dataset``'s grid, and why."""
    roles, points = dataset.roles, len(dataset.latitudes)
    inputs = len(roles.prognostic) * cfg.model.multistep_input + forcings_per_step(cfg, roles)
    outputs = len(roles.prognostic) + len(roles.diagnostic)
    training = one_step_training_samples(cfg, dataset)
    count = field_samples_that_fit(points, inputs, outputs, training)
    if count == 0:
        sizes = f"{training:,} training samples of {points:,} points x {inputs} inputs"
        return False, f"{sizes}: under {MIN_FIELD_SAMPLES:,} fit"
    return True, f"one rank holds every point: a kernel ridge map of all {points * inputs:,} inputs, on {count} samples"


def derive_calibration_period(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """``data.calibration_fraction`` where null (see the module), after ``model.field_input``."""
    if cfg.data.calibration_fraction is not None:
        return []
    cfg.data.calibration_fraction, why = 0.0, "the field input is off: calibrated on training dates"
    if cfg.model.field_input:
        cfg.data.calibration_fraction = CALIBRATION_FRACTION  # what the counts below are of
        left, days = one_step_training_samples(cfg, dataset), calibration_days(cfg, dataset)
        period = f"the {CALIBRATION_FRACTION:.0%} of the dates before validation holds {days:,.0f} days of them"
        held_out = left >= MIN_FIELD_SAMPLES and days >= CALIBRATION_DAYS
        if held_out:
            why = f"{period}, held out of training; {left:,} training samples left"
        elif left < MIN_FIELD_SAMPLES:
            why = f"{left:,} training samples would be left, under {MIN_FIELD_SAMPLES:,}: calibrated on training dates"
        else:
            why = f"{period}, under a year: calibrated on training dates"
        cfg.data.calibration_fraction = CALIBRATION_FRACTION if held_out else 0.0
    return [Derived("data.calibration_fraction", cfg.data.calibration_fraction, why)]


def calibration_days(cfg: RunConfig, dataset: ZarrDataset) -> float:
    """Days of dates the calibration period of ``cfg.data.calibration_fraction`` holds: its dates
    that are not missing, times the store's step."""
    first, stop = period_bounds(dataset.n_times, cfg.data.val_fraction, cfg.data.calibration_fraction)
    present = sum(1 for t in range(first, stop) if t not in dataset.missing)
    return present * dataset.frequency_s / 86400


def derive_from_store(cfg: RunConfig, dataset: ZarrDataset) -> list[Derived]:
    """Fill every derived key ``cfg`` leaves null (in place) from its store, ``dataset``
    (:func:`~training.data.open_store.open_store` of ``cfg.data``); what was derived."""
    needed = (
        cfg.model.hidden_grid == AUTO,
        cfg.model.hidden_stride is None,
        cfg.data.lead_time is None,
        cfg.data.val_fraction is None,
        cfg.evaluate.samples is None,
        cfg.trainer.nprocs is None,
        cfg.trainer.ranks_per_model is None,
        cfg.trainer.batch_size is None,
        cfg.model.baseline == AUTO,
        cfg.model.trainable_size is None,
        cfg.model.multistep_input is None,
        cfg.trainer.lr is None,
        cfg.model.field_input is None,
        cfg.data.calibration_fraction is None,
    )
    if not any(needed):
        return []
    derived = [
        *derive_hidden_grid(cfg, dataset),
        *derive_recipe(cfg, dataset.point_set),  # before the validation: the input states shape its samples
        *derive_lead_time(cfg, dataset),
        *derive_validation(cfg, dataset),
        *derive_batch_size(cfg, len(dataset.latitudes), area=not dataset.point_set.is_global),
    ]
    hidden_points = 0
    if cfg.trainer.nprocs is None:
        m, lat, lon = cfg.model, dataset.latitudes, dataset.longitudes
        hidden_points = hidden_grid(m.hidden_grid, m.hidden_stride, dataset.point_set, lat, lon).n_points
    ranks = derive_ranks(cfg, hidden_points)
    return derived + ranks + derive_field_input(cfg, dataset) + derive_calibration_period(cfg, dataset)


def describe(derived: list[Derived]) -> str:
    """The start-up log's line: each derived key, its value and why; how to override."""
    parts = [f"{d.key}={d.value} ({d.why})" for d in derived]
    return "derived from the store (set a key to override it): " + "; ".join(parts)
