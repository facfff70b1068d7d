"""``evaluate.area``: a run scored on a box inside its domain (training/skill/area.py): which
points are in it, their scores as those of the box alone, and a box the data does not reach
refused, naming the key."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest

from tests.training.conftest import small_config
from training.config.schema import run_config
from training.config.sections import EvaluateConfig
from training.config.settings import ConfigValueError, check_ranges
from training.data import generate_rossby_haurwitz
from training.launch.launcher import prepare
from training.skill.area import in_area, scored_weights
from training.skill.scores import SkillAccumulator


def test_the_points_in_a_box_one_across_the_antimeridian_and_every_point():
    lat = np.array([40.0, 40.0, 50.0, 30.0, 40.0, 40.0])
    lon = np.array([0.0, 359.0, 10.0, 5.0, 179.5, 181.0])
    assert in_area([45, -5, 35, 15], lat, lon).tolist() == [True, True, False, False, False, False]
    assert in_area([45, 170, 35, -170], lat, lon).tolist() == [False, False, False, False, True, True]
    assert in_area([90, -180, -90, 180], lat, lon).all() and in_area(None, lat, lon).all()


def test_scores_weighed_by_the_area_are_the_scores_of_its_points_alone():
    rng = np.random.default_rng(0)
    lat, lon = rng.uniform(30, 60, 50), rng.uniform(-20, 20, 50)
    weights, clim = rng.uniform(0.5, 1.5, 50), rng.normal(0, 1, (50, 2))
    dataset = SimpleNamespace(latitudes=lat, longitudes=lon, area_weights=weights)
    session = SimpleNamespace(cfg=SimpleNamespace(evaluate=SimpleNamespace(area=[50, -10, 40, 10])), dataset=dataset)
    session.points = slice(0, 50)
    inside = in_area([50, -10, 40, 10], lat, lon)
    assert 5 < inside.sum() < 45
    masked = SkillAccumulator(["a", "b"], [6.0], ("model",), scored_weights(session), clim)
    alone = SkillAccumulator(["a", "b"], [6.0], ("model",), weights[inside], clim[inside])
    for sample in range(3):
        forecast, truth = rng.normal(0, 1, (50, 2)), rng.normal(0, 1, (50, 2))
        masked.add("model", 0, forecast, truth, sample)
        alone.add("model", 0, forecast[inside], truth[inside], sample)
    a, b = masked.finalize(), alone.finalize()
    for v in ("a", "b"):
        assert a.rmse("model", v) == pytest.approx(b.rmse("model", v), rel=1e-12)
        assert a.acc("model", v) == pytest.approx(b.acc("model", v), rel=1e-12)


def test_a_box_out_of_range_is_refused_naming_the_key():
    with pytest.raises(ConfigValueError, match=r"evaluate\.area = \[30, 0, 40, 10\] is out of range"):
        check_ranges(EvaluateConfig(area=[30, 0, 40, 10]), "evaluate.")
    check_ranges(EvaluateConfig(area=[40, 0, 30, 10]), "evaluate.")


def test_a_box_the_data_does_not_reach_is_refused_before_the_run(tmp_path):
    store = generate_rossby_haurwitz(tmp_path / "rh.zarr", grid="o16", steps=12)
    cfg = small_config(tmp_path / "run", store, "evaluate.area=[-89.9,0,-90,1]")
    with pytest.raises(ConfigValueError, match=r"evaluate\.area = \[-89\.9, 0.*holds none of the data's"):
        prepare(run_config(cfg))


def test_a_run_scored_on_a_box_scores_its_points_alone(tmp_path):
    """Two 2-rank runs of the same model, one scored on the northern hemisphere: the tracer's
    persistence score is the hemisphere's own, the losses are the same (the loss keeps every point)."""
    from training.app import run

    store = generate_rossby_haurwitz(tmp_path / "rh.zarr", grid="o16", steps=24)
    tables, losses = [], []
    for name, area in (("whole", []), ("north", ["evaluate.area=[90,0,0,360]"])):
        cfg = small_config(tmp_path / name, store, "trainer.steps=2", "evaluate.steps=1", "evaluate.samples=2", *area)
        result = run(cfg)
        losses.append([m["train/loss"] for _, m in result["history"]])
        with open(tmp_path / name / "skill.csv") as f:
            tables.append({(r["kind"], r["variable"]): float(r["rmse"]) for r in csv.DictReader(f)})
    assert losses[0] == losses[1]
    # the Rossby-Haurwitz wave's fields are the same in both hemispheres; the tracer is not
    assert tables[1]["persistence", "tracer"] < 0.9 * tables[0]["persistence", "tracer"]
    assert tables[1]["persistence", "psi"] == pytest.approx(tables[0]["persistence", "psi"], rel=1e-6)
