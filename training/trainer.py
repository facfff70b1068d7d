"""The training loop, run on every rank: data, model, optimiser, checkpoints, logging."""

from __future__ import annotations

import functools
import logging
import math
import subprocess
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm import tqdm

from processor import TransformerProcessor
from processor.distributed import CommCounter, Transport, agree_on_values
from processor.distributed.parameter_split import (
    full_optimizer_state,
    full_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
)
from processor.grids import get_grid
from processor.runtime import Heartbeat, peak_rss, set_freed_memory_policy
from training.checkpoint import (
    LATEST,
    CheckpointError,
    load_training_checkpoint,
    remove_partials,
    save_checkpoint,
)
from training.config import processor_config
from training.data import DatasetError, ZarrDataset
from training.data.grid_check import check_grid, infer_grid
from training.data.samples import Sample, Samples, build_samples, lead_steps, select_members
from training.faults import maybe_die
from training.model import Forecaster, ShardedGrids
from training.parallel import ParallelDims
from training.step import TrainStep, build_optimiser
from training.tracking import NullTracker, Tracker, flatten

log = logging.getLogger(__name__)


def open_dataset(cfg: dict[str, Any]) -> ZarrDataset:
    """Open the configured dataset (``data.open_dataset`` through anemoi-datasets, else the store at
    ``data.path``) and check it against the configuration: its grid by coordinates, the lead
    time against its frequency, the members, and that there are samples.

    ``data.grid: null`` is inferred from the store and written into ``cfg`` (the resolved
    configuration records the grid it trained on).
    """
    data = cfg["data"]
    if data.get("open_dataset"):
        from training.data.anemoi_source import AnemoiDataset

        dataset: ZarrDataset = AnemoiDataset(data["open_dataset"], data["variables"])
    elif data["path"] is None:
        raise DatasetError(
            "data.path is not set: give an anemoi-datasets store (data.path=/path/to/store.zarr) or data.open_dataset"
        )
    else:
        dataset = ZarrDataset(data["path"], data["variables"])
    if data["grid"] is None:
        data["grid"] = infer_grid(dataset.latitudes, dataset.longitudes, dataset.resolution, str(dataset.path))
    else:
        check_grid(dataset.latitudes, dataset.longitudes, data["grid"], str(dataset.path))
    if dataset.n_times < 8:
        raise DatasetError(f"{dataset.path} has {dataset.n_times} dates; training needs at least 8")
    dataset_samples(cfg, dataset)  # fails here on a bad data.lead_time or data.members
    return dataset


def dataset_samples(cfg: dict[str, Any], dataset: ZarrDataset) -> Samples:
    """The train and validation samples of ``dataset`` under ``data.lead_time`` and ``data.members``
    (see :mod:`training.data.samples`)."""
    data = cfg["data"]
    lead = lead_steps(data.get("lead_time"), dataset.frequency_s, str(dataset.path))
    members = select_members(dataset.n_members, data.get("members"))
    return build_samples(dataset.n_times, dataset.missing, members, lead, data["val_fraction"])


def build_model(cfg: dict[str, Any], num_variables: int) -> Forecaster:
    processor = TransformerProcessor(processor_config(cfg["model"], cfg["strategy"]["name"]))
    return Forecaster(num_variables, cfg["model"]["num_channels"], processor)


def sample_times(step: int, replica: int, replicas: int, batch: int, n: int, seed: int) -> list[int]:
    """Positions in the ``n`` training samples of this replica's batch at ``step`` (for a store of
    one member without missing dates and a one-step lead, the start times): epoch-wise shuffles,
    a function of the step alone, so a resumed run reads exactly what the uninterrupted one
    would have."""
    times = []
    for j in range(batch):
        epoch, pos = divmod((step * replicas + replica) * batch + j, n)
        times.append(int(np.random.default_rng([seed, epoch]).permutation(n)[pos]))
    return times


class Batches:
    """Pairs (state at t, state at t + lead) of one member, for this rank's block of data points:
    ``(batch, local points, variables)`` each."""

    def __init__(self, dataset: ZarrDataset, grids: ShardedGrids, lead: int) -> None:
        self.dataset = dataset
        self.lead = lead
        layout = grids.data_layout
        self.points = slice(layout.start, layout.stop)

    def __call__(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        x = np.stack([self.dataset.state(t, self.points, m) for t, m in samples])
        y = np.stack([self.dataset.state(t + self.lead, self.points, m) for t, m in samples])
        return torch.from_numpy(x), torch.from_numpy(y)


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _compatible(saved: dict[str, Any], cfg: dict[str, Any]) -> None:
    for key in ("model", "strategy"):
        if saved.get(key) != cfg[key]:
            raise CheckpointError(f"checkpoint was written with {key} = {saved.get(key)}, this run has {cfg[key]}")
    for key in ("grid", "variables", "lead_time", "members"):
        found = (saved.get("data") or {}).get(key)
        if found != cfg["data"][key]:
            raise CheckpointError(f"checkpoint was written with data.{key} = {found}, this run has {cfg['data'][key]}")


def check_resumable(cfg: dict[str, Any]) -> None:
    """If this run will resume, the checkpoint must be readable and of the same model."""
    latest = Path(cfg["run_dir"]) / "checkpoints" / LATEST
    if cfg["trainer"]["resume"] and latest.exists():
        _compatible(load_training_checkpoint(latest)[1], cfg)


def check_ranks_agree(cfg: dict[str, Any], dataset: ZarrDataset, dims: ParallelDims) -> None:
    """Every rank must run the same resolved configuration on the same dataset: one all_gather
    of a hash, and the same ``ValueError`` on every rank, naming ranks and keys, if not."""
    if dims.world == 1:
        return
    values: dict[str, object] = {
        **flatten(cfg),
        "dataset.shape": (dataset.n_times, dataset.n_points),
        "dataset.members": dataset.n_members,
        "dataset.variables": dataset.variables,
        "dataset.missing_dates": len(dataset.missing),
        "dataset.dates": f"{dataset.date(0)}..{dataset.date(dataset.n_times - 1)}",
    }
    agree_on_values(values, what="configuration or dataset")


def _restore(path: Path, cfg: dict[str, Any], dims: ParallelDims, model, optimiser, schedule) -> int:
    """Load the checkpoint at ``path`` into the training state; return its step."""
    state, saved_cfg = load_training_checkpoint(path)
    _compatible(saved_cfg, cfg)
    try:
        load_full_state_dict(model, state["model"], dims.mp_rank)
        load_full_optimizer_state(optimiser, state["optimizer"], dims.mp_rank)
        schedule.load_state_dict(state["scheduler"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from exc
    if len(state["rng"]) == dims.world:
        torch.set_rng_state(state["rng"][dims.rank])
    return int(state["step"])


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train on this rank; rank 0 logs and checkpoints. Returns the loss history and run id.

    On several ranks a heartbeat runs alongside: when a collective fails because another rank
    died, hung or raised, this rank raises :class:`~processor.runtime.PeerFailureError`
    naming it, within ``trainer.timeout_s`` (plus three heartbeats).
    """
    dims = ParallelDims.build(cfg["trainer"]["ranks_per_model"])
    heartbeat: AbstractContextManager = nullcontext()
    if dims.world > 1:
        t_cfg = cfg["trainer"]
        heartbeat = Heartbeat.from_env(dims.rank, dims.world, t_cfg["heartbeat_s"], t_cfg["timeout_s"])
    with heartbeat:
        return _train(cfg, dims)


def _train(cfg: dict[str, Any], dims: ParallelDims) -> dict[str, Any]:
    t_cfg, run_dir = cfg["trainer"], Path(cfg["run_dir"])
    torch.set_num_threads(t_cfg["threads_per_rank"])
    set_freed_memory_policy(t_cfg["retain_freed_memory"])
    dataset = open_dataset(cfg)
    check_ranks_agree(cfg, dataset, dims)
    hidden = get_grid(cfg["model"]["hidden_grid"])
    grids = ShardedGrids.build(
        dataset.latitudes,
        dataset.longitudes,
        hidden,
        dims.mp,
        dims.mp_rank,
        cfg["model"]["encoder_neighbours"],
        cfg["model"]["decoder_neighbours"],
    )
    torch.manual_seed(t_cfg["seed"])  # the same parameters on every rank
    model = build_model(cfg, len(dataset.variables))
    model.processor.split_parameters(dims.mp_group)  # shard_channels keeps this rank's share
    optimiser, schedule = build_optimiser(model, t_cfg)
    torch.manual_seed(t_cfg["seed"] + 1 + dims.rank)  # dropout streams differ per rank

    samples = dataset_samples(cfg, dataset)
    val_samples = samples.val[: t_cfg["val_batches"] * t_cfg["batch_size"]]
    batches = Batches(dataset, grids, samples.lead)
    n_per_replica = t_cfg["batch_size"] * dataset.n_points * len(dataset.variables)

    ckpt_dir = run_dir / "checkpoints"
    start = 0
    if t_cfg["resume"] and (ckpt_dir / LATEST).exists():
        start = _restore(ckpt_dir / LATEST, cfg, dims, model, optimiser, schedule)
    if dims.rank == 0:
        for partial in remove_partials(ckpt_dir):
            log.warning("removed %s, left by a checkpoint write that was interrupted", partial)

    tracker: Tracker | NullTracker = NullTracker()
    if dims.rank == 0 and cfg["logging"]["mlflow"]:
        tags = {
            "strategy": cfg["strategy"]["name"],
            "ranks": str(dims.world),
            "ranks_per_model": str(dims.mp),
            "grid": cfg["data"]["grid"],
            "hidden_grid": cfg["model"]["hidden_grid"],
            "git_commit": _git_commit(),
            "resumed_from_step": str(start),
        }
        tracker = Tracker(
            run_dir,
            cfg["logging"]["tracking_uri"],
            cfg["logging"]["experiment"],
            cfg["logging"]["run_name"],
            flatten(cfg),
            tags,
        )
        config_file = run_dir / "config.yaml"
        config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
        tracker.log_artifact(config_file)

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=t_cfg["precision"] == "bf16")
    train_step = TrainStep(dims.parallelize(model), optimiser, schedule, t_cfg["grad_clip"], autocast, n_per_replica)
    counter = CommCounter()
    transport = Transport(counter)

    def validate() -> float:
        model.eval()
        with torch.no_grad():
            losses = [train_step.loss(*batches([s]), grids, dims.mp_group, transport).item() for s in val_samples]
        model.train()
        total = sum(losses) / len(val_samples) * t_cfg["batch_size"]
        return dims.sum_over_world([total])[0] / dims.dp

    last_checkpoint = start

    def checkpoint(step: int) -> None:
        nonlocal last_checkpoint
        non_finite = sum(not bool(torch.isfinite(p).all()) for p in model.parameters())
        # Split parameters differ by rank: agree, so that every rank stops here together.
        if dims.sum_over_world([float(non_finite)])[0] > 0:
            raise FloatingPointError(
                f"parameters are not finite after step {step}; not overwriting the last good checkpoint "
                f"(step {last_checkpoint}) in {ckpt_dir}"
            )
        rng = [torch.get_rng_state()]
        if dims.world > 1:
            rng = [torch.empty_like(rng[0]) for _ in range(dims.world)]
            torch.distributed.all_gather(rng, torch.get_rng_state())
        # Full tensors, whatever the strategy: split parameters are gathered over the model group.
        model_state = full_state_dict(model, dims.mp_group)
        optimiser_state = full_optimizer_state(optimiser, dims.mp_group)
        if dims.rank == 0:
            save_checkpoint(
                ckpt_dir,
                {
                    "step": step,
                    "model": model_state,
                    "optimizer": optimiser_state,
                    "scheduler": schedule.state_dict(),
                    "rng": rng,
                    "config": yaml.safe_dump(cfg),
                },
            )
        last_checkpoint = step

    history: list[tuple[int, dict[str, float]]] = []
    last_val = float("nan")
    bar = tqdm(total=t_cfg["steps"], initial=start, desc="train", disable=dims.rank != 0, dynamic_ncols=True)
    model.train()
    try:
        for step in range(start, t_cfg["steps"]):
            picks = sample_times(step, dims.dp_rank, dims.dp, t_cfg["batch_size"], len(samples.train), t_cfg["seed"])
            t0 = time.perf_counter()
            lr = schedule.get_last_lr()[0]
            counter.reset()
            x, y = batches([samples.train[i] for i in picks])
            fault = functools.partial(maybe_die, t_cfg, dims.rank, step, run_dir)
            loss = train_step(x, y, grids, dims.mp_group, transport, after_backward=fault)
            elapsed = time.perf_counter() - t0
            train_loss, peak, sent = dims.sum_over_world([loss.item(), peak_rss() / 2**30, counter.total_bytes])
            train_loss /= dims.dp
            if not math.isfinite(train_loss):  # equal on every rank: all stop together
                tracker.log_metrics(step, {"train/nonfinite_loss": 1.0})
                raise FloatingPointError(
                    f"loss is {train_loss} at step {step}: stopping. The last good checkpoint "
                    f"(step {last_checkpoint}) is in {ckpt_dir}"
                )
            metrics = {
                "train/loss": train_loss,
                "lr": lr,
                "step_time_s": elapsed,
                "points_per_s": dims.dp * t_cfg["batch_size"] * dataset.n_points / elapsed,
                "peak_rss_gib_mean_rank": peak / dims.world,  # resident high-water mark so far
                "comm_bytes_per_rank": sent / dims.world,
            }
            if (step + 1) % t_cfg["val_interval"] == 0 or step + 1 == t_cfg["steps"]:
                metrics["val/loss"] = validate()
            history.append((step, metrics))
            if step % cfg["logging"]["log_interval"] == 0 or "val/loss" in metrics:
                tracker.log_metrics(step, metrics)
            last_val = metrics.get("val/loss", last_val)
            bar.set_postfix(loss=f"{train_loss:.4f}", val=f"{last_val:.4f}")
            bar.update()
            stopping = t_cfg["stop_at_step"] is not None and step + 1 >= t_cfg["stop_at_step"]
            if (step + 1) % t_cfg["checkpoint_interval"] == 0 or step + 1 == t_cfg["steps"] or stopping:
                checkpoint(step + 1)
            if stopping:
                break
        bar.close()

        if history and dims.dp_rank == 0:  # replica 0 forecasts one validation date, rank 0 plots it
            part = _forecast_part(model, batches, grids, val_samples, dims)
            parts = [part]
            if dims.mp > 1:
                parts = [None] * dims.mp
                torch.distributed.all_gather_object(parts, part, group=dims.mp_group)
            if dims.rank == 0:
                _final_artifacts(tracker, history, run_dir, dataset, np.concatenate(parts, axis=1))
    except BaseException as exc:
        bar.close()
        tracker.finish("FAILED", reason=f"{type(exc).__name__}: {exc}")
        raise
    tracker.finish()
    return {"history": history, "run_id": tracker.run_id, "start_step": start}


def _forecast_part(model, batches: Batches, grids, val_samples: list[Sample], dims) -> np.ndarray:
    """``(2, local points, variables)``: truth and one-step forecast on this rank's points."""
    x, y = batches(val_samples[:1])
    model.eval()
    with torch.no_grad():
        pred = model(x, grids, dims.mp_group)
    return np.stack([y[0].numpy(), pred[0].numpy()])


def _final_artifacts(tracker, history, run_dir: Path, dataset: ZarrDataset, forecast: np.ndarray) -> None:
    from training.plots import forecast_map, loss_curve

    tracker.log_artifact(loss_curve(history, run_dir / "loss_curve.png"))
    truth, pred = dataset.denormalise(forecast[0]), dataset.denormalise(forecast[1])
    v = dataset.variables.index("tracer") if "tracer" in dataset.variables else 0
    path = forecast_map(
        dataset.latitudes,
        dataset.longitudes,
        truth[:, v],
        pred[:, v],
        dataset.variables[v],
        run_dir / "forecast_map.png",
    )
    tracker.log_artifact(path)
