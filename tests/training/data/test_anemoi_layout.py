"""The anemoi-datasets stores this package writes (training.data.anemoi_layout): their statistics
as anemoi-datasets computes them."""

from __future__ import annotations

import numpy as np
import zarr

from training.data.anemoi_layout import write_anemoi_store


def test_a_written_store_s_statistics_leave_its_points_without_a_value_out(tmp_path):
    """As anemoi-datasets' with ``build.allow_nans``: a station's gaps do not make them NaN."""
    rng = np.random.default_rng(0)
    data = rng.normal(280, 5, (20, 1, 1, 3)).astype(np.float32)
    data[[2, 7], 0, 0, 1] = np.nan  # the second station's gaps
    dates = np.datetime64("2020-01-01") + np.arange(20) * np.timedelta64(1, "D")
    lat, lon = np.array([40.0, 41.0, 42.0]), np.array([-4.0, -3.0, -2.0])
    nans_allowed = {"allow_nans": True}
    store = write_anemoi_store(tmp_path / "s.zarr", data, dates, ["2t"], lat, lon, None, extra_attrs=nans_allowed)
    root = zarr.open_group(str(store), mode="r")
    values = data[:, 0, 0].astype(np.float64)
    np.testing.assert_allclose(root["mean"][:], [np.nanmean(values)])
    np.testing.assert_allclose(root["stdev"][:], [np.nanstd(values)])
    np.testing.assert_allclose([root["minimum"][0], root["maximum"][0]], [np.nanmin(values), np.nanmax(values)])


def test_a_store_written_again_with_the_resolution_its_attributes_hold(tmp_path):
    """A store's ``resolution`` attribute may read as a number (0.25): writing a copy with it works."""
    data = np.zeros((4, 1, 1, 4), dtype=np.float32)
    dates = np.datetime64("2020-01-01") + np.arange(4) * np.timedelta64(6, "h")
    lat, lon = np.array([50.0, 50.0, 50.25, 50.25]), np.array([0.0, 0.25, 0.0, 0.25])
    store = write_anemoi_store(tmp_path / "s.zarr", data, dates, ["2t"], lat, lon, 0.25)
    assert zarr.open_group(str(store), mode="r").attrs["resolution"] == "0.25"
