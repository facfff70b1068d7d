"""``benchmarks.anemoi_peer`` on a small grid: anemoi-models' own processor, with its attention
call given gridshard's kernels, and gridshard's processor on anemoi's weights compute the same
outputs (skipped without anemoi-models: CI runs it in ``.venv-anemoi``)."""

from __future__ import annotations

import argparse

import pytest
import torch

pytest.importorskip("anemoi.models.layers.processor")

from benchmarks import anemoi_peer  # noqa: E402


def test_every_variant_computes_anemois_numbers() -> None:
    args = argparse.Namespace(points=300, channels=32, heads=4, window=20, layers=2)
    x = torch.randn(args.points, args.channels, generator=torch.Generator().manual_seed(0))
    steps = anemoi_peer.variants(args, x)
    assert {"anemoi", "anemoi + banded", "gridshard", "gridshard + banded"} <= set(steps)
    outputs = {name: step() for name, step in steps.items()}
    reference = outputs["anemoi"]
    for name, out in outputs.items():
        assert out.shape == reference.shape
        assert float((out - reference).abs().max() / reference.abs().max()) < 1e-5, name


def test_the_table_names_each_variant(capsys) -> None:
    anemoi_peer.main(["--points", "200", "--channels", "16", "--heads", "2", "--window", "8", "--rounds", "1"])
    table = capsys.readouterr().out
    for name in ("| anemoi |", "| anemoi + banded |", "| gridshard |", "| gridshard + banded |"):
        assert name in table
