"""The model group's mesh: ranks laid out heads fastest, a rank's group along each axis."""

from __future__ import annotations

import itertools

import pytest

from processor.distributed.mesh import AXES, ModelDims


@pytest.mark.parametrize("dims", [ModelDims(points=4), ModelDims(points=2, heads=3), ModelDims(2, 3, 2)])
def test_each_axis_groups_the_ranks_that_differ_only_along_it(dims: ModelDims) -> None:
    for axis in AXES:
        groups = {tuple(dims.axis_members(rank, axis)) for rank in range(dims.size)}
        assert sorted(r for g in groups for r in g) == list(range(dims.size))  # a partition
        for group in groups:
            assert [dims.coordinate(r, axis) for r in group] == list(range(getattr(dims, axis)))
            for other in AXES:  # the other coordinates are the same across the group
                if other != axis:
                    assert len({dims.coordinate(r, other) for r in group}) == 1


def test_heads_vary_fastest_then_channels_then_points() -> None:
    dims = ModelDims(points=2, channels=2, heads=2)
    coordinates = [tuple(dims.coordinate(r, a) for a in AXES) for r in range(8)]
    assert coordinates == list(itertools.product(range(2), range(2), range(2)))
    assert dims.split_axes == ("points", "channels", "heads") and ModelDims(heads=4).split_axes == ("heads",)
    assert dims.describe() == "points 2 x channels 2 x heads 2"
    with pytest.raises(ValueError, match="unknown mesh axis 'dp'"):
        dims.coordinate(0, "dp")
