from __future__ import annotations

import pytest

from tests.training.conftest import small_overrides
from training.data import generate_rossby_haurwitz


@pytest.fixture
def one_rank_small_run(tmp_path) -> list[str]:
    """The training command's overrides of a small run on one rank of one thread (o16 data, run
    directory left to the benchmark): for the benchmarks that launch a run's own ranks."""
    store = generate_rossby_haurwitz(tmp_path / "rh_o16.zarr", "o16", steps=40, seed=3)
    overrides = [o for o in small_overrides(tmp_path / "run", store) if not o.startswith("run_dir")]
    return [*overrides, "strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "trainer.threads_per_rank=1"]
