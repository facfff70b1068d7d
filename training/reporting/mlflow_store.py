"""The MLflow store a run logs to: the local sqlite store in a run directory, the experiment
(marked as a model-training one for MLflow 3's UI), params in batches, and the run directory's
record of its MLflow run (``mlflow_run.json``) by which a resumed run continues it
(:mod:`training.reporting.tracking`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import tempfile
import time
from contextlib import closing, suppress
from importlib.metadata import version
from pathlib import Path
from typing import Any

from processor.host import cache_dir

log = logging.getLogger(__name__)

RECORD = "mlflow_run.json"  # the run directory's record of its MLflow run
# MLflow 3's experiment kind: this tag, "custom_model_development" (the UI's "model training"),
# not "genai_development". The UIs since MLflow 3.4 that have experiment kinds pick the experiment
# page's view by it (and ask the user, or guess, when it is missing); later ones (3.17 here)
# choose the view with the sidebar's GenAI / Model training switch (kept in the browser;
# ``?workflowType=machine_learning`` in a link) and show "Training runs" for such an experiment.
# Name and value are those of MLflow's UI (``mlflow/server/js``); MLflow has no Python constant.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def local_store_uri(directory: Path) -> str:
    """The embedded sqlite store kept in ``directory``."""
    return f"sqlite:///{(directory / 'mlflow.db').resolve()}"


def create_local_store(uri: str) -> None:
    """Create the sqlite store at ``uri``, if it is one that does not exist yet, whole or not at
    all. MLflow makes its tables in dozens of migration steps, each committed on its own: a rank
    0 killed among them leaves a half-made schema that every later run refuses (seen in the
    soak). So the store is made in a temporary file beside it, closed, and renamed into place;
    a temporary file left by a killed attempt is removed.

    The migrations take 1-1.5 s of one core, the same for every run of one MLflow version: the
    first run on a machine keeps a copy of the store it made (:func:`empty_store_path`), and each
    later one copies that and sets its default experiment's artifact location, as MLflow would
    have. A copy that cannot be read is made again."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    if path.exists():
        return
    for stale in path.parent.glob(f".{path.name}.partial-*"):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    artifact_root = (path.parent / "mlartifacts").resolve().as_uri()
    kept = empty_store_path()
    if not (kept.exists() and _copy_store(kept, tmp, artifact_root)):
        _migrate(tmp, artifact_root)
        _keep_empty_store(tmp, kept)
    os.replace(tmp, path)


def empty_store_path() -> Path:
    """Where this machine keeps an empty sqlite store of the installed MLflow version: in
    :func:`~processor.host.cache_dir`."""
    return cache_dir() / f"mlflow-{version('mlflow')}-empty.db"


def _migrate(path: Path, artifact_root: str) -> None:
    """An MLflow sqlite store made at ``path`` by MLflow's own migrations, its connections closed."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # deferred: mlflow (1.3 s)

    store = SqlAlchemyStore(f"sqlite:///{path}", artifact_root)
    store.engine.dispose()  # every connection closed: the file is complete, with no journal


def _copy_store(kept: Path, tmp: Path, artifact_root: str) -> bool:
    """``tmp`` a copy of the empty store ``kept`` whose default experiment (id 0) is as MLflow
    makes it for this store: its artifacts under ``artifact_root``, created now. False, with a
    warning naming ``kept``, where the copy cannot be made or read."""
    now = int(time.time() * 1000)
    try:
        shutil.copyfile(kept, tmp)
        with closing(sqlite3.connect(tmp)) as db, db:
            updated = db.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                "WHERE experiment_id = 0",
                (f"{artifact_root}/0", now, now),
            ).rowcount
        if updated != 1:
            raise sqlite3.DatabaseError("it holds no default experiment")
    except (OSError, sqlite3.Error) as exc:
        log.warning("the empty MLflow store %s cannot be used (%s): making this run's anew", kept, exc)
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True


def _keep_empty_store(made: Path, kept: Path) -> None:
    """Keep a copy of the store just ``made`` (empty, closed) at ``kept`` for the machine's later
    runs, atomically: a partial copy of its own name, renamed into place. Where the folder cannot
    be written, each run goes on making its own."""
    partial = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=kept.parent, prefix=f".{kept.name}.partial-")
        os.close(handle)
        partial = Path(name)
        shutil.copyfile(made, partial)
        os.replace(partial, kept)
    except OSError as exc:
        log.info("no empty MLflow store kept in %s (%s): each run makes its own", kept.parent, exc)
        if partial is not None:
            with suppress(OSError):
                partial.unlink(missing_ok=True)


def artifact_dir(uri: str, run_dir: Path) -> Path:
    """Where a new experiment keeps its artifacts: beside an sqlite store (so that runs sharing
    one store, as the members of a multirun do, do not write into one member's directory), else
    in ``run_dir``. Each run's artifacts are in a folder of its own (its run id) below."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts"
    return run_dir / "mlartifacts"


def open_experiment(client, name: str, artifact_dir: Path | None) -> str:
    """The id of experiment ``name``, created if missing, marked as a model-training experiment
    (:func:`mark_training_experiment`). A new experiment keeps its artifacts in ``artifact_dir``
    (sqlite stores would otherwise put them in ``./mlruns`` of the current directory); ``None``
    leaves the choice to a tracking server."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        mark_training_experiment(client, exp)
        return exp.experiment_id
    location = artifact_dir.resolve().as_uri() if artifact_dir is not None else None
    key, value = EXPERIMENT_KIND
    return client.create_experiment(name, artifact_location=location, tags={key: value})


def mark_training_experiment(client, experiment) -> None:
    """Tag ``experiment`` (an ``Experiment``) with :data:`EXPERIMENT_KIND` unless it has a kind
    already (one a person chose in the UI stays). A store that refuses (permissions) is warned
    about; the run goes on."""
    from mlflow.exceptions import MlflowException  # deferred: mlflow (1.3 s)

    key, value = EXPERIMENT_KIND
    if experiment.tags.get(key):
        return
    try:
        client.set_experiment_tag(experiment.experiment_id, key, value)
    except MlflowException as exc:
        log.warning("cannot tag MLflow experiment %s as %s=%s: %s", experiment.name, key, value, exc)


def log_params(client, run_id: str, params: dict[str, Any]) -> None:
    """Log ``params`` in batches of 100 (MLflow's limit), values cut to MLflow's 6000 characters."""
    from mlflow.entities import Param  # deferred: mlflow (1.3 s)

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def read_record(run_dir: Path) -> dict[str, str] | None:
    """The run directory's record of its MLflow run (``tracking_uri``, ``experiment_id``,
    ``run_id``), or None when there is none or it cannot be read."""
    path = run_dir / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s (%s): starting a new MLflow run", path, exc)
        return None
    return record if isinstance(record, dict) else None


def write_record(run_dir: Path, tracking_uri: str, experiment_id: str, run_id: str, params: dict[str, Any]) -> None:
    """Record the MLflow run of ``run_dir`` and the params of its latest segment (a resumed
    segment's changes are against these), written whole, then renamed into place."""
    record = {"tracking_uri": tracking_uri, "experiment_id": experiment_id, "run_id": run_id, "params": params}
    tmp = run_dir / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, run_dir / RECORD)


def continue_run(client, run, params: dict[str, Any], tags: dict[str, str], previous: dict[str, Any]) -> None:
    """Re-open ``run`` for another segment: status RUNNING, ``tags`` set, params new to the run
    logged; params whose value changed since the ``previous`` segment are immutable in MLflow,
    so they go into a ``resume.<step>.changed`` tag (``key: old -> new; ...``), and ``<step>``
    is added to the ``resumed_from_steps`` tag (the ``resumed_from_step`` tag of ``tags``)."""
    from mlflow.entities import RunTag  # deferred: mlflow (1.3 s)

    run_id = run.info.run_id
    old = {**run.data.params, **{k: str(v)[:6000] for k, v in previous.items()}}
    steps = [s for s in run.data.tags.get("resumed_from_steps", "").split(",") if s]
    step = str(tags.get("resumed_from_step") or f"segment{len(steps) + 2}")
    new = {k: v for k, v in params.items() if k not in run.data.params}
    changed = [f"{k}: {old[k]} -> {v}" for k, v in params.items() if k in old and old[k] != str(v)[:6000]]
    extra = {**tags, "resumed_from_steps": ",".join([*steps, step])}
    if changed:
        extra[f"resume.{step}.changed"] = "; ".join(changed)
        log.info("params changed since MLflow run %s began (tag resume.%s.changed): %s", run_id, step, changed)
    if "failure_reason" in run.data.tags:  # the last segment's failure; this one may well finish
        extra[f"resume.{step}.previous_failure"] = run.data.tags["failure_reason"]
        client.delete_tag(run_id, "failure_reason")
    client.update_run(run_id, status="RUNNING")
    log_params(client, run_id, new)
    items = [RunTag(k, str(v)[:5000]) for k, v in extra.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, tags=items[i : i + 100])
