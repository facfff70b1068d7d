"""``python -m benchmarks.mapper_kernel``: both mappers timed both ways, after checking that the
two paths agree."""

from __future__ import annotations

import pytest

from benchmarks import mapper_kernel
from processor.attention.native_build import load


@pytest.mark.skipif(load("native") is None, reason="the fused CPU kernel is not built")
def test_the_table_has_each_mapper_with_both_paths(capsys):
    mapper_kernel.main(["--rounds", "2", "--channels", "16", "--heads", "2"])
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| encoder") or line.startswith("| decoder")
    ]
    assert len(rows) == 2
    for row in rows:
        edges, fused, pyg, ratio = row.strip("| ").split(" | ")[1:]
        assert int(edges) > 0 and float(fused) > 0 and float(pyg) > 0 and ratio.endswith("x")
