"""MLflow logging for rank 0: params, tags, per-step metrics, artifacts.

The default store is an embedded sqlite database in the run directory. With a tracking
server (``logging.tracking_uri``) that cannot be reached, or that stops answering, the run
goes on: it warns once and writes everything, from the first metric on, to the local store
instead. Every metric is also appended to ``metrics.jsonl`` in the run directory.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _local_uri(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)
    return out


class Tracker:
    """Logs one run; falls back to the local sqlite store when the server fails."""

    def __init__(
        self,
        run_dir: Path,
        tracking_uri: str | None,
        experiment: str,
        run_name: str | None,
        params: dict[str, str],
        tags: dict[str, str],
    ) -> None:
        self.run_dir = run_dir
        self.uri = tracking_uri or _local_uri(run_dir)
        self.experiment, self.run_name = experiment, run_name
        self.params, self.tags = params, tags
        self.history: list[tuple[int, dict[str, float]]] = []
        self.fallback = False
        self._jsonl = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in finish()
        if tracking_uri and tracking_uri.startswith("http"):
            # Fail fast rather than retrying for minutes inside a training step.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        self.client, self.run_id = None, None
        self._guard(self._start)

    def _start(self) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            artifacts = (self.run_dir / "mlartifacts").resolve().as_uri()
            exp_id = self.client.create_experiment(self.experiment, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        run = self.client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
        self.run_id = run.info.run_id
        items = list(self.params.items())
        from mlflow.entities import Param

        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in items[i : i + 100]])
        for step, metrics in self.history:  # replay after a fall-back
            self._send(step, metrics)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            if self.fallback:
                log.error("MLflow local store failed too (%s); metrics stay in %s", exc, self._jsonl.name)
                self.client = None
                return
            self.fallback = True
            log.warning(
                "MLflow at %s is unreachable (%s); logging to the local store %s instead",
                self.uri,
                type(exc).__name__,
                _local_uri(self.run_dir),
            )
            self.uri = _local_uri(self.run_dir)
            try:
                self._start()
            except Exception as exc2:
                log.error("MLflow local store failed too (%s); metrics stay in %s", exc2, self._jsonl.name)
                self.client = None

    def _send(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.history.append((step, metrics))
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        if self.client is not None:
            self._guard(self._send, step, metrics)

    def log_artifact(self, path: Path) -> None:
        if self.client is not None:
            self._guard(lambda: self.client.log_artifact(self.run_id, str(path)))

    def finish(self, status: str = "FINISHED") -> None:
        self._jsonl.close()
        if self.client is not None:
            self._guard(lambda: self.client.set_terminated(self.run_id, status=status))


class NullTracker:
    """What ranks other than 0 get: logs nothing."""

    run_id = None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...
