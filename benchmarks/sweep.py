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
from omegaconf import DictConfig

from benchmarks.plots import sweep_plots
from benchmarks.results import load_rows, markdown_table, write_csv
from benchmarks.tracking import SweepTracker
from processor.runtime.torchrun import torchrun_rank
from training.tracking import local_store_uri

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"


def tracker_for(cfg: DictConfig) -> SweepTracker | None:
    if not cfg.logging.mlflow:
        return None
    root = Path(cfg.results_root)
    root.mkdir(parents=True, exist_ok=True)
    uri = cfg.logging.tracking_uri or local_store_uri(root)
    return SweepTracker(uri, cfg.logging.experiment, root / "mlartifacts")


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
        tracker = tracker_for(config)
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
        tracker = tracker_for(config)
        if tracker is not None:
            parent = parent_run_id(directory)
            tracker.log_artifacts(parent, files)
            tracker.finish(parent)
