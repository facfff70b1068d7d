"""What the schema's ranges cannot say alone: values that several keys allow together, the
hidden grid's name, and whether the strategy can run on the ranks. Checked before any rank
starts (:func:`training.launch.launcher.prepare`)."""

from __future__ import annotations

import re

from processor import ConfigError
from training.config.schema import RunConfig, run_processor_config
from training.config.settings import ConfigValueError, check_ranges

DATA = "data"  # model.hidden_grid: the data's own points
AUTO = "auto"  # model.hidden_grid: derived from the store's extent


def check_hidden_grid(name: str, stride: int | None) -> None:
    """Raise ``ConfigValueError`` when ``model.hidden_grid`` / ``model.hidden_stride`` are not a
    hidden grid :mod:`training.model.hidden_grid` builds (before any data is read)."""
    if name == AUTO:
        return  # derived from the store (training/launch/store_settings.py) before the data is opened
    if name != DATA and not re.fullmatch(r"o\d+", name):
        raise ConfigValueError(
            f"model.hidden_grid = {name}: give a global octahedral grid o<N> (e.g. o16, o96), 'data' "
            "(the data's own points; with model.hidden_stride=k, one row and column in k of a box, "
            "one point in k^2 of an unstructured set) or 'auto' "
            "(derived from the store)"
        )
    if name != DATA and stride not in (None, 1):
        raise ConfigValueError(
            f"model.hidden_stride = {stride} coarsens the data's points: it needs model.hidden_grid=data, "
            f"not {name} (or leave it at 1)"
        )


def check_config(cfg: RunConfig, world_size: int | None = None) -> None:
    """Raise :class:`ConfigValueError` naming the first key whose value is out of its range
    (declared beside each field), or what several keys together do not allow."""
    check_ranges(cfg)
    rollout = cfg.trainer.rollout
    if rollout.start > rollout.max:
        raise ConfigValueError(
            f"trainer.rollout.start = {rollout.start} is above trainer.rollout.max = {rollout.max}: need start <= max"
        )
    if rollout.most == 1 and rollout.step_decay != 1:
        raise ConfigValueError(
            f"trainer.rollout.step_decay = {rollout.step_decay} weighs a rollout's steps, but the loss is over one "
            "step: raise trainer.rollout.max with trainer.rollout.increase_every (or start), or leave step_decay at 1"
        )
    check_hidden_grid(cfg.model.hidden_grid, cfg.model.hidden_stride)
    # Ranks left null are derived from the store (training/launch/store_settings.py) and checked then.
    world = cfg.trainer.nprocs if world_size is None else world_size
    per_model = cfg.trainer.ranks_per_model if cfg.trainer.ranks_per_model is not None else world
    if world is not None and per_model is not None and world % per_model:
        raise ConfigValueError(f"trainer.ranks_per_model = {per_model} does not divide the world size {world}")
    check_field_input(cfg, per_model)
    try:
        processor = run_processor_config(cfg)
        if per_model is not None:
            processor.check_world_size(per_model)
    except ConfigError as exc:
        raise ConfigValueError(
            f"strategy={cfg.strategy.name} with trainer.ranks_per_model = {per_model}: {exc.message}"
        ) from None
    except ValueError as exc:  # processor_config's, naming the key
        raise ConfigValueError(str(exc)) from None


def check_field_input(cfg: RunConfig, per_model: int | None) -> None:
    """``model.field_input=true`` reads every point on one rank, over the per-point regression."""
    if not cfg.model.field_input:
        return
    if cfg.model.baseline == "persistence":
        raise ConfigValueError(
            "model.field_input = true gives the network a forecast over the per-point regression: set "
            "model.baseline=linear_regression (or auto on a limited area), or model.field_input=false"
        )
    if per_model is not None and per_model > 1:
        raise ConfigValueError(
            f"model.field_input = true reads every point on one rank, but trainer.ranks_per_model = {per_model}: "
            "set trainer.ranks_per_model=1, or model.field_input=false"
        )
    if cfg.trainer.compile:
        raise ConfigValueError(
            "model.field_input = true picks each sample's out-of-fold map in Python, which torch.compile "
            "cannot trace: set trainer.compile=false, or model.field_input=false"
        )
