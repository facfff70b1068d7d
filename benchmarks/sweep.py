"""Hydra callback that turns a sweep's rows into its outputs.

At the start of a ``--multirun`` it opens the sweep's parent MLflow run (each point logs a
child run under it); at the end it writes ``results.csv``, ``results.md`` and the plots into
the sweep directory and attaches them to the parent run. (A single run writes its own.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from benchmarks.config import BenchLoggingConfig
from benchmarks.plots import sweep_plots
from benchmarks.results import load_rows, markdown_table, write_csv
from benchmarks.tracking import SweepTracker
from processor.runtime.torchrun import torchrun_rank
from training.reporting.mlflow_store import local_store_uri

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"


def tracker_for(logging_cfg: BenchLoggingConfig, results_root: str) -> SweepTracker | None:
    """The sweep's MLflow tracker for the ``logging`` section (None: MLflow off); its sqlite store,
    unless ``logging.tracking_uri`` names another, in ``results_root``."""
    if not logging_cfg.mlflow:
        return None
    root = Path(results_root)
    root.mkdir(parents=True, exist_ok=True)
    uri = logging_cfg.tracking_uri or local_store_uri(root)
    return SweepTracker(uri, logging_cfg.experiment, root / "mlartifacts")


def _tracker_of(config: DictConfig) -> SweepTracker | None:
    """:func:`tracker_for` of a sweep's composed configuration (the callbacks get it with its
    ``hydra`` section, so only the sections read are made typed)."""
    logging_cfg = OmegaConf.to_object(config.logging)
    assert isinstance(logging_cfg, BenchLoggingConfig)
    return tracker_for(logging_cfg, str(config.results_root))


def parent_run_id(directory: Path) -> str | None:
    path = directory / SWEEP_FILE
    return json.loads(path.read_text()).get("parent_run_id") if path.exists() else None


def write_outputs(directory: Path) -> list[Path]:
    """CSV, Markdown table and plots of the rows in ``directory``; returns the files."""
    rows = load_rows(directory)
    files = [write_csv(rows, directory / "results.csv")]
    (directory / "results.md").write_text(markdown_table(rows))
    files.append(directory / "results.md")
    files += sweep_plots(rows, directory / "plots")
    failed = [r for r in rows if r.get("status") == "error"]
    skipped = sum(r.get("status") == "skipped" for r in rows)
    print(f"{len(rows)} points ({skipped} skipped, {len(failed)} failed): results and plots in {directory}")
    for r in failed:
        print(f"  failed: {r['overrides']}: {r['error'].splitlines()[-1] if r['error'] else ''}")
    return files


class SweepOutputs(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if torchrun_rank() != 0:  # under torchrun, rank 0 writes the sweep's outputs
            return
        directory = Path(config.hydra.sweep.dir)
        directory.mkdir(parents=True, exist_ok=True)
        tracker = _tracker_of(config)
        parent = None
        if tracker is not None:
            overrides = " ".join(config.hydra.overrides.task)
            parent = tracker.start_run(
                f"sweep {directory.name}", {"overrides": overrides, "sweep_dir": str(directory.resolve())}
            )
        (directory / SWEEP_FILE).write_text(
            json.dumps({"parent_run_id": parent, "overrides": list(config.hydra.overrides.task)})
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        directory = Path(config.hydra.sweep.dir)
        # Under torchrun rank 0 writes; no rows: e.g. the scale probe, which writes its own.
        if torchrun_rank() != 0 or not (directory / "results.jsonl").exists():
            return
        files = write_outputs(directory)
        tracker = _tracker_of(config)
        if tracker is not None:
            parent = parent_run_id(directory)
            tracker.log_artifacts(parent, files)
            tracker.finish(parent)
