"""The run directory's sqlite store: made once per machine by MLflow's migrations, then copied."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

from mlflow.tracking import MlflowClient

from training.reporting.mlflow_store import create_local_store, empty_store_path


def _tables(path: Path) -> tuple[set[str], list[tuple]]:
    """The store's schema (every table and index) and its alembic version."""
    with closing(sqlite3.connect(path)) as db:
        schema = {sql for (sql,) in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")}
        return schema, list(db.execute("SELECT * FROM alembic_version"))


def _a_working_store(store: Path) -> None:
    """``store`` opens, its default experiment keeps its artifacts beside it, and a run logs."""
    client = MlflowClient(f"sqlite:///{store}")
    assert client.get_experiment("0").artifact_location == (store.parent / "mlartifacts" / "0").as_uri()
    run = client.create_run(client.create_experiment("x", (store.parent / "art").as_uri())).info.run_id
    client.log_metric(run, "loss", 0.5, step=3)
    assert [(m.step, m.value) for m in client.get_metric_history(run, "loss")] == [(3, 0.5)]


def _new_store(root: Path, name: str) -> Path:
    store = root / name / "mlflow.db"
    store.parent.mkdir()
    create_local_store(f"sqlite:///{store}")
    return store


def test_a_store_is_the_machines_empty_one_with_its_own_default_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path / "cache"))
    stores = [_new_store(tmp_path, name) for name in ("a", "b")]
    kept = empty_store_path()
    assert kept.parent == tmp_path / "cache" and kept.exists()
    for store in stores:
        assert _tables(store) == _tables(kept)
        _a_working_store(store)
    assert list(tmp_path.glob("**/.*partial*")) == []


def test_where_the_cache_cannot_be_written_each_store_is_migrated_in_place(tmp_path, monkeypatch):
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(blocked))
    _a_working_store(_new_store(tmp_path, "run"))
    assert not empty_store_path().exists()
    assert list(tmp_path.glob("**/.*partial*")) == []


def test_a_damaged_empty_store_is_named_and_made_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path / "cache"))
    kept = empty_store_path()
    kept.parent.mkdir()
    kept.write_bytes(b"not a database" * 100)
    with caplog.at_level(logging.WARNING):
        store = _new_store(tmp_path, "run")
    assert f"the empty MLflow store {kept} cannot be used" in caplog.text
    _a_working_store(store)
    assert _tables(kept) == _tables(store)  # whole again for the next run
