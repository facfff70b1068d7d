"""``trainer.device`` on the CPU: ``auto`` and an explicit ``cpu`` give today's numbers, the
device is recorded, checkpoints hold no device, and the device errors are one line, early
(the CUDA side is in ``test_cuda_training.py``)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.processes import run_in_own_session
from tests.training.conftest import small_config, small_overrides
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.config.schema import ConfigValueError
from training.distributed.device import (
    autocast,
    backend_for,
    check_local_ranks,
    device_free,
    resolve_device,
    threads_per_rank,
    to_device,
)
from training.launch.errors import DEBUG_HINT, EXIT_USER_ERROR

ONE_RANK = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "logging.mlflow=false"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without a GPU")


def _losses(result) -> list[float]:
    return [m["train/loss"] for _, m in result["history"]]


def _tensors(value, found=None) -> list[torch.Tensor]:
    """Every tensor in a checkpoint's nested dicts and lists."""
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, found)
    return found


@pytest.fixture(scope="module")
def auto_and_cpu_runs(tmp_path_factory, small_dataset):
    root = tmp_path_factory.mktemp("device")
    auto = run(small_config(root / "auto", small_dataset, *ONE_RANK, "trainer.steps=4"))
    cpu = run(small_config(root / "cpu", small_dataset, *ONE_RANK, "trainer.steps=4", "trainer.device=cpu"))
    return root, auto, cpu


@NO_GPU
def test_auto_and_an_explicit_cpu_train_the_same_numbers(auto_and_cpu_runs):
    root, auto, cpu = auto_and_cpu_runs
    assert _losses(auto) == _losses(cpu) and len(_losses(cpu)) == 4
    a = load_checkpoint(root / "auto" / "checkpoints" / "latest.pt")["model"]
    c = load_checkpoint(root / "cpu" / "checkpoints" / "latest.pt")["model"]
    assert all(torch.equal(a[name], c[name]) for name in a)


def test_the_run_records_its_device_and_its_checkpoint_holds_none(auto_and_cpu_runs):
    root, _, _ = auto_and_cpu_runs
    state = load_checkpoint(root / "cpu" / "checkpoints" / "latest.pt")
    assert yaml.safe_load(state["config"])["trainer"]["device"] == "cpu"
    resolved_auto = yaml.safe_load(load_checkpoint(root / "auto" / "checkpoints" / "latest.pt")["config"])
    assert resolved_auto["trainer"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    tensors = _tensors(state)
    assert len(tensors) > 10 and all(t.device.type == "cpu" for t in tensors)
    assert "cuda_rng" not in state  # a CPU run has no CUDA generator to continue


def test_each_step_reports_samples_per_second_and_no_device_memory_on_the_cpu(auto_and_cpu_runs):
    _, _, cpu = auto_and_cpu_runs
    assert len(cpu["history"]) == 4
    for _, metrics in cpu["history"]:  # what the tracker logs, step by step
        assert metrics["samples_per_s"] == pytest.approx(1 / metrics["step_time_s"])  # one sample a step
        assert "peak_device_memory_gib" not in metrics


def test_device_free_moves_every_nested_tensor_to_the_cpu():
    state = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(1), 3)], "c": {"d": torch.ones(1)}, "e": "x"}
    free = device_free(state)
    assert isinstance(free["b"][1], tuple) and free["b"][1][1] == 3 and free["e"] == "x"
    assert len(_tensors(free)) == 4 and all(t.device.type == "cpu" for t in _tensors(free))


def test_cpu_batches_are_the_arrays_themselves_and_autocast_follows_the_device():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = to_device(array, torch.device("cpu"))
    assert tensor.data_ptr() == array.ctypes.data  # no copy on the CPU
    with autocast(torch.device("cpu"), "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_the_backend_follows_the_device_and_sharing_a_gpu_means_gloo():
    assert backend_for("cuda", share_gpu=False) == "nccl"
    assert backend_for("cuda", share_gpu=True) == "gloo"
    assert backend_for("cpu", share_gpu=False) == "gloo"


def test_more_local_ranks_than_gpus_names_both_numbers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigValueError, match=r"trainer.device = cuda with 2 local ranks but 1 CUDA device\(s\)"):
        check_local_ranks("cuda", 2, share_gpu=False)
    check_local_ranks("cuda", 1, share_gpu=False)
    check_local_ranks("cuda", 4, share_gpu=True)  # the test mode: ranks share the GPU
    with pytest.raises(ConfigValueError, match="debug.share_gpu = true shares a GPU .* resolves to cpu"):
        check_local_ranks("cpu", 2, share_gpu=True)


def test_threads_per_rank_zero_shares_the_cores_among_the_local_ranks(monkeypatch):
    monkeypatch.setattr("training.distributed.device.usable_cores", lambda: 8)
    assert threads_per_rank(3, 2) == 3  # asked for: kept
    assert (threads_per_rank(0, 1), threads_per_rank(0, 2), threads_per_rank(0, 3)) == (8, 4, 2)
    assert threads_per_rank(0, 16) == 1  # more ranks than cores: one each


@NO_GPU
def test_cuda_without_a_gpu_is_refused_before_any_rank_starts(tmp_path, small_dataset):
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ConfigValueError, match="trainer.device = cuda, but torch sees no CUDA device"):
        run(small_config(tmp_path, small_dataset, "trainer.device=cuda"))
    with pytest.raises(ConfigValueError, match="debug.share_gpu = true"):
        run(small_config(tmp_path, small_dataset, "debug.share_gpu=true"))
    with pytest.raises(ConfigValueError, match=r"trainer.device = 'gpu' is out of range: expected auto\|cpu\|cuda"):
        run(small_config(tmp_path, small_dataset, "trainer.device=gpu"))
    assert not (tmp_path / "checkpoints").exists()


def _tiny_cli(dataset: Path) -> list[str]:
    overrides = [o for o in small_overrides(Path("."), dataset) if not o.startswith("run_dir=")]
    return [*overrides, "trainer.steps=2", "evaluate.at_end_of_training=false"]


@NO_GPU
@pytest.mark.slow  # refused in-process in the default tier: test_cuda_without_a_gpu_is_refused_before_any_rank_starts
@pytest.mark.parametrize("torchrun", [False, True], ids=["local", "torchrun"])
def test_cuda_without_a_gpu_is_one_line_on_the_command_line(tmp_path, small_dataset, torchrun):
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if torchrun else []
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    command = [sys.executable, *launcher, "-m", "training", *_tiny_cli(small_dataset), "trainer.device=cuda"]
    rc, out, err = run_in_own_session(command, tmp_path, {**environ, "OMP_NUM_THREADS": "1"}, timeout_s=240)
    lines = re.findall(r"^error: .*", out + err, re.MULTILINE)
    assert len(lines) == 1 and lines[0].startswith("error: trainer.device = cuda, but torch sees no CUDA device"), err
    if torchrun:
        assert "exitcode  : 2" in err
    else:
        assert rc == EXIT_USER_ERROR and err.strip().splitlines() == [lines[0], f"({DEBUG_HINT})"], err
