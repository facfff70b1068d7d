"""Skill by lead time: each forecast kind in one colour and marker in every panel, units on
the RMSE axes where known."""

from __future__ import annotations

import math

import pytest

import training.reporting.plots as plots
from training.skill.scores import SkillRow, SkillTable

KINDS = ["model", "persistence", "climatology", "hourly_climatology", "doy_climatology", "anomaly_persistence"]


def _table(kinds: list[str], variables: list[str]) -> SkillTable:
    """Scores at leads 6, 12, 24 h; the climatologies (no ACC) skipped in the ACC panels."""
    rows = [
        SkillRow(kind, var, lead, 1.0 + k + lead / 24, math.nan if "climatology" in kind else 0.9 - lead / 100, 4)
        for k, kind in enumerate(kinds)
        for var in variables
        for lead in (6.0, 12.0, 24.0)
    ]
    return SkillTable(rows)


def _styles(ax) -> dict[str, tuple[str, str]]:
    return {line.get_label(): (line.get_color(), line.get_marker()) for line in ax.lines}


def test_each_kind_keeps_its_colour_and_marker_in_every_panel():
    fig = plots.rmse_by_lead_figure(_table(KINDS, ["2t", "z"]))
    axes = fig.axes  # RMSE 2t, RMSE z, ACC 2t, ACC z
    rmse, acc = _styles(axes[0]), _styles(axes[3])
    assert set(rmse) == set(KINDS) and set(acc) == {"model", "persistence", "anomaly_persistence"}
    assert all(acc[kind] == rmse[kind] for kind in acc), (rmse, acc)
    assert _styles(axes[1]) == rmse
    assert len({colour for colour, _ in rmse.values()}) == len(KINDS)  # one colour per kind
    assert rmse["hourly_climatology"] == plots.KIND_STYLES["hourly_climatology"]
    plots.plt.close(fig)


def test_a_kind_has_the_same_style_whichever_kinds_come_before_it():
    alone = _styles(plots.rmse_by_lead_figure(_table(["anomaly_persistence", "my_baseline"], ["2t"])).axes[0])
    among = _styles(plots.rmse_by_lead_figure(_table([*KINDS, "my_baseline"], ["2t"])).axes[0])
    assert alone["anomaly_persistence"] == among["anomaly_persistence"]
    assert alone["my_baseline"] == among["my_baseline"] == plots.kind_style("my_baseline")
    plots.plt.close("all")


@pytest.mark.parametrize(("units", "label"), [({"2t": "K"}, "RMSE of 2t [K]"), (None, "RMSE of 2t (physical units)")])
def test_the_rmse_axis_says_the_unit_where_known(units, label, tmp_path):
    table = _table(["model", "persistence"], ["2t"])
    fig = plots.rmse_by_lead_figure(table, units)
    assert fig.axes[0].get_ylabel() == label
    plots.plt.close(fig)
    assert plots.rmse_by_lead(table, tmp_path / "rmse_by_lead.png", units).exists()
