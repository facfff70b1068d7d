"""On a GPU (``pytest -m cuda``; skipped without one): the benchmarks time with CUDA events,
synchronised once, and report the device's peak memory, reset per measurement."""

from __future__ import annotations

import pytest
import torch

from benchmarks.attention_paths import timed
from processor.distributed import Transport

pytestmark = pytest.mark.cuda


def test_timed_uses_cuda_events_and_the_peak_of_the_repeats():
    device = torch.device("cuda")
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # before: not in the peak above base
    x = torch.randn(2048, 2048, device=device)
    seconds, peak = timed(lambda: (x @ x).sum(), device, repeats=4, warmup=1, above_base=True)
    assert 0 < seconds < 1.0
    assert peak is not None and 2048 * 2048 * 4 <= peak < big.numel()
    # The peak is reset per measurement: a later, smaller call does not see the earlier one's.
    y = torch.randn(64, 64, device=device)
    _, small = timed(lambda: (y @ y).sum(), device, repeats=2, warmup=0, above_base=True)
    assert small is not None and small < 2048 * 2048 * 4


def test_a_worker_step_is_read_after_one_synchronisation():
    pytest.importorskip("hydra", reason="the benchmark worker needs the carried wheels (scripts/gpu_wheels.sh)")
    from benchmarks.worker import _timed

    device = torch.device("cuda")
    x = torch.randn(4096, 4096, device=device)
    pending = [_timed(lambda transport: (x @ x).sum(), Transport(), None, device) for _ in range(3)]
    torch.cuda.synchronize(device)
    times = [t() for t in pending]
    assert all(0 < t < 1.0 for t in times)
