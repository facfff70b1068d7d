"""MLflow logging for rank 0: params, tags, per-step metrics, artifacts.

The training loop never waits for MLflow: :class:`Tracker` appends every metric to
``metrics.jsonl`` in the run directory (flushed, before returning) and hands it to a background
thread that talks to the tracking store. The default store is an embedded sqlite database in
the run directory. When a tracking server (``logging.tracking_uri``) cannot be reached, stops
answering, or answers too slowly, the thread warns once, starts the run again in the local
store and replays everything logged so far into it, so the local store holds every metric.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_BATCH = 100  # metric events sent in one request at most


def local_store_uri(directory: Path) -> str:
    """The embedded sqlite store kept in ``directory``."""
    return f"sqlite:///{(directory / 'mlflow.db').resolve()}"


def open_experiment(client, name: str, artifact_dir: Path | None) -> str:
    """The id of experiment ``name``, created if missing. A new experiment keeps its artifacts in
    ``artifact_dir`` (sqlite stores would otherwise put them in ``./mlruns`` of the current
    directory); ``None`` leaves the choice to a tracking server."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = artifact_dir.resolve().as_uri() if artifact_dir is not None else None
    return client.create_experiment(name, artifact_location=location)


def log_params(client, run_id: str, params: dict[str, Any]) -> None:
    """Log ``params`` in batches of 100 (MLflow's limit), values cut to MLflow's 6000 characters."""
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


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
    """Logs one run from a background thread; falls back to the local sqlite store on failure.

    Args:
        run_dir: where ``metrics.jsonl`` and the fall-back store live.
        tracking_uri: an MLflow tracking URI; ``None`` for the local store.
        finish_timeout_s: how long :meth:`finish` waits for the thread to deliver the rest.
    """

    def __init__(
        self,
        run_dir: Path,
        tracking_uri: str | None,
        experiment: str,
        run_name: str | None,
        params: dict[str, str],
        tags: dict[str, str],
        finish_timeout_s: float = 60.0,
    ) -> None:
        self.run_dir = run_dir
        self.uri = tracking_uri or local_store_uri(run_dir)
        self.experiment, self.run_name = experiment, run_name
        self.params, self.tags = params, tags
        self.finish_timeout_s = finish_timeout_s
        self.fallback = False
        self.client, self.run_id = None, None
        self._jsonl = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in finish()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._delivered: list[tuple[str, Any]] = []  # every event taken so far, replayed on fall-back
        self._finished = False
        if self.uri.startswith("http"):
            # One try per request, and a bound on each: the fall-back is the retry.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        self._thread = threading.Thread(target=self._work, name="mlflow-tracker", daemon=True)
        self._thread.start()

    # -- called by the training loop: never blocks on MLflow ------------------------------

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        self._queue.put(("metrics", (step, dict(metrics))))

    def log_artifact(self, path: Path) -> None:
        self._queue.put(("artifact", str(path)))

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """End the run with ``status`` (and a ``failure_reason`` tag); wait a bounded time for
        the thread to deliver what is queued."""
        if self._finished:
            return
        self._finished = True
        self._jsonl.close()
        self._queue.put(("finish", (status, reason)))
        self._thread.join(self.finish_timeout_s)
        if self._thread.is_alive():
            log.warning(
                "MLflow at %s did not take the run's last events within %g s; every metric is in %s",
                self.uri,
                self.finish_timeout_s,
                self._jsonl.name,
            )

    # -- the background thread ------------------------------------------------------------

    def _work(self) -> None:
        self._guard(self._start)
        while True:
            events = [self._queue.get()]
            while events[-1][0] == "metrics" and len(events) < _BATCH:
                try:
                    events.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._delivered.extend(events)
            if self.client is not None:
                self._guard(self._apply, events)
            if events[-1][0] == "finish":
                return

    def _start(self) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        exp_id = open_experiment(self.client, self.experiment, self.run_dir / "mlartifacts")
        self.run_id = self.client.create_run(exp_id, run_name=self.run_name, tags=self.tags).info.run_id
        log_params(self.client, self.run_id, self.params)

    def _apply(self, events: list[tuple[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for _, (step, m) in _of(events, "metrics") for k, v in m.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for _, path in _of(events, "artifact"):
            self.client.log_artifact(self.run_id, path)
        for _, (status, reason) in _of(events, "finish"):
            if reason:
                self.client.set_tag(self.run_id, "failure_reason", reason[:5000])
            self.client.set_terminated(self.run_id, status=status)

    def _guard(self, fn, *args) -> None:
        """Run ``fn``; on the first failure switch to the local store and replay everything."""
        try:
            fn(*args)
            return
        except Exception as exc:
            if self.fallback:
                log.error("MLflow local store failed too (%s); metrics stay in %s", exc, self._jsonl.name)
                self.client = None
                return
            log.warning(
                "MLflow at %s is unreachable or too slow (%s); logging to the local store %s instead",
                self.uri,
                type(exc).__name__,
                local_store_uri(self.run_dir),
            )
        self.fallback = True
        self.uri = local_store_uri(self.run_dir)
        try:
            self._start()
            self._apply(self._delivered)
        except Exception as exc:
            log.error("MLflow local store failed too (%s); metrics stay in %s", exc, self._jsonl.name)
            self.client = None


def _of(events: list[tuple[str, Any]], kind: str) -> list[tuple[str, Any]]:
    return [e for e in events if e[0] == kind]


class NullTracker:
    """What ranks other than 0 get: logs nothing."""

    run_id = None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None: ...
