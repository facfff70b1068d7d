"""MLflow records of a sweep: a parent run per sweep, one child run per point.

The JSON-lines file is the record of truth; MLflow is a view of it. When the store cannot be
reached the sweep warns once and goes on (the rows are still written).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from training.reporting.mlflow_store import log_params, open_experiment

log = logging.getLogger(__name__)


class SweepTracker:
    """Creates runs in ``experiment`` at ``uri``; every call is a no-op after a failure."""

    def __init__(self, uri: str, experiment: str, artifact_root: Path) -> None:
        self.client = None
        self.experiment_id: str | None = None
        try:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=uri)
            local = uri.startswith("sqlite")
            self.experiment_id = open_experiment(self.client, experiment, artifact_root if local else None)
        except Exception as exc:  # an unreachable store must not stop the sweep
            self._fail(uri, exc)

    def _fail(self, what: str, exc: Exception) -> None:
        if self.client is not None:
            log.warning(
                "MLflow: %s failed (%s: %s); results stay in the JSON-lines file", what, type(exc).__name__, exc
            )
        self.client = None

    def start_run(self, name: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> str | None:
        if self.client is None:
            return None
        try:
            run = self.client.create_run(self.experiment_id, run_name=name, tags=tags or {})
            log_params(self.client, run.info.run_id, params)
            return run.info.run_id
        except Exception as exc:
            self._fail("starting a run", exc)
            return None

    def log_metrics(self, run_id: str | None, metrics: dict[str, float]) -> None:
        if self.client is None or run_id is None:
            return
        try:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            items = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
            self.client.log_batch(run_id, metrics=items)
        except Exception as exc:
            self._fail("logging metrics", exc)

    def log_artifacts(self, run_id: str | None, paths: list[Path]) -> None:
        if self.client is None or run_id is None:
            return
        try:
            for path in paths:
                self.client.log_artifact(run_id, str(path))
        except Exception as exc:
            self._fail("logging artifacts", exc)

    def finish(self, run_id: str | None, status: str = "FINISHED") -> None:
        if self.client is None or run_id is None:
            return
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception as exc:
            self._fail("ending a run", exc)
