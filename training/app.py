"""``python -m training``: a Hydra app that trains the forecaster on local or torchrun ranks.

python -m training                                   # defaults: 2 local ranks, shard_sequence
python -m training strategy=shard_heads trainer.steps=100
python -m training strategy=none trainer.nprocs=1 trainer.ranks_per_model=1
torchrun --nproc-per-node 4 -m training trainer.ranks_per_model=2    # 2 replicas x 2 ranks
python -m training --multirun strategy=shard_heads,shard_sequence

Run directory: Hydra's output directory (``hydra.run.dir``, ``outputs/<date>/<time>``). Under
torchrun only rank 0 creates one: the other ranks start Hydra with overrides that give them no
output directory, ``.hydra`` record or log file (:func:`follower_overrides`), and train in rank
0's run directory, as they take rank 0's resolved configuration; only rank 0 logs the
``finished`` line. Under ``--multirun`` with ``logging.tracking_uri: null`` the members share
one MLflow store, ``<hydra.sweep.dir>/mlflow.db``, so they appear side by side (each member's
files stay in its own directory; the store's artifacts are beside it, a folder per run).

Errors: a configuration or data error (an unknown or out-of-range key, a missing or mismatched
dataset, a checkpoint of another model; also when a spawned or torchrun rank raised it) prints
``error: <message>`` and a hint, and exits with code 2. ``HYDRA_FULL_ERROR=1`` (Hydra's own
switch, which also unfolds Hydra's composition errors) shows its traceback instead. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from processor.runtime.torchrun import (
    TorchrunSetupError,
    check_restartable,
    init_torchrun_group,
    torchrun_rank,
    under_torchrun,
)
from training.auto_strategy import resolve_auto
from training.config import check_config
from training.device import backend_for, check_local_ranks, rank_device, resolve_device
from training.run_lock import RunDirBusyError, RunDirLock

log = logging.getLogger(__name__)

EXIT_USER_ERROR = 2  # the exit code of a configuration or data error
EXIT_PEER_FAILURE = 3  # another rank or node was lost, stuck or failed: running again may well work
DEBUG_HINT = "set HYDRA_FULL_ERROR=1 for the traceback"
# What a user fixes in the command line, the configs or the data; the rest are bugs. By name
# too, as a spawned rank's exception reaches the parent as text (see user_error).
_USER_ERRORS = (
    "ConfigValueError",
    "DatasetError",
    "CheckpointError",
    "ConfigError",
    "FileExistsError",
    "RunDirBusyError",
    "CheckpointWriteError",
    "TorchrunSetupError",
)


RankMain = Callable[[dict[str, Any]], Any]
Adopt = Callable[[dict[str, Any]], None]


def prepare(cfg: DictConfig, adopt: Adopt | None = None) -> dict[str, Any]:
    """Check the configuration and the dataset (writing the built-in one if asked) before any
    rank starts; return the resolved configuration as plain data.

    ``adopt`` (evaluation, prediction) rewrites the resolved configuration first, e.g. with a
    checkpoint's model; without it this is a training run, whose checkpoint is checked."""
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else cfg.trainer.nprocs
    cfg = resolve_auto(cfg)  # strategy=auto: the cost model's pick, printed and kept for MLflow
    check_config(cfg, world)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    t_cfg = resolved["trainer"]
    t_cfg["device"] = resolve_device(t_cfg["device"])  # the device it ran on, in the record
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if under_torchrun() else t_cfg["nprocs"]
    check_local_ranks(t_cfg["device"], local_ranks, t_cfg["debug_share_gpu"])
    resolved["run_dir"] = str(Path(resolved["run_dir"]).resolve())
    if adopt is not None:
        adopt(resolved)
    share_sweep_store(resolved)
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
    if adopt is None:
        check_resumable(resolved)  # and here on a checkpoint of another model
    return resolved


def share_sweep_store(resolved: dict[str, Any]) -> None:
    """Under ``--multirun``, with no ``logging.tracking_uri``, log to the sqlite store in the sweep
    directory rather than one in each member's run directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from training.tracking import local_store_uri

    if resolved["logging"]["tracking_uri"] is not None or not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = (Path(hydra_cfg.runtime.cwd) / hydra_cfg.sweep.dir).resolve()  # hydra.job.chdir aside
        sweep_dir.mkdir(parents=True, exist_ok=True)
        resolved["logging"]["tracking_uri"] = local_store_uri(sweep_dir)


def _rank_main(resolved: dict[str, Any]) -> dict[str, Any]:
    from training.trainer import train

    return train(resolved)


def run(cfg: DictConfig, rank_main: RankMain = _rank_main, adopt: Adopt | None = None) -> Any:
    """Run ``rank_main`` (default: training) with ``cfg`` on the torchrun ranks, or on
    ``trainer.nprocs`` spawned local ranks; return rank 0's result."""
    if under_torchrun():
        return _run_torchrun(cfg, rank_main, adopt)
    with RunDirLock(Path(cfg.run_dir).resolve()):  # one run per run directory
        resolved = prepare(cfg, adopt)
        t = resolved["trainer"]
        if t["nprocs"] == 1:
            return rank_main(resolved)
        from processor.runtime import run_local

        return run_local(
            rank_main,
            t["nprocs"],
            resolved,
            backend=backend_for(t["device"], t["debug_share_gpu"]),
            timeout_s=t["timeout_s"],
            threads_per_rank=t["threads_per_rank"],
        )[0]


def _run_torchrun(cfg: DictConfig, rank_main: RankMain, adopt: Adopt | None) -> Any:
    """Rank 0 prepares (checks, writes the dataset if needed) and hands every rank its
    resolved configuration, so all ranks share one run directory; its failure fails all."""
    import torch.distributed as dist

    from training.config import ConfigValueError

    try:
        check_restartable()
        device = resolve_device(cfg.trainer.device)
        check_local_ranks(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), cfg.trainer.debug_share_gpu)
    except (TorchrunSetupError, ConfigValueError):  # before the group exists: rank 0 reports it
        if torchrun_rank() != 0:
            sys.exit(EXIT_USER_ERROR)
        raise
    rank_device(device)  # NCCL and its object collectives use the current CUDA device
    init_torchrun_group(backend_for(device, cfg.trainer.debug_share_gpu), cfg.trainer.timeout_s)
    lock = contextlib.ExitStack()
    try:
        # Each rank composed its own configuration (its own command line and config files);
        # rank 0's is the one used, so any difference is an error, on every rank at once.
        from processor.distributed.consistency import agree_on_values
        from training.tracking import flatten

        try:
            agree_on_values(flatten(OmegaConf.to_container(cfg, resolve=False)), what="composed configurations")
        except ValueError as exc:  # the same on every rank: rank 0 reports it
            if dist.get_rank() != 0:
                sys.exit(EXIT_USER_ERROR)
            raise ConfigValueError(str(exc)) from None
        payload: list[Any] = [None]
        if dist.get_rank() == 0:
            try:  # rank 0 holds the run directory's lock until its ranks' work is done
                lock.enter_context(RunDirLock(Path(cfg.run_dir).resolve()))
                payload = [("ok", prepare(cfg, adopt))]
            except Exception as exc:
                payload = [("error", exc)]
        dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            if dist.get_rank() != 0 and user_error(value) is not None:
                sys.exit(EXIT_USER_ERROR)  # rank 0 reports it
            raise value
        return rank_main(value)
    finally:
        dist.destroy_process_group()
        lock.close()


def follower_overrides(scratch: str) -> list[str]:
    """Hydra overrides for torchrun ranks other than 0: the current directory as output directory
    (nothing is created), no ``.hydra`` record, logs to stdout only, and a ``--multirun`` sweep
    record in ``scratch`` (removed after). Rank 0's Hydra decides the run directory."""
    return [
        "hydra.run.dir=.",
        f"hydra.sweep.dir={scratch}",
        "hydra.sweep.subdir=.",
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",
    ]


def main(hydra_main: Callable[[], Any] | None = None) -> None:
    """``python -m training`` (or another app's ``hydra_main``): Hydra composes the configuration
    from ``configs/`` and the command line, then :func:`run`; torchrun ranks other than 0 get
    :func:`follower_overrides` first."""
    scratch = None
    if torchrun_rank() != 0:
        scratch = tempfile.mkdtemp(prefix="gridshard-hydra-")
        sys.argv += follower_overrides(scratch)
    try:
        (hydra_main or _hydra_main)()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    result = run_reporting_errors(run, cfg)
    history = result["history"]
    final = history[-1][1]["train/loss"] if history else float("nan")
    if torchrun_rank() == 0:
        log_skill(result.get("skill"), cfg.run_dir)
        log.info("finished: train loss %.5f, MLflow run %s, run dir %s", final, result["run_id"], cfg.run_dir)
    return final


def log_skill(skill: Any, run_dir: str) -> None:
    """Log the skill summary of rank 0's result (the ranks may be spawned processes, whose logs
    do not reach the console), and where the full tables and the plot are."""
    if skill is None or torchrun_rank() != 0:
        return
    from training.evaluation import skill_summary

    log.info(
        "RMSE by lead time (area-weighted, physical units), model / persistence:\n%s\n"
        "full tables (climatology, ACC): %s/skill.md; plot: %s/rmse_by_lead.png",
        skill_summary(skill),
        run_dir,
        run_dir,
    )


def run_reporting_errors(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """``fn(cfg)``; a configuration or data error it raises is printed as one line (see
    :func:`exit_on_user_error`), any other exception propagates."""
    try:
        return fn(cfg)
    except Exception as exc:
        exit_on_user_error(exc)
        raise


def exit_on_user_error(exc: BaseException) -> None:
    """For a configuration or data error (:func:`user_error`): print ``error: <message>`` and the
    hint, and exit with :data:`EXIT_USER_ERROR`; for a failure of another rank or node
    (:func:`peer_failure`) the same with :data:`EXIT_PEER_FAILURE`. Returns (the caller
    re-raises) for a bug, or when ``HYDRA_FULL_ERROR=1`` asks for the traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    message, code = user_error(exc), EXIT_USER_ERROR
    if message is None:
        message, code = peer_failure(exc), EXIT_PEER_FAILURE
    if message is None:
        return
    where = f"rank {torchrun_rank()}: " if torchrun_rank() != 0 else ""
    print(f"error: {where}{message}", file=sys.stderr)
    print(f"({DEBUG_HINT})", file=sys.stderr)
    sys.exit(code)


# What a rank's line in run_local's report says when the rank is not to blame for the failure.
_NOT_TO_BLAME = re.compile(r"^  rank \d+: (finished|died without a result|did not report|(?:\w+\.)*PeerFailureError: )")


def peer_failure(exc: BaseException) -> str | None:
    """The message of a failure of another rank or node (lost, stuck, or stopped by an error of
    its own), else None. For :func:`~processor.runtime.run_local`'s report: its rank lines, when
    every rank either died or blamed another (no traceback: nothing here is a bug)."""
    from processor.runtime import PeerFailureError

    if isinstance(exc, PeerFailureError):
        return str(exc)
    if not isinstance(exc, RuntimeError) or not _REPORT.match(str(exc)):
        return None
    lines = [line for line in str(exc).splitlines() if line.startswith("  rank ")]
    if not all(_NOT_TO_BLAME.match(line) for line in lines):
        return None
    return str(exc).splitlines()[0] + "\n" + "\n".join(lines)


_REPORT = re.compile(r"\d+ of \d+ ranks failed:\n")
_RANK_LINE = re.compile(r"^  rank \d+: (?:\w+\.)*(\w+): (.*)$", re.MULTILINE)
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*(\w+): (.*)$")


def user_error(exc: BaseException) -> str | None:
    """The message of a configuration or data error, else None (a bug).

    :func:`processor.runtime.run_local` reports what its spawned ranks raised as the text of a
    ``RuntimeError`` (a line per rank, ``<module>.<Type>: <message>``, then the first rank's
    traceback); the type and message are read back from it, so an error on a rank is reported
    as if the parent had raised it.
    """
    from processor import ConfigError
    from training.checkpoint import CheckpointError
    from training.config import ConfigValueError
    from training.data import DatasetError
    from training.resume import CheckpointWriteError

    kinds = (
        ConfigValueError,
        DatasetError,
        CheckpointError,
        ConfigError,
        FileExistsError,
        RunDirBusyError,
        TorchrunSetupError,
    )
    if isinstance(exc, (*kinds, CheckpointWriteError)):
        return str(exc)
    if not isinstance(exc, RuntimeError) or not _REPORT.match(str(exc)):
        return None
    report = str(exc)
    for name, message in _RANK_LINE.findall(report):
        if name in _USER_ERRORS:
            return message
    # A message of several lines: the rank lines hold its last; the traceback ends with the rest.
    headers = [m for line in report.splitlines() if (m := _EXCEPTION_LINE.match(line))]
    if headers and headers[-1][1] in _USER_ERRORS:
        return headers[-1][2]
    return None
