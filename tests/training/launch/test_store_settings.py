"""The run's settings derived from the store (training/launch/store_settings.py), worked by hand on
stores described as the launcher reads them: a global grid, a regional box, a point set, an
hourly, a daily and a gappy store; and every derived key left as given when it is set."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from training.config.schema import run_config
from training.launch import store_settings
from training.launch.store_settings import (
    derive_batch_size,
    derive_calibration_period,
    derive_field_input,
    derive_hidden_grid,
    derive_lead_time,
    derive_ranks,
    derive_recipe,
    derive_validation,
    describe,
    octahedral_points,
)


def _cfg(*overrides: str):
    """The default configuration; its input states as the recipe derives them on a global store
    (one) unless given: the validation's samples depend on them."""
    states = [] if any(o.startswith("model.multistep_input=") for o in overrides) else ["model.multistep_input=1"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return run_config(compose(config_name="config", overrides=["run_dir=/tmp/unused", *states, *overrides]))


def _store(points: int, hours: float, dates: int, is_global=False, missing=(), name="regional lat-lon", rows=None):
    """What the derivation reads of a store: its points (``rows``: their lengths, None for an
    unstructured set), extent, frequency and dates."""
    return SimpleNamespace(
        point_set=SimpleNamespace(is_global=is_global, name=name, rows=rows),
        latitudes=np.zeros(points),
        longitudes=np.zeros(points),
        frequency_s=int(hours * 3600),
        n_times=dates,
        missing=frozenset(missing),
        n_members=1,
        path="store.zarr",
        roles=SimpleNamespace(prognostic=["2t"], diagnostic=[], forcing=[], computed=["insolation"] * 9),
    )


def _values(derived) -> dict:
    return {d.key: d.value for d in derived}


def test_a_global_store_gets_the_octahedral_grid_of_a_third_of_its_points():
    cfg = _cfg()
    assert cfg.model.hidden_grid == "auto" and cfg.model.hidden_stride is None
    derived = derive_hidden_grid(cfg, _store(5248, 6, 400, is_global=True))  # the built-in o32 data
    assert _values(derived) == {"model.hidden_grid": "o16"}  # o16: 1,600 points; o17: 1,768 > 5,248 / 3
    assert octahedral_points(16) == 1600 and cfg.model.hidden_stride == 1
    coarse = _cfg()
    derive_hidden_grid(coarse, _store(600, 6, 400, is_global=True))
    assert coarse.model.hidden_grid == "o8"  # never coarser
    n320 = _cfg()
    derive_hidden_grid(n320, _store(542_080, 6, 400, is_global=True))
    assert n320.model.hidden_grid == "o96"  # never finer: anemoi's hidden grid for n320 data


def test_a_regional_box_gets_its_own_points_coarsened_where_there_are_many():
    cfg = _cfg()
    derived = _values(derive_hidden_grid(cfg, _store(1617, 1, 744)))  # ERA5 UK: 33 x 49
    # 1,617 / 4 <= 500 (a box keeps its last row and column: 425 hidden points)
    assert derived == {"model.hidden_grid": "data", "model.hidden_stride": 2}
    small = _cfg()
    derive_hidden_grid(small, _store(500, 24, 3652))
    assert (small.model.hidden_grid, small.model.hidden_stride) == ("data", 1)
    daily = _cfg()
    derived = derive_hidden_grid(daily, _store(561, 24, 3652, rows=[33] * 17))  # NCEP's North Atlantic
    assert daily.model.hidden_stride == 2 and "one row and column in 2" in derived[-1].why
    curvilinear = _cfg()  # CORDEX's rotated grid: an unstructured set, coarsened along its curve
    derived = derive_hidden_grid(curvilinear, _store(840, 24, 7030))
    assert curvilinear.model.hidden_stride == 2 and "one point in 4 along the curve" in derived[-1].why
    large = _cfg()
    derive_hidden_grid(large, _store(10_000, 1, 744))
    assert large.model.hidden_stride == 5  # 10,000 / 16 > 500 >= 10,000 / 25


def test_a_point_set_gets_its_own_points():
    cfg = _cfg()
    derived = derive_hidden_grid(cfg, _store(340, 1, 744, name="340 points, regional"))
    assert _values(derived) == {"model.hidden_grid": "data", "model.hidden_stride": 1}
    assert "340 points, regional" in derived[0].why


def test_the_lead_time_is_six_hours_on_a_finer_store_else_one_step():
    for hours, lead in ((1, 6), (3, 6), (6, 6), (12, 12), (24, 24), (4, 4)):
        cfg = _cfg()
        assert _values(derive_lead_time(cfg, _store(100, hours, 400))) == {"data.lead_time": lead}, hours


def test_the_validation_period_holds_64_initial_dates():
    """Hourly, 744 dates, 6 h steps, 4 leads scored: the validation period needs 64 initial dates
    and 24 h of targets after the last, 88 dates: 12% of them (89)."""
    cfg = _cfg("evaluate.steps=4", "data.lead_time=6")
    derived = _values(derive_validation(cfg, _store(1617, 1, 744)))
    assert derived == {"data.val_fraction": 0.12, "evaluate.samples": 89 - 24}
    daily = _cfg("evaluate.steps=5", "data.lead_time=24")
    assert _values(derive_validation(daily, _store(561, 24, 3652)))["data.val_fraction"] == 0.1  # 365 days


def test_a_gappy_store_counts_only_the_dates_it_has():
    """Daily, 6 winters of 120 days, a year apart (days 1825-1944 the last): 10% of the dates
    (from day 1971) hold none. Initial dates need 5 days of targets, so the last is day 1939 and
    64 of them start at day 1876: 314 dates, 15% (328: from day 1862, 78 initial dates)."""
    winters = [d for year in range(6) for d in range(365 * year, 365 * year + 120)]
    missing = set(range(365 * 6)) - set(winters)
    cfg = _cfg("evaluate.steps=5", "data.lead_time=24")
    derived = _values(derive_validation(cfg, _store(182, 24, 365 * 6, missing=missing)))
    assert derived == {"data.val_fraction": 0.15, "evaluate.samples": 78}


def test_a_short_store_takes_the_largest_share_and_says_so():
    cfg = _cfg("evaluate.steps=8")
    derived = derive_validation(cfg, _store(100, 6, 60))
    assert derived[0].value == 0.3 and "the store allows no more" in derived[0].why


def test_the_recipe_follows_the_datas_extent():
    """A limited area (a regional box, a point set) learns over the per-point regression, with 8
    learned features per point and 2 input states, at a learning rate of 1e-3; global data over
    persistence, with neither, at 3e-3."""
    area = _cfg("model.multistep_input=null")
    assert _values(derive_recipe(area, _store(340, 1, 744).point_set)) == {
        "model.baseline": "linear_regression",
        "model.trainable_size": 8,
        "model.multistep_input": 2,
        "trainer.lr": 1e-3,
    }
    points = _cfg("model.multistep_input=null")
    assert _values(derive_recipe(points, _store(182, 24, 3652, name="point set").point_set))["model.baseline"] == (
        "linear_regression"
    )
    world = _cfg("model.multistep_input=null")
    derived = derive_recipe(world, _store(5248, 6, 400, is_global=True).point_set)
    assert _values(derived) == {
        "model.baseline": "persistence",
        "model.trainable_size": 0,
        "model.multistep_input": 1,
        "trainer.lr": 3e-3,
    }
    assert all(d.why == "global data" for d in derived)


@pytest.mark.parametrize(
    "points, area, batch",
    [
        (5248, False, 1),  # the built-in global data
        (4096, False, 2),
        (1617, False, 4),
        (1617, True, 8),  # ERA5 UK
        (840, True, 16),  # CORDEX
        (561, True, 16),  # NCEP
        (3000, True, 4),
        (340, True, 16),  # INCA: at most 16
        (35, True, 16),  # Iberia
        (20_000, True, 1),  # one sample alone is more
    ],
)
def test_the_batch_fits_16384_points_on_a_limited_area_and_8192_on_global_data(points, area, batch):
    cfg = _cfg()
    assert _values(derive_batch_size(cfg, points, area)) == {"trainer.batch_size": batch}


def test_ranks_one_on_every_core_for_a_small_grid(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    small = _cfg()
    assert _values(derive_ranks(small, 404)) == {"trainer.nprocs": 1, "trainer.ranks_per_model": 1}
    default_run = _cfg()  # its o16: one rank of 2 threads ran it 1.15-1.6x faster than 2 ranks of one
    assert _values(derive_ranks(default_run, 1600)) == {"trainer.nprocs": 1, "trainer.ranks_per_model": 1}
    large = _cfg()
    assert _values(derive_ranks(large, 5248)) == {"trainer.nprocs": 2, "trainer.ranks_per_model": 2}
    gpus = _cfg("trainer.device=cuda")
    monkeypatch.setattr(store_settings.torch.cuda, "device_count", lambda: 4)
    assert _values(derive_ranks(gpus, 404))["trainer.nprocs"] == 4
    under_torchrun = _cfg()
    monkeypatch.setattr(store_settings, "under_torchrun", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert _values(derive_ranks(under_torchrun, 404))["trainer.nprocs"] == 8


def _field_input_derived(store, *given):
    """The configuration (validation: the last 30%) with the recipe, the ranks and the field input
    derived for ``store``, and what the field input's derivation said."""
    cfg = _cfg("data.val_fraction=0.3", *given)
    derive_recipe(cfg, store.point_set)
    derive_ranks(cfg, 404)
    return cfg, derive_field_input(cfg, store)


def test_the_field_input_where_one_rank_holds_every_point_and_its_map_fits(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def derived(store, *given):
        return _field_input_derived(store, *given)[1]

    (on,) = derived(_store(561, 24, 3652))  # NCEP's ten years of days: 2,555 one-step samples, 2,048 read
    assert (on.key, on.value) == ("model.field_input", True) and "on 2048 samples" in on.why
    (month,) = derived(_store(1617, 1, 744))  # ERA5 UK's month of hours: 520
    assert month.value is False and "520 training samples of 1,617 points x 19 inputs: under 1,024 fit" in month.why
    assert _values(derived(_store(5248, 6, 400, is_global=True))) == {"model.field_input": False}  # persistence
    assert _values(derived(_store(561, 24, 3652), "trainer.ranks_per_model=2", "trainer.nprocs=2")) == {
        "model.field_input": False
    }
    assert _values(derived(_store(561, 24, 3652), "trainer.compile=true")) == {"model.field_input": False}
    (box,) = derived(_store(40_000, 24, 3652))  # a 0.1 degree box: 64 samples fit in memory
    assert box.value is False and "under 1,024 fit" in box.why


def test_a_calibration_period_where_the_field_input_is_on_and_enough_training_is_left(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def derived(store, *given):
        cfg, _ = _field_input_derived(store, *given)
        return cfg, derive_calibration_period(cfg, store)

    cfg, (ncep,) = derived(_store(561, 24, 3652))  # 3,652 days: 30% validation, 10% calibration
    assert (ncep.key, ncep.value) == ("data.calibration_fraction", 0.1)
    assert "holds 365 days of them, held out of training; 2,191 training samples left" in ncep.why  # 0 .. 2,190
    assert cfg.data.calibration_fraction == 0.1
    _, (short,) = derived(_store(561, 24, 1700))  # the field input on (1,189 samples), 1,019 with the period
    assert short.value == 0.0 and "1,019 training samples would be left, under 1,024" in short.why
    winters = [t for t in range(7030) if t % 365 >= 90]  # 20 winters of 90 days: 180 of the period's 703 dates
    _, (gappy,) = derived(_store(561, 24, 7030, missing=winters))
    assert gappy.value == 0.0 and "holds 180 days of them, under a year" in gappy.why
    _, (off,) = derived(_store(1617, 1, 744))  # ERA5 UK's month of hours: no field input
    assert off.value == 0.0 and "the field input is off" in off.why
    _, given = derived(_store(561, 24, 3652), "data.calibration_fraction=0.2")
    assert given == []


@pytest.mark.parametrize(
    "given",
    [
        ["model.hidden_grid=o8", "model.hidden_stride=1"],
        ["model.hidden_grid=data", "model.hidden_stride=3"],
        ["data.lead_time=12"],
        ["data.val_fraction=0.2", "evaluate.samples=5"],
        ["trainer.nprocs=3", "trainer.ranks_per_model=3"],
        ["model.baseline=persistence", "model.trainable_size=2", "model.multistep_input=3"],
        ["trainer.batch_size=2"],
        ["trainer.lr=0.005"],
        ["model.field_input=False"],
        ["data.calibration_fraction=0.0"],
    ],
)
def test_a_given_key_is_never_derived(given):
    cfg = _cfg(*given)
    store = _store(1617, 1, 744)
    derived = [
        *derive_hidden_grid(cfg, store),
        *derive_recipe(cfg, store.point_set),
        *derive_batch_size(cfg, 1617, area=True),
        *derive_lead_time(cfg, store),
        *derive_validation(cfg, store),
        *derive_ranks(cfg, 404),
        *derive_field_input(cfg, store),
        *derive_calibration_period(cfg, store),
    ]
    for override in given:
        key, value = override.split("=")
        assert key not in {d.key for d in derived}
        section, name = key.split(".")
        assert str(getattr(getattr(cfg, section), name)) == value
    assert describe(derived).startswith("derived from the store (set a key to override it): ")
