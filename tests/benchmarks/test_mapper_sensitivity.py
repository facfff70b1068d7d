"""The sensitivity measurement: a forecast hears itself and its upstream neighbour, both finite."""

from benchmarks.mapper_sensitivity import sensitivity

SMALL = ["data.grid=o16", "model.hidden_grid=o8", "model.num_layers=1", "model.num_channels=16", "model.num_heads=2"]


def test_own_and_upstream_sensitivities_are_measured():
    for mapper in ("graph_transformer", "mean_mlp"):
        s = sensitivity(
            mapper, [*SMALL, "model.mapper_heads=2", "model.window_size=8"], points=4, shift_deg=6.0, seed=0
        )
        assert 0 < s["upstream"] < s["own"] and s["ratio"] == s["own"] / s["upstream"]
