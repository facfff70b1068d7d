"""``python -m benchmarks --multirun``: a small sweep writes rows, CSV, plots and MLflow runs."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks", *args, f"results_root={tmp_path}", "hydra.job.chdir=false"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])


def test_a_small_sweep_writes_all_outputs(tmp_path):
    out = _bench(
        tmp_path,
        "--multirun",
        "grid=o8,o12",
        "strategy=none,shard_heads,shard_sequence",
        "ranks=1,2",
        "model.num_layers=1",
        "model.num_channels=16",
        "model.window_size=16",
        "warmup=0",
        "gemm_size=256",
        "steps=2",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (sweep,) = [p for p in tmp_path.iterdir() if p.is_dir() and (p / "results.jsonl").exists()]
    rows = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["grid"], r["strategy"], r["ranks"]) for r in ok} == {
        (g, s, p) for g in ("o8", "o12") for s, p in (("none", 1), ("shard_heads", 2), ("shard_sequence", 2))
    }
    assert all(r["bytes_rel_error_max"] <= 0.01 for r in ok)
    with open(sweep / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 12
    plots = sorted(p.name for p in (sweep / "plots").iterdir())
    assert plots == [
        "processor_bytes_vs_ranks.png",
        "processor_time_memory_vs_grid.png",
        "processor_time_memory_vs_ranks.png",
    ]
    table = (sweep / "results.md").read_text()
    assert "| processor | o12 |" in table
    assert table.splitlines()[0].startswith("Measured on ")  # which kind of machine
    assert "| sent/rank/layer (MiB) | analytic/rank/layer (MiB) |" in table.splitlines()[2]
    assert "sent/rank/step (MiB)" in out.stdout and "sent/rank/layer (MiB)" in out.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("gridshard-benchmarks")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6
    assert all("step_time_s" in r.data.metrics and "bytes_sent_per_step_max" in r.data.metrics for r in children)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.csv", "processor_bytes_vs_ranks.png"} <= artifacts


@pytest.mark.parametrize(
    "override,message",
    [
        ("ranks=0", "ranks = 0 is out of range"),
        ("strategy=ring", "config key strategy: unknown strategy 'ring'"),
        ("model.num_heads=3", "config key model.num_heads: num_channels (64) is not divisible by num_heads (3)"),
        ("grid=x12", "x12"),
        ("target=train_step grid=n320", "needs grid coordinates"),
        ("model.depth=3", "depth"),
        ("stepz=3", "stepz"),
    ],
)
def test_bad_configuration_fails_before_any_rank_starts(tmp_path, override, message):
    out = _bench(tmp_path, *override.split())
    assert out.returncode != 0
    assert message in out.stderr + out.stdout
    assert not list(tmp_path.rglob("results.jsonl"))


def test_scale_probe_finds_a_grid_that_fits_and_checks_it(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.scale_probe",
        f"results_root={tmp_path}",
        "ranks=2",
        "probe.budget_gib=1.5",
        "probe.fit_grids=[o16,o48]",
        "model.num_layers=2",
        "model.num_channels=64",
        "model.num_heads=4",
        "model.window_size=64",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "scale_probe.jsonl").read_text().splitlines()]
    assert row["largest_grid"] is not None
    assert row["largest_points"] > 10944  # bigger than the grids it was fitted on
    assert row["measured_gib"] <= 1.5
