"""The launcher every command shares: check the command line before Hydra, prepare the run
(configuration, dataset, run directory) once, start the ranks (spawned locally or under
torchrun) and report errors in one line. The commands (:mod:`training.app`,
:mod:`training.evaluate`, :mod:`training.predict`, :mod:`training.parity`) give it the function
each rank runs.

Run directory: Hydra's output directory (``hydra.run.dir``, ``outputs/<date>/<time>``). Under
torchrun only rank 0 creates one: the other ranks start Hydra with overrides that give them no
output directory, ``.hydra`` record or log file (:func:`follower_overrides`), and work in rank
0's run directory, as they take rank 0's resolved configuration. Under ``--multirun`` with
``logging.tracking_uri: null`` the members share one MLflow store,
``<hydra.sweep.dir>/mlflow.db``, so they appear side by side.

Errors (:mod:`training.launch.errors`): a configuration or data error (a misspelt key or
option, checked before Hydra makes a run directory (:mod:`training.launch.cli_check`); a value
out of range, a missing or mismatched dataset, a checkpoint of another model; also when a
spawned or torchrun rank raised it) prints ``error: <message>`` and a hint, exits with code 2
and leaves no run directory behind. ``HYDRA_FULL_ERROR=1`` (Hydra's own switch) shows its
traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from processor.distributed.consistency import agree_on_values
from processor.runtime import run_local
from processor.runtime.torchrun import (
    TorchrunSetupError,
    check_restartable,
    init_torchrun_group,
    torchrun_rank,
    under_torchrun,
)
from training.checkpoint.resume import check_resumable
from training.config.auto_attention import resolve_run_attention
from training.config.auto_matmul import resolve_run_matmul
from training.config.auto_strategy import resolve_auto
from training.config.checks import check_config
from training.config.schema import ConfigValueError, DataConfig, RunConfig, run_config
from training.config.settings import check_ranges, flatten, write_settings
from training.data.generate import check_built_in_path, generate_built_in
from training.data.open_store import open_store
from training.distributed.device import (
    backend_for,
    check_local_ranks,
    launch_world,
    rank_device,
    resolve_device,
    threads_per_rank,
)
from training.hooks import check_hooks
from training.launch.command import TRAIN, Command
from training.launch.errors import exit_on_bad_command_line, exit_on_user_error, follower_exit, user_error
from training.launch.interrupt import LauncherSignals, remove_stop_marker
from training.launch.run_end import RunFinished, check_not_finished
from training.launch.run_lock import RunDirLock
from training.launch.run_settings import SavedRun, continue_from, resume_line, saved_run
from training.launch.run_start import startup_line
from training.launch.store_settings import derive_from_store, describe
from training.reporting.mlflow_store import local_store_uri
from training.session import open_data
from training.skill.area import check_area

log = logging.getLogger(__name__)

RankMain = Callable[[RunConfig], Any]


def prepare(composed: DictConfig | RunConfig, command: Command = TRAIN, given: list[str] | None = None) -> RunConfig:
    """Check the configuration and the dataset (writing the built-in one if asked) before any
    rank starts; return the resolved configuration (:func:`training.config.schema.run_config` of
    Hydra's composition ``composed``, completed: device, absolute paths, the inferred grid).

    ``command``: what the command is (:class:`~training.launch.command.Command`; a training run
    by default). ``given``: the keys this command line set
    (:func:`training.launch.run_settings.given_keys`); a training run resuming in a run directory
    then takes every other setting from the run it continues (:mod:`training.launch.run_settings`).
    None: the configuration as it is (the API's callers)."""
    cfg = copy.deepcopy(run_config(composed))  # completed below: the caller's stays as it was
    cfg, saved = _continued(cfg, given) if command.continues_run else (cfg, None)
    check_ranges(cfg)  # before the store is read: a value out of range names its key
    cfg.trainer.device = resolve_device(cfg.trainer.device)  # the device it ran on, in the record
    cfg.run_dir = str(run_dir_path(cfg))
    if command.adopt is not None:
        command.adopt(cfg)
    share_sweep_store(cfg)
    data = cfg.data
    if data.path is not None and not data.open_dataset:
        data.path = str(Path(data.path).expanduser().resolve())
    write_built_in_if_asked(data)
    store = open_store(data)  # once: a store with NaN is scanned whole to read around them
    derived = derive_from_store(cfg, store)  # every key left null, from what the store says
    if derived:
        log.info(describe(derived))
    trainer = cfg.trainer  # after adopt, which may replace the section
    world = launch_world(trainer.nprocs)
    if cfg.strategy.name != "auto":  # auto is checked once it has picked (below)
        check_config(cfg, world)
    check_hooks(cfg, world)
    if command.check is not None:
        command.check(cfg)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if under_torchrun() else trainer.nprocs
    check_local_ranks(trainer.device, local_ranks, cfg.debug.share_gpu)
    trainer.threads_per_rank = threads_per_rank(trainer.threads_per_rank, local_ranks)
    dataset, hidden = open_data(cfg, store)  # fails here, clearly, on data or a hidden grid that does not suit it
    check_area(cfg.evaluate.area, dataset.latitudes, dataset.longitudes)
    resolve_run_matmul(cfg)  # auto: measured (or cached) here, before the cost model times the GEMM
    if cfg.strategy.name == "auto":
        cfg = resolve_auto(cfg, hidden.n_points)  # the cost model's pick, printed and kept for MLflow
        check_config(cfg, world)
    # auto: measured (or cached) here
    resolve_run_attention(cfg, hidden.n_points, training=command.trains)
    if data.check_finite:
        dataset.check_finite()  # and here, naming variable, date and point, on a NaN or inf
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    dataset.save_read_plan(cfg.run_dir)  # a store with NaN: the ranks read by it, not the whole store again
    if command.continues_run:
        check_resumable(cfg)  # and here on a checkpoint of another model
        if saved is not None:
            check_not_finished(saved, cfg)
            log.info(resume_line(Path(cfg.run_dir), saved, cfg))
        write_settings(cfg)  # what a later run in this directory continues from
        remove_stop_marker(cfg.run_dir)  # left by a launcher that was killed
    log.info(startup_line(cfg, dataset.n_points, hidden.n_points))
    return cfg


def run_dir_path(cfg: RunConfig | DictConfig) -> Path:
    """``cfg.run_dir`` as an absolute path, ``~`` the home directory (a YAML or quoted value:
    the shell expands an unquoted ``run_dir=~/...`` itself)."""
    return Path(str(cfg.run_dir)).expanduser().resolve()


def _continued(cfg: RunConfig, given: list[str] | None) -> tuple[RunConfig, SavedRun | None]:
    """A training run's configuration over the run it continues in its run directory, with that
    run (:mod:`training.launch.run_settings`); ``cfg`` and None for a new run, with
    ``trainer.resume=false``, or outside Hydra (``given`` None)."""
    saved = saved_run(run_dir_path(cfg)) if given is not None and cfg.trainer.resume else None
    return (cfg, None) if saved is None else (continue_from(cfg, saved, given), saved)


def write_built_in_if_asked(data: DataConfig) -> None:
    """Write the built-in dataset to ``data.path`` (rank 0) when it does not exist and
    ``data.generate`` asks for it; a path that looks like a typo is refused instead."""
    if data.path and not Path(data.path).exists() and data.generate and int(os.environ.get("RANK", "0")) == 0:
        check_built_in_path(data.path)  # a typo is not filled with the built-in data
        log.info("writing the built-in dataset to %s", data.path)
        generate_built_in(data.path, data.grid, data.generate_steps, data.generate_seed)


def share_sweep_store(resolved: RunConfig) -> None:
    """Under ``--multirun``, with no ``logging.tracking_uri``, log to the sqlite store in the sweep
    directory rather than one in each member's run directory."""
    if resolved.logging.tracking_uri is not None or not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = (Path(hydra_cfg.runtime.cwd) / hydra_cfg.sweep.dir).resolve()  # hydra.job.chdir aside
        sweep_dir.mkdir(parents=True, exist_ok=True)
        resolved.logging.tracking_uri = local_store_uri(sweep_dir)


def run(cfg: DictConfig | RunConfig, command: Command, rank_main: RankMain, given: list[str] | None = None) -> Any:
    """Run ``rank_main`` (``command``'s work on one rank) with ``cfg`` (Hydra's composition, made
    a :class:`RunConfig` once by :func:`prepare`) on the torchrun ranks, or on ``trainer.nprocs``
    spawned local ranks; return rank 0's result. ``command``, ``given``: see :func:`prepare`.

    A first Ctrl-C or SIGTERM reaches the local ranks as SIGTERM (they finish their step and
    checkpoint); a training result then carries the signal (``"signal"``)."""
    if under_torchrun():
        return _run_torchrun(cfg, command, rank_main, given)
    with RunDirLock(run_dir_path(cfg)):  # one run per run directory
        resolved = prepare(cfg, command, given)
        t = resolved.trainer
        if t.nprocs == 1:
            return rank_main(resolved)
        with LauncherSignals(resolved.run_dir) as signals:
            result = run_local(
                rank_main,
                t.nprocs,
                resolved,
                backend=backend_for(t.device, resolved.debug.share_gpu),
                timeout_s=t.timeout_s,
                threads_per_rank=t.threads_per_rank,
                on_start=signals.watch,
            )[0]
        if isinstance(result, dict) and signals.signum is not None:
            result["signal"] = signals.signum
        return result


def _run_torchrun(cfg: DictConfig, command: Command, rank_main: RankMain, given: list[str] | None) -> Any:
    """Rank 0 prepares (checks, writes the dataset if needed) and hands every rank its
    resolved configuration, so all ranks share one run directory; its failure fails all.
    ``cfg`` stays Hydra's composition here: what the ranks compare is what each composed, its
    interpolations unresolved (each rank's ``run_dir`` resolves to its own directory)."""
    try:
        check_restartable()
        device = resolve_device(cfg.trainer.device)
        check_local_ranks(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), cfg.debug.share_gpu)
    except (TorchrunSetupError, ConfigValueError):  # before the group exists: rank 0 reports it
        if torchrun_rank() != 0:
            follower_exit()
        raise
    rank_device(device)  # NCCL and its object collectives use the current CUDA device
    init_torchrun_group(backend_for(device, cfg.debug.share_gpu), cfg.trainer.timeout_s)
    lock = contextlib.ExitStack()
    try:
        # Each rank composed its own configuration (its own command line and config files);
        # rank 0's is the one used, so any difference is an error, on every rank at once.
        try:
            agree_on_values(flatten(OmegaConf.to_container(cfg, resolve=False)), what="composed configurations")
        except ValueError as exc:  # the same on every rank: rank 0 reports it
            if dist.get_rank() != 0:
                follower_exit()
            raise ConfigValueError(str(exc)) from None
        payload: list[Any] = [None]
        if dist.get_rank() == 0:
            try:  # rank 0 holds the run directory's lock until its ranks' work is done
                lock.enter_context(RunDirLock(run_dir_path(cfg)))
                payload = [("ok", prepare(cfg, command, given))]
            except Exception as exc:
                payload = [("error", exc)]
        dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            if dist.get_rank() != 0 and isinstance(value, RunFinished):
                sys.exit(0)  # rank 0 says so
            if dist.get_rank() != 0 and user_error(value) is not None:
                follower_exit()  # rank 0 reports it
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


def main(hydra_main: Callable[[], Any], check_command_line: bool = True) -> None:
    """A command's ``hydra_main``: Hydra composes the configuration from ``configs/`` and the
    command line, then the command calls :func:`run`; torchrun ranks other than 0 get
    :func:`follower_overrides` first. ``check_command_line``: check the overrides' keys and group
    options against the training schema before Hydra runs (the evaluation and prediction apps);
    false where the schema is another's (the benchmarks) or the caller checked them already
    (``python -m training``, before it imports the app)."""
    if check_command_line:  # before Hydra makes a run directory: a misspelt key or option is one line
        exit_on_bad_command_line(sys.argv[1:])
    scratch = None
    if torchrun_rank() != 0:
        # Not made here: Hydra makes it only for a --multirun sweep, so a follower that torchrun
        # stops with SIGTERM (its finally never runs) leaves nothing behind in a plain run.
        scratch = os.path.join(tempfile.gettempdir(), f"gridshard-hydra-{os.getpid()}-{secrets.token_hex(4)}")
        sys.argv += follower_overrides(scratch)
    try:
        hydra_main()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def run_reporting_errors(fn: Callable[[DictConfig], Any], cfg: DictConfig, interrupted: str | None = None) -> Any:
    """``fn(cfg)``; a configuration or data error it raises is printed as one line (see
    :func:`exit_on_user_error`), any other exception propagates. With ``interrupted`` (what a
    Ctrl-C leaves behind), a Ctrl-C prints ``error: interrupted: <interrupted>`` and exits 130."""
    try:
        return fn(cfg)
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"error: interrupted: {interrupted}", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        exit_on_user_error(exc, _run_dir_of(cfg))
        raise


def _run_dir_of(cfg: DictConfig) -> str | None:
    try:
        return str(run_dir_path(cfg))
    except Exception:  # an interpolation that cannot resolve here: nothing to tidy
        return None
