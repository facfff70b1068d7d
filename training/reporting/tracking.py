"""MLflow logging for rank 0: params, tags, per-step metrics, artifacts.

The training loop never waits for MLflow: :class:`Tracker` appends every metric to the run
directory's record (``metrics.jsonl``, :class:`~training.reporting.metrics_file.RunRecord`:
flushed, before returning) and hands it to a background thread that talks to the tracking
store, the steps of up to two seconds in one request. The default store is an embedded sqlite
database in the run directory. When a tracking server (``logging.tracking_uri``) cannot be reached, stops
answering, or answers too slowly, the thread warns once, starts the run again in the local
store and replays everything logged so far into it, so the local store holds every metric.

A run that resumes from a checkpoint continues its MLflow run: once a run is created, the run
directory records it in ``mlflow_run.json`` (tracking URI, experiment id, run id), and a
``Tracker(..., resume=True)`` on that directory and URI re-opens it (status back to RUNNING).
Params new to the run are logged; params are immutable in MLflow, so one whose value changed
(the strategy or the rank count, say) is recorded in a ``resume.<step>.changed`` tag instead,
and ``resumed_from_steps`` lists the steps each segment began at.

Every step appears once in the history of a run resumed any number of times, also after a
crash (:meth:`Tracker._catch_up`): a resumed segment first asks MLflow which step each metric
was last logged at, replays from ``metrics.jsonl`` the earlier steps that never reached it
(a killed rank 0's queue), and does not send again the steps it re-runs after its checkpoint
that did reach it (a resumed run computes them again bit for bit). ``metrics.jsonl`` is cut
back to the steps before the checkpoint when a segment resumes
(:func:`training.reporting.metrics_file.keep_steps_before`), so it too holds each step once;
:func:`~training.reporting.metrics_file.read_history` reads it back as one history.

An evaluation (skill by lead time, :meth:`Tracker.log_evaluation`) is one record tied to the
training step of the model it scored, never to the training steps' axis by lead hour: in MLflow
every score is a metric of its own with the lead in its name (``eval/rmse/psi/model/024h``)
logged at that step, so a metric's history is skill against training step and its latest value
is the latest model's; in the run directory it is one line of ``evaluations.jsonl`` (not of
``metrics.jsonl``). A resumed segment replays the evaluations of models up to its checkpoint
that MLflow lacks, deduplicated like the steps; an evaluation made now is always sent, so an
evaluation of the same step made again (other ``evaluate`` settings) is the latest value too.

The store, the experiment and the run directory's record of its run: :mod:`training.reporting.mlflow_store`.
With ``logging.mlflow = false`` rank 0 keeps the same record without MLflow (:class:`RecordOnly`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from training.reporting.metrics_file import RunRecord
from training.reporting.mlflow_store import (
    RECORD,
    artifact_dir,
    continue_run,
    create_local_store,
    local_store_uri,
    log_params,
    mark_training_experiment,
    open_experiment,
    read_record,
    write_record,
)

log = logging.getLogger(__name__)

_BATCH = 100  # metric events sent in one request at most
# The longest a metric waits for others to share its request. A request costs ~4 ms of CPU
# (sqlite, one step's dozen metrics) and the loop's threads lose that core: sent one step at a
# time, a 340-point store's 14 ms step took 19 ms; a batch costs ~0.08 ms a metric.
_FLUSH_S = 2.0


class Tracker:
    """Logs one run from a background thread; falls back to the local sqlite store on failure.

    Args:
        run_dir: where ``metrics.jsonl`` and the fall-back store live.
        tracking_uri: an MLflow tracking URI; ``None`` for the local store.
        finish_timeout_s: how long :meth:`finish` waits for the thread to deliver the rest.
        resume: continue the MLflow run recorded in ``run_dir`` (``mlflow_run.json``) if it is
            in the store at ``tracking_uri`` and still exists; else (warning) start a new one.
        start_step: the step a resumed segment starts at (its checkpoint's): ``metrics.jsonl``
            keeps the steps before it, and the MLflow run gets each step once (see the module).
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
        resume: bool = False,
        start_step: int | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.uri = tracking_uri or local_store_uri(run_dir)
        self.configured_uri, self.resume = self.uri, resume
        self.experiment, self.run_name = experiment, run_name
        self.params, self.tags = params, tags
        self.finish_timeout_s = finish_timeout_s
        self.fallback = False
        self.client, self.run_id = None, None
        # The run directory's record holds what earlier segments logged before this one's start;
        # the thread notes the last step of each metric MLflow already holds: nothing twice.
        self.record = RunRecord(run_dir, start_step)
        self._logged_through: dict[str, int] = {}
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
        self.record.log_metrics(step, metrics)
        self._queue.put(("metrics", (step, dict(metrics))))

    def log_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        """One evaluation of the model after training step ``step`` (its checkpoint's step):
        ``metrics`` named with their lead (``eval/rmse/psi/model/024h``), all logged at ``step``.
        Written to ``evaluations.jsonl`` (flushed) first; sent to MLflow even where it holds that
        step already, so that this evaluation is the latest value of each."""
        self.record.log_evaluation(step, metrics)
        self._queue.put(("evaluation", (step, dict(metrics))))

    def log_artifact(self, path: Path) -> None:
        self._queue.put(("artifact", str(path)))

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """End the run with ``status`` (and a ``failure_reason`` tag); wait a bounded time for
        the thread to deliver what is queued."""
        if self._finished:
            return
        self._finished = True
        self.record.close()
        self._queue.put(("finish", (status, reason)))
        self._thread.join(self.finish_timeout_s)
        if self._thread.is_alive():
            log.warning(
                "MLflow at %s did not take the run's last events within %g s; every metric is in %s",
                self.uri,
                self.finish_timeout_s,
                self.record.metrics_path,
            )

    # -- the background thread ------------------------------------------------------------

    def _work(self) -> None:
        self._guard(self._start)
        while True:
            events = self._next_events()
            self._delivered.extend(events)
            if self.client is not None:
                self._guard(self._apply, events)
            if events[-1][0] == "finish":
                return

    def _next_events(self) -> list[tuple[str, Any]]:
        """The next events to send: metrics and evaluations gathered for up to :data:`_FLUSH_S`
        after the first (at most :data:`_BATCH`), ended early by any other event (an artifact,
        the finish), which comes last."""
        events = [self._queue.get()]
        deadline = time.monotonic() + _FLUSH_S
        while events[-1][0] in ("metrics", "evaluation") and len(events) < _BATCH:
            try:
                events.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return events

    def _start(self) -> None:
        from mlflow.tracking import MlflowClient  # deferred: mlflow (1.3 s)

        create_local_store(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        record = read_record(self.run_dir) if self.resume else None
        run = self._recorded_run(record) if record is not None else None
        if run is not None:
            continue_run(self.client, run, self.params, self.tags, record.get("params") or {})
            mark_training_experiment(self.client, self.client.get_experiment(run.info.experiment_id))
        else:
            exp_id = open_experiment(self.client, self.experiment, artifact_dir(self.uri, self.run_dir))
            run = self.client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
            log_params(self.client, run.info.run_id, self.params)
        self.run_id = run.info.run_id
        if self.uri == self.configured_uri:  # a fall-back run is not the one the directory continues
            write_record(self.run_dir, self.uri, run.info.experiment_id, self.run_id, self.params)
        self._catch_up(run)

    def _catch_up(self, run) -> None:
        """Note the last step of each metric in ``run`` (a new run: none), and log the earlier
        segments' steps and evaluations that ``run`` lacks, from ``metrics.jsonl`` and
        ``evaluations.jsonl``."""
        self._logged_through = {}
        for key in run.data.metrics:
            steps = [m.step for m in self.client.get_metric_history(self.run_id, key)]
            self._logged_through[key] = max(steps, default=-1)
        if self.record.earlier:
            self._log_metrics([("metrics", event) for event in self.record.earlier])

    def _recorded_run(self, record: dict[str, Any]):
        """The MLflow run ``record`` names, if it is in this store and still active."""
        from mlflow.exceptions import MlflowException  # deferred: mlflow (1.3 s)

        if record.get("tracking_uri") != self.uri:
            if not self.fallback:
                log.warning(
                    "%s records MLflow run %s in %s, but this run logs to %s: starting a new MLflow run",
                    self.run_dir / RECORD,
                    record.get("run_id"),
                    record.get("tracking_uri"),
                    self.uri,
                )
            return None
        try:
            run = self.client.get_run(str(record.get("run_id")))
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise  # the store failed: the fall-back handles it
            run = None
        if run is None or run.info.lifecycle_stage != "active":
            log.warning(
                "MLflow run %s recorded in %s no longer exists in %s: starting a new MLflow run",
                record.get("run_id"),
                self.run_dir / RECORD,
                self.uri,
            )
            return None
        log.info("continuing MLflow run %s", run.info.run_id)
        return run

    def _log_metrics(self, events: list[tuple[str, Any]]) -> None:
        """Log the metrics of ``events`` but those of steps the run already holds (a re-run
        step, a replayed record), and every evaluation made by this segment."""
        from mlflow.entities import Metric  # deferred: mlflow (1.3 s)

        now = int(time.time() * 1000)
        metrics = [
            Metric(k, float(v), now, step)
            for kind, payload in events
            if kind in ("metrics", "evaluation")
            for step, m in [payload]
            for k, v in m.items()
            if kind == "evaluation" or step > self._logged_through.get(k, -1)
        ]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def _apply(self, events: list[tuple[str, Any]]) -> None:
        self._log_metrics(events)
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
                log.error("MLflow local store failed too (%s); metrics stay in %s", exc, self.record.metrics_path)
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
            log.error("MLflow local store failed too (%s); metrics stay in %s", exc, self.record.metrics_path)
            self.client = None


def _of(events: list[tuple[str, Any]], kind: str) -> list[tuple[str, Any]]:
    return [e for e in events if e[0] == kind]


class RecordOnly:
    """What rank 0 gets with ``logging.mlflow = false``: the run directory's record alone
    (:class:`~training.reporting.metrics_file.RunRecord`); artifacts stay where they were written."""

    run_id = None

    def __init__(self, run_dir: Path, start_step: int | None = None) -> None:
        self.record = RunRecord(run_dir, start_step)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.record.log_metrics(step, metrics)

    def log_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        self.record.log_evaluation(step, metrics)

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        self.record.close()


class NullTracker:
    """What ranks other than 0 get: logs nothing."""

    run_id = None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_evaluation(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None: ...
