"""MLflow that hangs or goes away mid-run: training never waits for it, warns once, loses nothing.

Real servers: a socket that accepts requests and never answers, and a real ``mlflow server``
subprocess that is SIGKILLed once it has taken the run's first metrics.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from processor.runtime import free_port
from tests.training.conftest import small_config
from training.app import run
from training.reporting import tracking

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

# One rank in this process; no end-of-run evaluation, whose metrics (by lead time) would add
# lines to metrics.jsonl beyond the training steps these tests count.
ONE_RANK = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "evaluate.at_end_of_training=false"]


class _LinesWhenGivenUp(logging.Handler):
    """Counts the lines of ``metrics.jsonl`` at the moment the tracker gives up on the server."""

    def __init__(self, jsonl: Path) -> None:
        super().__init__(logging.WARNING)
        self.jsonl, self.counts = jsonl, []

    def emit(self, record: logging.LogRecord) -> None:
        if "unreachable or too slow" in record.getMessage():
            self.counts.append(len(self.jsonl.read_text().splitlines()))


def _hung_server() -> tuple[socket.socket, int]:
    """A TCP server that accepts connections and reads requests, but never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def test_hung_server_never_blocks_a_step(tmp_path, small_dataset, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")  # each request hangs this long
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server, port = _hung_server()
    watcher = _LinesWhenGivenUp(tmp_path / "metrics.jsonl")
    logging.getLogger("training.reporting.tracking").addHandler(watcher)
    try:
        with caplog.at_level(logging.WARNING):
            result = run(
                small_config(tmp_path, small_dataset, *ONE_RANK, f"logging.tracking_uri=http://127.0.0.1:{port}")
            )
    finally:
        logging.getLogger("training.reporting.tracking").removeHandler(watcher)
        server.close()
    # All 6 steps were logged before the tracker's first request to the server gave up.
    assert watcher.counts == [6]
    assert len([r for r in caplog.records if "unreachable or too slow" in r.getMessage()]) == 1
    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [m.step for m in local.get_metric_history(result["run_id"], "train/loss")] == list(range(6))
    assert local.get_run(result["run_id"]).info.status == "FINISHED"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real MLflow tracking server on a local port, in its own process group."""
    port = free_port()
    store = tmp_path / "server"
    store.mkdir()
    command = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlflow.db'}",
        "--default-artifact-root",
        (store / "artifacts").as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    proc = subprocess.Popen(command, env=env, start_new_session=True, **quiet)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.2)
        yield proc, url, store / "mlflow.db"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _stop_when_it_has_metrics(proc: subprocess.Popen, url: str, stopped: threading.Event) -> None:
    client = MlflowClient(tracking_uri=url)
    while proc.poll() is None:
        try:
            exp = client.get_experiment_by_name("gridshard")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
                os.killpg(proc.pid, signal.SIGKILL)
                stopped.set()
                return
        except Exception:
            pass
        time.sleep(0.05)


def test_server_stopped_mid_run_loses_nothing(tmp_path, small_dataset, mlflow_server, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(tracking, "_FLUSH_S", 0.0)  # send what is queued at once: the server dies mid-run
    proc, url, server_db = mlflow_server
    stopped = threading.Event()
    threading.Thread(target=_stop_when_it_has_metrics, args=(proc, url, stopped), daemon=True).start()
    steps = 40
    cfg = small_config(
        tmp_path / "run",
        small_dataset,
        *ONE_RANK,
        f"trainer.steps={steps}",
        f"trainer.val_interval={steps}",
        f"trainer.checkpoint_interval={steps}",
        f"logging.tracking_uri={url}",
    )
    with caplog.at_level(logging.WARNING):
        result = run(cfg)
    assert stopped.is_set(), "the server was not stopped during the run"
    assert len(result["history"]) == steps
    assert len([r for r in caplog.records if "unreachable or too slow" in r.getMessage()]) == 1

    jsonl = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(jsonl) == steps
    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    local_losses = {m.step: m.value for m in local.get_metric_history(result["run_id"], "train/loss")}
    assert sorted(local_losses) == list(range(steps))  # every metric, replayed into the local store
    assert local.get_run(result["run_id"]).data.params["strategy.name"] == "none"

    server = MlflowClient(tracking_uri=f"sqlite:///{server_db}")  # what the server took before it died
    (server_run,) = server.search_runs([server.get_experiment_by_name("gridshard").experiment_id])
    synced = {m.step: m.value for m in server.get_metric_history(server_run.info.run_id, "train/loss")}
    assert 1 <= len(synced) < steps
    assert all(local_losses[s] == v for s, v in synced.items())


_CREATE = (
    "import sys; import mlflow.store.tracking.sqlalchemy_store; "
    "from training.reporting.mlflow_store import create_local_store; "
    "print('creating', flush=True); create_local_store(sys.argv[1]); print('made', flush=True)"
)


def test_a_store_creation_killed_midway_leaves_no_broken_store(tmp_path):
    """MLflow makes a new sqlite store in dozens of committed steps; rank 0 killed among them
    must not leave a half-made store (every later segment would fail to open it, as the soak
    once saw). Killed at several points of the creation: no store, or a whole one. Each in a
    machine of its own (a cache without the empty store), so that the migrations run."""
    killed_midway = 0
    for i, delay_s in enumerate((0.15, 0.4, 0.7)):
        directory = tmp_path / str(i)
        directory.mkdir()
        uri = f"sqlite:///{directory / 'mlflow.db'}"
        env = {**os.environ, "GRIDSHARD_CACHE_DIR": str(directory / "cache")}
        proc = subprocess.Popen([sys.executable, "-c", _CREATE, uri], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().strip() == "creating"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        finished = "made" in proc.communicate()[0]
        store = directory / "mlflow.db"
        killed_midway += not finished and list(directory.glob("**/.mlflow*.partial-*")) != []
        assert store.exists() == finished  # nothing at mlflow.db until it is whole
        for kept in (directory / "cache").glob("mlflow-*-empty.db"):  # the machine's copy: whole or absent
            with closing(sqlite3.connect(kept)) as db:
                assert len(list(db.execute("SELECT * FROM alembic_version"))) == 1
        client = MlflowClient(uri)  # makes it anew if the kill left none
        assert client.get_experiment_by_name("Default") is not None
    assert killed_midway >= 1  # at least one kill landed inside the creation
