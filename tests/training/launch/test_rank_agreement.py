"""Ranks that disagree on the configuration or the dataset fail at start, on every rank, naming
the ranks and keys that differ (before any training step could diverge silently)."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from processor.runtime import run_local
from tests.training.conftest import small_config
from training.config.schema import RunConfig
from training.data import generate_rossby_haurwitz
from training.launch.launcher import prepare
from training.loop.trainer import train


def train_in(configs: list[RunConfig], workdirs: list[str]) -> dict:
    """Each rank trains with its own configuration, from its own working directory (like a node
    with its own local disk)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    os.chdir(workdirs[rank])
    return train(configs[rank])


def _report_lines(message: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^  rank (\d+): (.*)$", message, re.MULTILINE)}


def _run(configs: list[RunConfig], workdirs: list[str]) -> dict[int, str]:
    with pytest.raises(RuntimeError) as info:
        run_local(train_in, 2, configs, workdirs, timeout_s=30, threads_per_rank=1)
    lines = _report_lines(str(info.value))
    assert sorted(lines) == [0, 1], str(info.value)
    assert lines[0] == lines[1], "every rank raises the same error"
    assert lines[0].startswith("ValueError: configuration or dataset differ between rank 0 and ranks [1]")
    return lines


def test_different_configurations(tmp_path, small_dataset):
    base = prepare(small_config(tmp_path, small_dataset, "logging.mlflow=false"))
    other = prepare(small_config(tmp_path, small_dataset, "logging.mlflow=false", "model.window_size=30"))
    other.trainer.lr = 1e-3
    line = _run([base, other], [str(tmp_path)] * 2)[0]
    assert "model.window_size: 40 on ranks [0], 30 on ranks [1]" in line
    assert f"trainer.lr: {base.trainer.lr:g} on ranks [0], 0.001 on ranks [1]" in line
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_same_path_different_dataset(tmp_path, small_dataset):
    """``data.path`` is the same relative path on both ranks, but rank 1's disk has a shorter store."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(small_dataset, node0 / "rh.zarr")
    generate_rossby_haurwitz(node1 / "rh.zarr", "o16", steps=30, seed=3)
    cfg = prepare(small_config(tmp_path / "run", small_dataset, "logging.mlflow=false"))
    cfg.data.path = "rh.zarr"
    line = _run([cfg, cfg], [str(node0), str(node1)])[0]
    assert "dataset.shape: (40, 1600) on ranks [0], (30, 1600) on ranks [1]" in line
