"""On a GPU: the training app trains there as on the CPU (``pytest -m cuda``; skipped without a
GPU). One rank gives the CPU's loss curve; two ranks sharing the GPU through the host-staged
transport give the CPU's two-rank curve; bf16 trains; a checkpoint moves between the devices
bit for bit; prediction writes the CPU's forecast from device tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.conftest import small_config
from training import predict
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.checkpoint.resume import restore_training_state
from training.data import ZarrDataset
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.loop.step import build_optimiser
from training.session import open_session

pytestmark = pytest.mark.cuda

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "logging.mlflow=false")


def _losses(result) -> np.ndarray:
    return np.array([m["train/loss"] for _, m in result["history"]])


@pytest.fixture(scope="module")
def cpu_and_gpu(tmp_path_factory, small_dataset):
    root = tmp_path_factory.mktemp("cuda_training")
    runs = {
        device: run(small_config(root / device, small_dataset, *ONE_RANK, f"trainer.device={device}"))
        for device in ("cpu", "cuda")
    }
    return root, runs


def test_one_gpu_trains_the_cpu_loss_curve(cpu_and_gpu):
    _, runs = cpu_and_gpu
    np.testing.assert_allclose(_losses(runs["cuda"]), _losses(runs["cpu"]), rtol=1e-4)
    for _, metrics in runs["cuda"]["history"]:
        assert 0 < metrics["peak_device_memory_gib"] < 80 and metrics["samples_per_s"] > 0
    for device in ("cpu", "cuda"):
        assert runs[device]["skill"] is not None
    np.testing.assert_allclose(
        runs["cuda"]["skill"].rmse("model", "psi"), runs["cpu"]["skill"].rmse("model", "psi"), rtol=1e-3
    )


def test_two_ranks_sharing_the_gpu_train_the_cpu_two_rank_curve(tmp_path, small_dataset):
    def two_ranks(device: str, *extra: str):
        overrides = ("logging.mlflow=false", "evaluate.at_end_of_training=false", f"trainer.device={device}", *extra)
        return run(small_config(tmp_path / device, small_dataset, *overrides))

    cpu = two_ranks("cpu")
    shared = two_ranks("cuda", "debug.share_gpu=true")
    np.testing.assert_allclose(_losses(shared), _losses(cpu), rtol=1e-4)
    assert all(m["comm_bytes_per_rank"] > 0 for _, m in shared["history"])


def test_a_bf16_run_on_the_gpu_is_finite_and_falls(tmp_path, small_dataset):
    result = run(
        small_config(
            tmp_path, small_dataset, *ONE_RANK, "trainer.device=cuda", "trainer.precision=bf16", "trainer.steps=12"
        )
    )
    losses = _losses(result)
    assert np.isfinite(losses).all() and losses[-3:].mean() < 0.8 * losses[:3].mean()


def _restored(run_dir, dataset, checkpoint, device: str) -> tuple[int, dict[str, torch.Tensor]]:
    """A fresh session on ``device`` restored from ``checkpoint``: its step and parameters (CPU)."""
    resolved = prepare(small_config(run_dir, dataset, *ONE_RANK, f"trainer.device={device}"))
    session = open_session(resolved, ParallelDims.build(1))
    optimiser, schedule = build_optimiser(session.model, resolved.trainer)
    step, _ = restore_training_state(checkpoint, resolved, session.dims, session.model, optimiser, schedule)
    return step, {k: v.cpu() for k, v in session.model.state_dict().items()}


@pytest.mark.parametrize("written_on, resumed_on", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_moves_between_the_devices_bit_for_bit(tmp_path, small_dataset, written_on, resumed_on):
    first = tmp_path / "first"
    run(small_config(first, small_dataset, *ONE_RANK, f"trainer.device={written_on}", "trainer.stop_at_step=3"))
    checkpoint = first / "checkpoints" / "latest.pt"
    saved = load_checkpoint(checkpoint)
    assert all(v.device.type == "cpu" for v in saved["model"].values())
    assert ("cuda_rng" in saved) == (written_on == "cuda")
    step, weights = _restored(tmp_path / "probe", small_dataset, checkpoint, resumed_on)
    assert step == 3 and weights.keys() == saved["model"].keys()
    for name, value in saved["model"].items():
        assert torch.equal(weights[name], value), name
    resumed = run(small_config(first, small_dataset, *ONE_RANK, f"trainer.device={resumed_on}"))
    assert resumed["start_step"] == 3 and np.isfinite(_losses(resumed)).all()


def test_predict_on_the_gpu_writes_the_cpu_forecast(cpu_and_gpu, tmp_path, small_dataset):
    root, _ = cpu_and_gpu
    checkpoint = root / "cpu" / "checkpoints" / "latest.pt"
    init = str(ZarrDataset(small_dataset).dates[30])
    stores = {}
    for device in ("cpu", "cuda"):
        cfg = small_config(
            tmp_path / device,
            small_dataset,
            *ONE_RANK,
            f"trainer.device={device}",
            f"predict.checkpoint={checkpoint}",
            f"predict.initial_dates=[{init}]",
            "predict.steps=2",
        )
        (path,) = predict.run(cfg)
        stores[device] = ZarrDataset(path)
    cpu, gpu = stores["cpu"], stores["cuda"]
    for t in range(3):
        np.testing.assert_allclose(gpu.state(t, slice(None)), cpu.state(t, slice(None)), rtol=1e-4, atol=1e-5)
