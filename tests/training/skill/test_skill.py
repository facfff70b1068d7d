"""Forecast verification: climatology, RMSE/ACC by hand, the sharded accumulator
(uneven point blocks, data-parallel replicas) against one rank, the table and the plots."""

from __future__ import annotations

import csv
import math

import matplotlib.image
import numpy as np
import pytest
import zarr

from tests.rank_pool import RankError
from training.data import ZarrDataset, generate_rossby_haurwitz
from training.skill.scores import SkillAccumulator, SkillTable, climatology

VARIABLES = ["a", "b", "c"]
LEADS = [6.0, 12.0]


# ---------------------------------------------------------------------------- climatology


def test_climatology_in_physical_units_skips_missing(tmp_path):
    path = generate_rossby_haurwitz(tmp_path / "clim.zarr", "o16", steps=8, seed=2, missing=(3,))
    ds = ZarrDataset(path)
    points = slice(10, 50)
    clim = climatology(ds, [1, 2, 3, 4], points)
    raw = zarr.open_group(str(path), mode="r")["data"]  # physical units as stored
    expected = sum(raw[t, :, 0, 10:50].T.astype(np.float64) for t in (1, 2, 4)) / 3
    assert clim.shape == (40, len(ds.variables)) and clim.dtype == np.float64
    np.testing.assert_allclose(clim, expected, rtol=1e-5, atol=1e-6 * float(ds.stdev.max()))
    with pytest.raises(ValueError, match="no date"):
        climatology(ds, [3], points)


# ---------------------------------------------------------------------------- scores by hand


def _hand_accumulator() -> SkillAccumulator:
    """4 points weighing 1, 2, 1, 0; climatology 1 for a; 0, 0, 10, 10 for b; two samples."""
    clim = np.array([[1, 0], [1, 0], [1, 10], [1, 10]], dtype=float)
    acc = SkillAccumulator(["a", "b"], [6.0], ("model",), weights=np.array([1.0, 2, 1, 0]), climatology=clim)
    f0, o0 = np.array([[2, 1], [0, 1], [1, 10], [7, 10]]), np.array([[3, 1], [1, 1], [1, 10], [-5, 10]])
    f1, o1 = np.array([[1, -1], [1, 0], [3, 12], [0, 10]]), np.array([[1, 1], [3, 0], [1, 8], [0, 10]])
    acc.add("model", 0, f1, o1, sample_id=1)
    acc.add("model", 0, f0, o0, sample_id=0)
    return acc


def test_rmse_and_acc_by_hand():
    table = _hand_accumulator().finalize(None, None)
    # a, sample 0: errors -1, -1, 0, (12 at weight 0): MSE (1 + 2 + 0) / 4 = 0.75
    #   anomalies f' = 1, -1, 0 and o' = 2, 0, 0: ACC = 2 / sqrt(3 * 4)
    # a, sample 1: errors 0, -2, 2: MSE (0 + 8 + 4) / 4 = 3; f' = 0, 0, 2, o' = 0, 2, 0: ACC 0
    assert table.rmse("model", "a") == pytest.approx([math.sqrt((0.75 + 3) / 2)], abs=1e-15)
    assert table.acc("model", "a") == pytest.approx([(2 / math.sqrt(12) + 0) / 2], abs=1e-15)
    # b, sample 0: perfect (MSE 0), f' = o' = 1, 1, 0: ACC 1
    # b, sample 1: errors -2, 0, 4: MSE (4 + 16) / 4 = 5; f' = -1, 0, 2, o' = 1, 0, -2: ACC -5 / 5
    assert table.rmse("model", "b") == pytest.approx([math.sqrt(2.5)], abs=1e-15)
    assert table.acc("model", "b") == pytest.approx([0.0], abs=1e-15)
    assert table.n_samples("model", "a") == [2]


def test_accumulator_rejects_misuse():
    acc = _hand_accumulator()
    with pytest.raises(ValueError, match="already added"):
        acc.add("model", 0, np.zeros((4, 2)), np.zeros((4, 2)), sample_id=0)
    with pytest.raises(ValueError, match="unknown kind"):
        acc.add("persistence", 0, np.zeros((4, 2)), np.zeros((4, 2)), sample_id=5)
    with pytest.raises(ValueError, match="local points, variables"):
        acc.add("model", 0, np.zeros((3, 2)), np.zeros((3, 2)), sample_id=5)


# ---------------------------------------------------------------------------- sharded


def _case(n_points: int, samples: list[int], seed: int = 7) -> dict:
    """Random fields for every sample, kind and lead on ``n_points`` points."""
    rng = np.random.default_rng(seed)
    shape = (len(samples), 3, len(LEADS), n_points, len(VARIABLES))
    return {
        "weights": rng.uniform(0.2, 2.0, n_points),
        "clim": rng.normal(size=(n_points, len(VARIABLES))) * 5,
        "forecast": rng.normal(size=shape) * 3 + 1,
        "truth": rng.normal(size=shape) * 3,
        "samples": samples,
    }


def _accumulate(case: dict, block: slice, samples: list[int]) -> SkillAccumulator:
    kinds = ("model", "persistence", "climatology")
    acc = SkillAccumulator(VARIABLES, LEADS, kinds, weights=case["weights"][block], climatology=case["clim"][block])
    for s in samples:
        i = case["samples"].index(s)
        for k, kind in enumerate(acc.kinds):
            for lead in range(len(LEADS)):
                acc.add(kind, lead, case["forecast"][i, k, lead, block], case["truth"][i, k, lead, block], s)
    return acc


def _block(sizes: list[int], rank: int) -> slice:
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def _as_array(table: SkillTable) -> np.ndarray:
    return np.array([[r.rmse, r.acc, r.n_samples] for r in table.rows])


def sharded_points(group, case: dict, sizes: list[int]) -> np.ndarray:
    import torch.distributed as dist

    rank = dist.get_rank(group) if group is not None else 0
    return _as_array(_accumulate(case, _block(sizes, rank), case["samples"]).finalize(group, None))


def dp_by_mp(group, case: dict, sizes: list[int], replicas: list[list[int]]) -> np.ndarray:
    """4 ranks: model replicas {0, 1} and {2, 3} (mp groups), dp groups {0, 2} and {1, 3}."""
    import torch.distributed as dist

    mp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    rank = dist.get_rank()
    dp_rank, mp_rank = divmod(rank, 2)
    acc = _accumulate(case, _block(sizes, mp_rank), replicas[dp_rank])
    return _as_array(acc.finalize(mp_groups[dp_rank], dp_groups[mp_rank]))


def mismatched_samples(group, case: dict) -> str:
    import torch.distributed as dist

    rank = dist.get_rank(group)
    samples = case["samples"][: len(case["samples"]) - rank]  # rank 1 adds one sample fewer
    try:
        _accumulate(case, _block([4, 4], rank), samples).finalize(group, None)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _one_rank(case: dict) -> np.ndarray:
    return _as_array(_accumulate(case, slice(None), case["samples"]).finalize(None, None))


@pytest.mark.parametrize("sizes", [[7, 30], [3, 21, 13]], ids=["2 ranks", "3 ranks"])
def test_sharded_points_equal_one_rank(rank_pool, sizes):
    case = _case(sum(sizes), samples=[0, 3, 5])
    expected = _one_rank(case)
    results = rank_pool.run_ok(sharded_points, len(sizes), case, sizes)
    np.testing.assert_allclose(results[0], expected, rtol=1e-12, atol=1e-14)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])  # identical on every rank


def test_two_replicas_by_two_model_ranks_equal_one_rank(rank_pool):
    case = _case(29, samples=[0, 1, 2, 3, 4])
    expected = _one_rank(case)
    results = rank_pool.run_ok(dp_by_mp, 4, case, [10, 19], [[0, 2, 4], [1, 3]])
    np.testing.assert_allclose(results[0], expected, rtol=1e-12, atol=1e-14)
    assert (results[0][:, 2] == 5).all()  # samples counted over both replicas
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_model_ranks_with_different_samples_raise_on_every_rank(rank_pool):
    results = rank_pool.run(mismatched_samples, 2, _case(8, samples=[0, 1, 2]))
    assert all(not isinstance(r, RankError) and "different (sample, kind, lead)" in r for r in results), results


# ---------------------------------------------------------------------------- table and plots


def _table() -> SkillTable:
    case = _case(12, samples=[0, 1])
    case["forecast"][:, 2] = case["clim"]  # the climatology forecast: no anomaly, no ACC
    return _accumulate(case, slice(None), [0, 1]).finalize(None, None)


def test_table_outputs(tmp_path):
    table = _table()
    assert table.kinds == ["model", "persistence", "climatology"] and table.lead_hours == LEADS
    text = table.to_markdown()
    for word in ("### a", "model RMSE", "persistence RMSE", "climatology RMSE", "skill vs persistence", "model ACC"):
        assert word in text
    row = next(line for line in text.splitlines() if line.startswith("| 12 |"))
    skill = 1 - table.rmse("model", "a")[1] / table.rmse("persistence", "a")[1]
    assert f"{skill:+.3f}" in row
    rows = list(csv.DictReader(table.to_csv(tmp_path / "skill.csv").open()))
    assert len(rows) == 3 * 3 * 2 and float(rows[0]["rmse"]) == table.rows[0].rmse
    metrics = table.metrics()  # one evaluation: the lead in the name, never the step
    assert metrics["eval/rmse/a/model/006h"] == table.rmse("model", "a")[0]
    assert metrics["eval/rmse/a/model/012h"] == table.rmse("model", "a")[1]
    ratio = table.rmse("model", "a")[1] / table.rmse("persistence", "a")[1]
    assert metrics["eval/rmse/a/model_over_persistence/012h"] == ratio
    assert "eval/acc/b/persistence/006h" in metrics and "eval/acc/b/climatology/006h" not in metrics  # NaN out


def _width(path) -> int:
    return matplotlib.image.imread(path).shape[1]


def test_rmse_by_lead_plot(tmp_path):
    from training.reporting.plots import rmse_by_lead

    path = rmse_by_lead(_table(), tmp_path / "rmse.png")
    assert _width(path) >= 1000


def test_loss_curve_ticks(tmp_path, monkeypatch):
    import training.reporting.plots as plots

    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    history = [(s, {"train/loss": 0.3 * 0.9**s}) for s in range(7)]
    history[3][1]["val/loss"] = 0.2
    path = plots.loss_curve(history, tmp_path / "loss.png")
    assert _width(path) >= 1000
    ax = figures[0].axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks())
    labels = [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]
    assert labels and not any(c in lab for lab in labels for c in "$^×"), labels
    val_line = next(line for line in ax.lines if line.get_label() == "val/loss (1 forecast step)")
    assert val_line.get_zorder() > ax.lines[0].get_zorder()


def test_loss_curve_names_each_loss_horizon(tmp_path, monkeypatch):
    """A rollout run's curves are over different horizons while the rollout is raised: the
    legend says which."""
    import training.reporting.plots as plots

    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    history = [(s, {"train/loss": 0.3, "train/rollout": 1.0 + (s >= 4)}) for s in range(7)]
    history[5][1].update({"val/loss": 0.2, "val/rollout": 2.0})
    plots.loss_curve(history, tmp_path / "loss.png")
    labels = [line.get_label() for line in figures[0].axes[0].lines]
    assert labels == ["train/loss (1 to 2 forecast steps, raised during the run)", "val/loss (2 forecast steps)"]
