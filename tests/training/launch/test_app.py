"""End-to-end training runs: strategies agree, resume is exact, MLflow holds the run, bad input fails early."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from processor.host import cpu_name
from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import CheckpointError, load_checkpoint
from training.data import DatasetError


def _losses(result) -> np.ndarray:
    return np.array([m["train/loss"] for _, m in result["history"]])


@pytest.fixture
def sequence_run(trained_run):
    return trained_run  # shared with the evaluation tests (tests/training/conftest.py)


def test_loss_falls_and_every_strategy_gives_the_same_curve(sequence_run, tmp_path, small_dataset):
    _, seq = sequence_run
    losses_only = "evaluate.at_end_of_training=false"  # the trained run's skill table is tested elsewhere
    heads = run(small_config(tmp_path / "heads", small_dataset, "strategy=shard_heads", losses_only))
    channels = run(small_config(tmp_path / "channels", small_dataset, "strategy=shard_channels", losses_only))
    one_rank = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", losses_only)
    single = run(small_config(tmp_path / "none", small_dataset, *one_rank))
    assert len(_losses(seq)) == 6
    np.testing.assert_allclose(_losses(heads), _losses(single), rtol=1e-4)
    np.testing.assert_allclose(_losses(seq), _losses(single), rtol=1e-4)
    np.testing.assert_allclose(_losses(channels), _losses(single), rtol=1e-4)
    # shard_channels splits the parameters over the ranks; its checkpoint holds them whole.
    saved = load_checkpoint(tmp_path / "channels" / "checkpoints" / "latest.pt")
    reference = load_checkpoint(tmp_path / "none" / "checkpoints" / "latest.pt")
    assert saved["model"].keys() == reference["model"].keys()
    for name, value in reference["model"].items():
        # Key biases' gradients are round-off (a softmax ignores a constant shift): Adam scales that up.
        if not name.endswith(("k_norm.bias", "lin_key.bias")):
            torch.testing.assert_close(saved["model"][name], value, rtol=1e-3, atol=1e-5, msg=name)
    assert _losses(single)[-1] < 0.7 * _losses(single)[0]


def test_resume_after_interruption_is_exact(sequence_run, tmp_path, small_dataset):
    straight_dir, _ = sequence_run
    first = run(small_config(tmp_path, small_dataset, "trainer.stop_at_step=2", "trainer.checkpoint_interval=100"))
    assert len(first["history"]) == 2
    second = run(small_config(tmp_path, small_dataset, "evaluate.at_end_of_training=false"))  # checkpoints only
    assert second["start_step"] == 2 and len(second["history"]) == 4
    resumed = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    straight = load_checkpoint(straight_dir / "checkpoints" / "latest.pt")
    assert resumed["step"] == straight["step"] == 6
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name


def test_auto_measures_hands_every_rank_the_pick_and_records_it(tmp_path, small_dataset, monkeypatch):
    """With the probe on, the launcher times the paths once and the run's ranks, its saved
    settings and MLflow hold the concrete path (the figures under ``model.attention_auto``)."""
    monkeypatch.setenv("GRIDSHARD_ATTENTION_PROBE", "1")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path / "cache"))
    result = run(small_config(tmp_path / "run", small_dataset, "strategy=none", "trainer.nprocs=1",
                              "trainer.ranks_per_model=1", "trainer.steps=2"))  # fmt: skip
    assert (tmp_path / "cache" / "attention_paths.json").exists()
    mlrun = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}").get_run(result["run_id"])
    picked = mlrun.data.tags["attention_path"]
    assert picked in ("native", "banded", "sdpa_blocks")
    assert mlrun.data.params["model.attention_path"] == mlrun.data.params["model.attention_auto.choice"] == picked
    assert float(mlrun.data.params[f"model.attention_auto.seconds.{picked}"]) > 0
    assert f"attention_path: {picked}" in (tmp_path / "run" / "config.yaml").read_text()


def test_resume_with_another_model_is_refused(sequence_run, tmp_path, small_dataset):
    import shutil

    run_dir, _ = sequence_run
    shutil.copytree(run_dir / "checkpoints", tmp_path / "checkpoints")
    with pytest.raises(CheckpointError, match="checkpoint was written with model"):
        run(small_config(tmp_path, small_dataset, "model.num_layers=3", "trainer.steps=8"))


def test_mlflow_holds_params_metrics_and_artifacts(sequence_run):
    run_dir, result = sequence_run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    mlrun = client.get_run(result["run_id"])
    assert mlrun.data.params["model.num_layers"] == "2"
    assert mlrun.data.params["strategy.name"] == "shard_sequence"
    assert mlrun.data.tags["strategy"] == "shard_sequence" and mlrun.data.tags["ranks"] == "2"
    assert "git_commit" in mlrun.data.tags
    assert mlrun.data.tags["attention_path"] == "auto"  # the static rule: the suite turns the probe off
    assert mlrun.data.tags["host"] == cpu_name()
    losses = client.get_metric_history(result["run_id"], "train/loss")
    assert [m.step for m in losses] == list(range(6))
    assert len(client.get_metric_history(result["run_id"], "val/loss")) == 2
    for key in ("lr", "step_time_s", "samples_per_s", "points_per_s", "peak_rss_gib_mean_rank", "comm_bytes_per_rank"):
        assert client.get_metric_history(result["run_id"], key), key
    assert client.get_metric_history(result["run_id"], "comm_bytes_per_rank")[0].value > 0
    shares = client.get_metric_history(result["run_id"], "model_compute_share")  # logging.profile_after=4
    assert [m.step for m in shares] == [4] and 0 < shares[0].value < 1
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert {"config.yaml", "loss_curve.png", "forecast_map.png"} <= artifacts
    assert mlrun.info.status == "FINISHED"


@pytest.mark.slow
def test_unreachable_tracking_server_loses_nothing(tmp_path, small_dataset, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with caplog.at_level(logging.WARNING):
        result = run(
            small_config(
                tmp_path,
                small_dataset,
                "strategy=none",
                "trainer.nprocs=1",
                "trainer.ranks_per_model=1",
                f"logging.tracking_uri=http://127.0.0.1:{port}",
            )
        )
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(client.get_metric_history(result["run_id"], "train/loss")) == 6


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        (["data.path=/nonexistent/store.zarr"], DatasetError, "not found"),
        (["data.variables=[u,t2m]"], DatasetError, "t2m"),
        (["data.grid=o32"], DatasetError, "o32 has 5248 points"),
        (["trainer.nprocs=3", "trainer.ranks_per_model=2"], ValueError, "does not divide the world size 3"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, small_dataset, overrides, error, message):
    with pytest.raises(error, match=message):
        run(small_config(tmp_path, small_dataset, *overrides))
    assert not (tmp_path / "checkpoints").exists()


def test_a_store_and_run_directory_under_the_home_directory_may_be_given_with_a_tilde(
    tmp_path, small_dataset, monkeypatch
):
    """``data.path="~/..."`` (quoted for Hydra, which refuses a bare ``~``) is the user's home."""
    from training.launch.launcher import prepare

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "store.zarr").symlink_to(small_dataset)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a literal "~" folder made here would show
    home = ('data.path="~/store.zarr"', 'run_dir="~/run"')
    cfg = prepare(small_config(tmp_path, small_dataset, *home))
    assert cfg.data.path == str((tmp_path / "store.zarr").resolve()) and cfg.run_dir == str(tmp_path / "run")
    run(small_config(tmp_path, small_dataset, *home, "trainer.steps=2", "logging.mlflow=false"))  # locked, resumable
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists() and not (tmp_path / "cwd" / "~").exists()


@pytest.mark.slow
def test_data_parallel_times_model_parallel_equals_one_big_batch(tmp_path, small_dataset):
    """2 replicas x 2 model-parallel ranks, batch 1 each == one rank with batch 2: gradients are
    summed over the model-parallel group and averaged over replicas, nothing scaled by 2 twice."""
    grid = run(
        small_config(
            tmp_path / "dpmp",
            small_dataset,
            "trainer.nprocs=4",
            "trainer.ranks_per_model=2",
            "trainer.steps=4",
            "logging.mlflow=false",
        )
    )
    single = run(
        small_config(
            tmp_path / "one",
            small_dataset,
            "strategy=none",
            "trainer.nprocs=1",
            "trainer.ranks_per_model=1",
            "trainer.batch_size=2",
            "trainer.steps=4",
            "logging.mlflow=false",
        )
    )
    np.testing.assert_allclose(_losses(grid), _losses(single), rtol=1e-4)
