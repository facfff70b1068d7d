"""How a training run ends, in one line each: finished, stopped early (``trainer.stop_at_step``),
interrupted (Ctrl-C, SIGTERM: exit 130 / 143), nothing to train, or already finished; and the
exact command that continues it.

A stop is not the end of a run: it writes its checkpoint, skips the final evaluation (unless
``evaluate.at_stop``) and names the command that continues it, which needs nothing but the run
directory (:mod:`training.launch.run_settings` takes every setting from the run itself).
"""

from __future__ import annotations

import logging
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from processor.runtime.torchrun import under_torchrun
from training.config.schema import RunConfig
from training.launch.interrupt import exit_code, signal_name
from training.launch.run_settings import SavedRun

log = logging.getLogger(__name__)


class RunFinished(Exception):  # noqa: N818 - not an error: the run has nothing left to do
    """Resuming a run that already trained every step: nothing is done (the message says where
    its results are); exit status 0."""


def check_not_finished(saved: SavedRun, resolved: RunConfig) -> None:
    """Raise :class:`RunFinished` when the checkpoint in the run directory is at ``trainer.steps``."""
    steps, run_dir = resolved.trainer.steps, Path(resolved.run_dir)
    if saved.step is None or saved.step < steps:
        return
    results = [p for p in ("skill.md", "loss_curve.png", "mlflow.db") if (run_dir / p).exists()]
    raise RunFinished(
        f"{run_dir} finished at step {saved.step} of {steps}: nothing to train. Its checkpoint: "
        f"{saved.source}"
        + (f"; its results: {', '.join(results)} there" if results else "")
        + f"; to train on, give a larger trainer.steps (e.g. trainer.steps={2 * steps})"
    )


def continue_command(run_dir: str | Path) -> str:
    """The command that continues the run in ``run_dir`` (its settings are the run's own)."""
    target = f"-m training hydra.run.dir={shlex.quote(str(run_dir))}"
    if under_torchrun():
        return f"the same torchrun command with {target}"
    python = Path(sys.executable)
    try:
        python = python.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"{python} {target}"


def report_end(result: dict[str, Any], run_dir: str) -> float:
    """Say how the run ended (rank 0), in one line; exit 130 / 143 after a signal. Returns the
    last training loss (nan when nothing was trained)."""
    history = result["history"]
    final = history[-1][1]["train/loss"] if history else float("nan")
    first_rank = not under_torchrun() or int(os.environ["RANK"]) == 0
    stopped, steps, end = result.get("stopped"), result.get("steps"), result.get("end_step")
    where = f"step {end} of {steps}"
    if stopped == "signal":
        signum = result.get("signal") or 15  # another rank was signalled: SIGTERM, a scheduler's
        if first_rank:
            log.info(
                "interrupted by %s: stopped after %s, checkpoint written; continue with: %s",
                signal_name(signum),
                where,
                continue_command(run_dir),
            )
        sys.exit(exit_code(signum))
    if not first_rank:
        return final
    if stopped == "stop_at_step":
        log.info("stopped at %s; continue with: %s", where, continue_command(run_dir))
    elif not history:
        log.info("nothing to train: %s", result.get("reason", "no step left"))
    else:
        mlflow = f"MLflow run {result['run_id']}" if result["run_id"] else "MLflow off"
        log.info("finished: train loss %.5f, %s, %s, run dir %s", final, step_summary(history), mlflow, run_dir)
    return final


def step_summary(history: list[tuple[int, dict[str, float]]]) -> str:
    """The speed of the run's steps: median samples/s and step time and, where a step was
    profiled (``logging.profile_after``), its share in the model's matmuls, attention and
    message passing."""
    step_s = statistics.median(metrics["step_time_s"] for _, metrics in history)
    samples_s = statistics.median(metrics["samples_per_s"] for _, metrics in history)
    said = f"{samples_s:.3g} samples/s (median step {step_s * 1e3:.1f} ms)"
    shares = [metrics["model_compute_share"] for _, metrics in history if "model_compute_share" in metrics]
    if shares:
        said += f", {shares[-1]:.0%} of a step in the model's matmuls, attention and message passing"
    return said
