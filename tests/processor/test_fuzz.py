"""Shape and size fuzzing of the sharded processor.

Every drawn case (points, ranks, window, heads, batch, uneven or empty shards, strategy) is
either exact against one rank, or a ``ValueError`` with the same message on every rank at
once: never one rank raising while the others wait in a collective. Which of the two is
predicted from the case, so a valid case that fails, or an invalid one that runs, fails too.
Cases run in float64, so that tiny, ill-conditioned shapes (a LayerNorm over two channels)
measure the sharding and not float32 round-off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.distributed import shard_sizes
from tests.processor.strategies.test_exactness import assert_close, one_rank_run, sharded_run
from tests.rank_pool import RankError


def in_float64(fn: Callable[..., Any], *args: Any) -> Any:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return fn(*args)
    finally:
        torch.set_default_dtype(previous)


def sharded_run_float64(group, case: dict) -> dict:
    return in_float64(sharded_run, group, case)


@st.composite
def cases(draw) -> tuple[int, dict]:
    ranks = draw(st.integers(2, 4))
    heads = draw(st.integers(1, 6))
    points = draw(st.integers(1, 40))
    if draw(st.booleans()):  # arbitrary contiguous shards, empty ones included
        cuts = sorted(draw(st.lists(st.integers(0, points), min_size=ranks - 1, max_size=ranks - 1)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, points])]
    else:
        sizes = shard_sizes(points, ranks)
    case = dict(
        strategy=draw(st.sampled_from(["shard_sequence", "shard_heads"])),
        points=points,
        sizes=sizes,
        pass_sizes=draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.integers(0, points + 2))),
        batch=draw(st.integers(0, 3)),
        heads=heads,
        channels=heads * draw(st.sampled_from([2, 4])),
        layers=draw(st.integers(1, 2)),
        qk_norm=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )
    return ranks, case


def _invalid(ranks: int, case: dict) -> bool:
    empty = case["batch"] == 0 or 0 in case["sizes"]
    return empty or (case["strategy"] == "shard_heads" and case["heads"] < ranks)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=cases())
def test_exact_or_the_same_value_error_on_every_rank(rank_pool, drawn):
    ranks, case = drawn
    results = rank_pool.run(sharded_run_float64, ranks, case)
    errors = [r for r in results if isinstance(r, RankError)]
    if _invalid(ranks, case):
        assert len(errors) == ranks, f"some ranks ran: {results}"
        types = {e.type for e in errors}
        assert len(types) == 1 and types <= {"ValueError", "ConfigError"}, [e.traceback for e in errors]
        assert len({e.message for e in errors}) == 1, [e.message for e in errors]
        return
    assert not errors, errors[0].traceback
    reference = in_float64(one_rank_run, case)
    assert_close(np.concatenate([r["y"] for r in results], axis=1), reference["y"], "output")
    assert_close(np.concatenate([r["dx"] for r in results], axis=1), reference["dx"], "input gradient")
    floor = 0.1 * max(float(np.abs(g).max()) for g in reference["grads"].values())
    for name, expected in reference["grads"].items():
        assert_close(results[0]["grads"][name], expected, f"summed gradient of {name}", floor)
