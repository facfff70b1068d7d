"""``python -m training``: a Hydra app that trains the forecaster on local or torchrun ranks.

python -m training                                   # defaults: 2 local ranks, shard_sequence
python -m training strategy=shard_heads trainer.steps=100
python -m training strategy=none trainer.nprocs=1 trainer.ranks_per_model=1
torchrun --nproc-per-node 4 -m training trainer.ranks_per_model=2    # 2 replicas x 2 ranks
python -m training --multirun strategy=shard_heads,shard_sequence
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from training.config import check_config

log = logging.getLogger(__name__)


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """Check the configuration and the dataset (writing the built-in one if asked) before any
    rank starts; return the resolved configuration as plain data."""
    world = int(os.environ["WORLD_SIZE"]) if _under_torchrun() else cfg.trainer.nprocs
    check_config(cfg, world)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["run_dir"] = str(Path(resolved["run_dir"]).resolve())
    data = resolved["data"]
    if data["path"] is not None and not data.get("open_dataset"):
        data["path"] = str(Path(data["path"]).resolve())
    if data["path"] and not Path(data["path"]).exists() and data["generate"] and int(os.environ.get("RANK", "0")) == 0:
        from training.data import generate_rossby_haurwitz

        log.info("writing the built-in dataset to %s", data["path"])
        generate_rossby_haurwitz(data["path"], data["grid"] or "o32", data["generate_steps"], data["generate_seed"])
    from training.trainer import check_resumable, open_dataset

    dataset = open_dataset(resolved)  # fails here, clearly, on a missing or mismatched dataset
    if data["check_finite"]:
        dataset.check_finite()  # and here, naming variable, date and point, on a NaN or inf
    Path(resolved["run_dir"]).mkdir(parents=True, exist_ok=True)
    check_resumable(resolved)  # and here on a checkpoint of another model
    return resolved


def _rank_main(resolved: dict[str, Any]) -> dict[str, Any]:
    from training.trainer import train

    return train(resolved)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train with ``cfg``: on the torchrun ranks, or on ``trainer.nprocs`` spawned local ranks."""
    if _under_torchrun():
        return _run_torchrun(cfg)
    resolved = prepare(cfg)
    t = resolved["trainer"]
    if t["nprocs"] == 1:
        return _rank_main(resolved)
    from processor.runtime import run_local

    return run_local(
        _rank_main, t["nprocs"], resolved, timeout_s=t["timeout_s"], threads_per_rank=t["threads_per_rank"]
    )[0]


def _run_torchrun(cfg: DictConfig) -> dict[str, Any]:
    """Rank 0 prepares (checks, writes the dataset if needed) and hands every rank its
    resolved configuration, so all ranks share one run directory; its failure fails all."""
    import torch
    import torch.distributed as dist

    _init_torchrun_group("nccl" if torch.cuda.is_available() else "gloo", cfg.trainer.timeout_s)
    try:
        # Each rank composed its own configuration (its own command line and config files);
        # rank 0's is the one used, so any difference is an error, on every rank at once.
        from processor.distributed.consistency import agree_on_values
        from training.tracking import flatten

        agree_on_values(flatten(OmegaConf.to_container(cfg, resolve=False)), what="composed configurations")
        payload: list[Any] = [None]
        if dist.get_rank() == 0:
            try:
                payload = [("ok", prepare(cfg))]
            except Exception as exc:
                payload = [("error", exc)]
        dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            raise value
        return _rank_main(value)
    finally:
        dist.destroy_process_group()


def _init_torchrun_group(backend: str, timeout_s: float) -> None:
    """Join the default group of this torchrun attempt.

    torchrun's agent hosts the store and keeps it across ``--max-restarts`` attempts, so a
    restarted rank can read the previous attempt's addresses and fail to connect (pytorch
    issue #135712). Each attempt therefore gets its own key prefix. Multi-node jobs whose
    agents may count restarts differently should set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    for torchrun instead (rank 0 then hosts a fresh store per attempt).
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"gridshard/attempt_{attempt}/", agent_store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> float:
    result = run(cfg)
    history = result["history"]
    final = history[-1][1]["train/loss"] if history else float("nan")
    log.info("finished: train loss %.5f, MLflow run %s, run dir %s", final, result["run_id"], cfg.run_dir)
    return final
