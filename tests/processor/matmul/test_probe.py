"""``matmul=auto``'s measurement: the margin rule, and a pick measured once per host and then
read from the cache."""

from __future__ import annotations

import json

from processor.matmul.probe import MARGIN, fastest_backend, pick
from tests.processor.matmul.forced import needs_onednn


def test_onednn_is_picked_only_past_the_margin():
    assert pick({"aten": 2.0, "onednn": 1.0}) == "onednn"
    assert pick({"aten": 1.0, "onednn": 1.0 / (MARGIN * 0.99)}) == "aten"  # a tie keeps torch's GEMM
    assert pick({"aten": 1.0, "onednn": 2.0}) == "aten"
    assert pick({"aten": 1.0}) == "aten"  # a torch without oneDNN


@needs_onednn
def test_a_host_measures_once_then_reads_its_pick(tmp_path):
    cache = tmp_path / "matmul_backends.json"
    first = fastest_backend(cache)
    assert not first.cached and set(first.seconds) == {"aten", "onednn"}
    assert first.backend == pick(first.seconds)
    second = fastest_backend(cache)
    assert second.cached and second.backend == first.backend
    assert "cached" in second.describe() and first.backend in second.describe()
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["backend"] == first.backend
