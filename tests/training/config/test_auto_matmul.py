"""``trainer.matmul=auto`` in a run: measured into a backend on a CPU, ``aten`` where the probe
is off or on a GPU, a set backend kept, an unknown one refused by name, and a run from before
the key resumed on torch's GEMM."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module

from processor.matmul import matmul_backend, set_matmul_backend
from training.config.auto_matmul import resolve_run_matmul
from training.config.saved_names import current_names
from training.config.schema import run_config
from training.config.settings import ConfigValueError, check_ranges


@pytest.fixture(autouse=True)
def _restored_backend():
    """resolve_run_matmul sets the launching process's backend: this test process's, put back."""
    yield
    set_matmul_backend("aten")


def _cfg(*overrides: str):
    with initialize_config_module(config_module="configs", version_base="1.3"):
        cfg = run_config(compose(config_name="config", overrides=["run_dir=/tmp/x", *overrides]))
    cfg.trainer.device, cfg.trainer.threads_per_rank = "cpu", 1  # as the launcher resolves them
    return cfg


def test_auto_becomes_the_measured_backend(monkeypatch, tmp_path):
    monkeypatch.setenv("GRIDSHARD_MATMUL_PROBE", "1")
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    cfg = _cfg()
    choice = resolve_run_matmul(cfg)
    assert choice is not None and cfg.trainer.matmul == choice.backend in ("aten", "onednn")
    assert (tmp_path / "matmul_backends.json").exists()


@pytest.mark.parametrize(
    "override,env,device,expected",
    [
        ("trainer.matmul=auto", "0", "cpu", "aten"),  # the tests' switch
        ("trainer.matmul=auto", "1", "cuda", "aten"),
        ("trainer.precision=bf16", "1", "cpu", "aten"),  # autocast's linears are oneDNN's already
        ("trainer.matmul=onednn", "1", "cpu", "onednn"),
        ("trainer.matmul=aten", "1", "cpu", "aten"),
    ],
)
def test_nothing_is_measured_when_off_on_a_gpu_or_set(monkeypatch, tmp_path, override, env, device, expected):
    monkeypatch.setenv("GRIDSHARD_MATMUL_PROBE", env)
    monkeypatch.setenv("GRIDSHARD_CACHE_DIR", str(tmp_path))
    cfg = _cfg(override)
    cfg.trainer.device = device
    assert resolve_run_matmul(cfg) is None
    assert cfg.trainer.matmul == expected == matmul_backend()
    assert not (tmp_path / "matmul_backends.json").exists()


def test_onednn_without_onednn_is_named(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(ConfigValueError, match="trainer.matmul = onednn: this torch build has no oneDNN"):
        resolve_run_matmul(_cfg("trainer.matmul=onednn"))


def test_an_unknown_backend_is_named():
    with pytest.raises(ConfigValueError, match="trainer.matmul = 'mkl' is out of range"):
        check_ranges(_cfg("trainer.matmul=mkl"))


def test_a_run_from_before_the_key_resumes_on_torchs_gemm():
    assert current_names({"trainer": {"steps": 10}})["trainer"]["matmul"] == "aten"
    assert current_names({"trainer": {"matmul": "onednn"}})["trainer"]["matmul"] == "onednn"
