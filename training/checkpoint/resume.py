"""Training state in and out of checkpoints, and what a checkpoint may continue under.

Checkpoints hold full tensors whatever the strategy (split parameters are gathered over the
model group), so a run continues under any strategy and any rank count; only what changes
the model is refused: its architecture, the grid and the variables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from torch import nn

from processor.distributed import Transport
from processor.distributed.parameter_split import (
    full_optimizer_state,
    full_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
)
from processor.distributed.transport import collective_device
from processor.errors import UserError
from training.checkpoint.files import LATEST, CheckpointError, load_training_checkpoint, save_checkpoint
from training.config.saved_names import current_names
from training.config.schema import RunConfig
from training.config.settings import to_settings
from training.distributed.device import device_free
from training.distributed.parallel import ParallelDims

if TYPE_CHECKING:
    from training.loop.weight_average import WeightAverage

log = logging.getLogger(__name__)

# Settings that do not change the parameters: a checkpoint continues under other values (noted).
# The attention path (and attention_path=auto's switch and record) picks a kernel, not weights:
# a run continues under another (a checkpoint from before these keys existed included).
RUNTIME_MODEL_KEYS = ("num_chunks", "attention_path", "attention_probe", "attention_auto")
_NOTED_DATA_KEYS = ("lead_time", "members")


def check_compatible(saved: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The differences between a checkpoint's configuration ``saved`` (as it was written: plain
    data) and this run's that it continues under (strategy, ranks, lead time, ...), as notes; a
    ``CheckpointError`` naming the key for one that changes the model (architecture, grid,
    variables)."""
    notes, saved = [], current_names(saved)  # under today's names, added keys at what the run ran
    saved_model, model = dict(saved.get("model") or {}), to_settings(cfg.model)
    # A key added since the checkpoint was written is not in it: the run continues with the value
    # the run ran with (config.saved_names.EARLIER_VALUES), and a model it does not fit fails to load.
    for key in sorted(set(saved_model)):
        if saved_model.get(key) != model.get(key):
            message = f"model.{key} = {saved_model.get(key)} in the checkpoint, {model.get(key)} in this run"
            if key not in RUNTIME_MODEL_KEYS:
                raise CheckpointError(f"checkpoint was written with {message}: it is another model")
            notes.append(message)
    saved_data = saved.get("data") or {}
    data = to_settings(cfg.data)
    for key in ("grid", "variables"):
        if saved_data.get(key) != data[key]:
            raise CheckpointError(
                f"checkpoint was written with data.{key} = {saved_data.get(key)}, this run has {data[key]}"
            )
    for key in _NOTED_DATA_KEYS:
        if saved_data.get(key) != data[key]:
            notes.append(f"data.{key} = {saved_data.get(key)} in the checkpoint, {data[key]} in this run")
    saved_strategy = (saved.get("strategy") or {}).get("name")
    if saved_strategy != cfg.strategy.name:
        notes.append(f"strategy = {saved_strategy} in the checkpoint, {cfg.strategy.name} in this run")
    saved_trainer, trainer = saved.get("trainer") or {}, to_settings(cfg.trainer)
    for key in ("nprocs", "ranks_per_model", "rollout", "loss"):
        if key in saved_trainer and saved_trainer[key] != trainer.get(key):
            notes.append(f"trainer.{key} = {saved_trainer[key]} in the checkpoint, {trainer.get(key)} in this run")
    return notes


def latest_checkpoint(cfg: RunConfig) -> Path:
    return Path(cfg.run_dir) / "checkpoints" / LATEST


def check_resumable(cfg: RunConfig) -> None:
    """If this run will resume, the checkpoint must be readable and of the same model."""
    latest = latest_checkpoint(cfg)
    if cfg.trainer.resume and latest.exists():
        check_compatible(load_training_checkpoint(latest)[1], cfg)


def restore_training_state(
    path: Path,
    cfg: RunConfig,
    dims: ParallelDims,
    model: nn.Module,
    optimiser,
    schedule,
    average: WeightAverage | None = None,
) -> tuple[int, dict[str, Any]]:
    """Load the checkpoint at ``path`` into the training state (this rank's share of split
    parameters); return its step and its run records (what :func:`save_training_state` was
    given as ``records``; empty in a checkpoint written without). ``average``: the run's moving
    average of the parameters, restored too (started afresh from a checkpoint without one). Rank 0
    logs what differs from the run that wrote it."""
    state, saved_cfg = load_training_checkpoint(path)
    notes = check_compatible(saved_cfg, cfg)
    if dims.rank == 0:
        for note in notes:
            log.warning("continuing step %d of %s with a change: %s", state["step"], path, note)
    try:
        load_full_state_dict(model, state["model"], dims.mp_rank)
        load_full_optimizer_state(optimiser, state["optimizer"], dims.mp_rank)
        schedule.load_state_dict(state["scheduler"])
        if average is not None:
            _restore_average(average, model, state, dims)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from exc
    if len(state["rng"]) == dims.world:  # the same ranks: every rank's random stream continues
        torch.set_rng_state(state["rng"][dims.rank])
        cuda_rng = state.get("cuda_rng")
        if cuda_rng is not None and len(cuda_rng) == dims.world and _device_of(model).type == "cuda":
            torch.cuda.set_rng_state(cuda_rng[dims.rank])  # the current device's, this rank's GPU
    return int(state["step"]), dict(state.get("records") or {})


def _restore_average(average: WeightAverage, model: nn.Module, state: dict[str, Any], dims: ParallelDims) -> None:
    """The checkpoint's average into ``average``, or the parameters just loaded where it has none."""
    if "average" not in state:
        average.restart()
        return
    with average.applied():  # the parameters are the average's tensors inside: load into them
        load_full_state_dict(model, state["average"], dims.mp_rank)
    average.updates = int(state["average_updates"])


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _every_rank(state: torch.Tensor, dims: ParallelDims) -> list[torch.Tensor]:
    """Every rank's ``state`` (a random generator's state), on the CPU, in rank order."""
    if dims.world == 1:
        return [state.clone()]
    device = collective_device(None)  # NCCL gathers CUDA tensors only
    parts = [torch.empty_like(state, device=device) for _ in range(dims.world)]
    torch.distributed.all_gather(parts, state.to(device))
    return [p.cpu() for p in parts]


class CheckpointWriteError(UserError, OSError):
    """A checkpoint could not be written (disk full, read-only, a size limit): every rank stops."""


def save_training_state(
    directory: Path,
    step: int,
    cfg: RunConfig,
    dims: ParallelDims,
    model: nn.Module,
    optimiser,
    schedule,
    on_write: Callable[[int], None] | None = None,
    transport: Transport | None = None,
    records: dict[str, Any] | None = None,
    name: str = LATEST,
    average: WeightAverage | None = None,
) -> None:
    """Write the training state after ``step`` to ``directory/name`` (every rank calls; rank 0
    writes, atomically). Every tensor is written from the CPU, so the checkpoint loads on any
    device. ``on_write``: a step hook's (:meth:`training.hooks.StepHook.checkpoint_write`), given
    the bytes rank 0 has written, and 0 on the other ranks while rank 0 writes. ``transport``:
    what gathers split parameters (the session's). ``records``: plain data of the run that a
    resumed run continues with (the best validation so far, the time trained). ``average``: the
    moving average of the parameters, written beside them (and read by evaluation first)."""
    rng = _every_rank(torch.get_rng_state(), dims)
    on_cuda = _device_of(model).type == "cuda"
    cuda_rng = _every_rank(torch.cuda.get_rng_state(), dims) if on_cuda else None
    # Full tensors, whatever the strategy: split parameters are gathered over the model group.
    model_state = device_free(full_state_dict(model, dims.mp_group, transport))
    optimiser_state = device_free(full_optimizer_state(optimiser, dims.mp_group, transport))
    averaged = {}
    if average is not None:
        with average.applied():
            averaged = {"average": device_free(full_state_dict(model, dims.mp_group, transport))}
        averaged["average_updates"] = average.updates
    failure = ""
    if dims.rank == 0:
        state = {
            "step": step,
            "model": model_state,
            "optimizer": optimiser_state,
            "scheduler": schedule.state_dict(),
            "rng": rng,
            "config": yaml.safe_dump(to_settings(cfg)),
            "records": records or {},
            **averaged,
            **({"cuda_rng": cuda_rng} if cuda_rng is not None else {}),
        }
        try:
            save_checkpoint(directory, state, progress=on_write, name=name)
        except OSError as exc:  # a full disk, a file-size limit, a read-only file system
            failure = exc.strerror or str(exc)
    elif on_write is not None:
        on_write(0)
    # Every rank learns whether the write worked, so that all stop here together, in one line.
    if dims.sum_over_world([float(bool(failure))])[0] > 0:
        raise CheckpointWriteError(
            f"could not write the checkpoint of step {step} to {directory}"
            f"{': ' + failure if failure else ' (rank 0 could not)'}; the previous checkpoint there is intact: "
            "free space or point run_dir elsewhere (copying the checkpoints), then run again to resume"
        )


def load_model_weights(path: str | Path, cfg: RunConfig, dims: ParallelDims, model: nn.Module) -> int:
    """Load a training checkpoint's parameters into ``model`` (evaluation, prediction): their
    moving average where the run kept one (``trainer.weight_average``); return its step. The
    checkpoint must be of this model (grid, variables, architecture)."""
    state, saved_cfg = load_training_checkpoint(path)
    check_compatible(saved_cfg, cfg)
    try:
        load_full_state_dict(model, state.get("average", state["model"]), dims.mp_rank)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from exc
    return int(state["step"])
