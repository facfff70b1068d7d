"""The GPU check without a GPU: it skips saying why, its code runs on CPU at toy sizes, it
writes a dated section that a second run replaces, and it imports nothing a bare GPU machine
lacks (no Hydra, MLflow, SciPy, zarr, torch_geometric)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run for real")
def test_without_a_gpu_it_skips_and_writes_nothing(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    assert gpu_check.main(["--doc", str(doc)]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out
    assert not doc.exists()


def test_the_dry_run_writes_a_section_that_a_second_run_replaces(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "DRY_RUN_POINTS", {"toy": 300})
    monkeypatch.setattr(gpu_check, "WINDOW", 40)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nearlier text\n")
    for _ in range(2):
        assert gpu_check.main(["--dry-run", "--doc", str(doc), "--skip-tests"]) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nearlier text\n")
    assert text.count("<!-- gpu_check:begin") == 1 and text.count("## GPU check (") == 1
    kernel_rows = [line for line in text.splitlines() if line.startswith("| 300 | 16 × 16 | 40 |")]
    assert len(kernel_rows) == 8  # 4 paths x bf16/fp32
    timed = [row for row in kernel_rows if "| sdpa_blocks |" in row or "| dense |" in row]
    assert all(row.split("|")[7].strip() != "—" for row in timed)  # these ran on CPU
    assert any("flex has no backward on CPU" in row for row in kernel_rows)  # and these say why not
    assert text.count("| toy | 300 |") == 4  # processor: auto and dense, bf16 and fp32


def test_it_needs_only_torch_einops_numpy():
    blocked = ("hydra", "omegaconf", "mlflow", "scipy", "torch_geometric", "zarr", "matplotlib", "tqdm", "yaml")
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError('not on a bare GPU machine: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import benchmarks.gpu_check\n"
        "import tests.processor.attention.test_cuda_kernels, tests.processor.test_cuda_processor\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
