"""``matmul=auto`` by measurement: time a linear layer's forward and backward on each backend
(:data:`.backends.BACKENDS`) once per host, torch version and thread count, keep the pick on disk
(beside :mod:`processor.attention.autotune`'s), and reuse it in every later run.

The call timed is a pair of linears as the model's MLPs have them, ``(rows, C) -> (rows, 4C) ->
(rows, C)`` at ``rows = 4096``, ``C = 128``: the sizes of a CPU training run's processor and
mappers. oneDNN is picked only when it is at least :data:`MARGIN` faster, so that a tie keeps
torch's own GEMM.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from processor.attention.autotune import add_choice, host_name, read_choices
from processor.host import cache_dir
from processor.matmul.backends import BACKENDS, linear, matmul_backend, set_matmul_backend

CACHE_NAME = "matmul_backends.json"
MARGIN = 1.1
ROWS, CHANNELS, WIDENING = 4096, 128, 4
ROUNDS = 7


@dataclass(frozen=True)
class BackendChoice:
    """The backend picked, each backend's median seconds for the timed call, whether read from
    the cache, and the host it holds for."""

    backend: str
    seconds: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    host: str = ""

    def describe(self) -> str:
        """One line for a run's start-up log."""
        if not self.seconds:
            return f"matmul=auto: {self.backend} (nothing to measure on {self.host})"
        times = ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in self.seconds.items())
        source = "cached" if self.cached else "probed now"
        return f"matmul=auto on {self.host}: picked {self.backend} ({source}; {times})"


def alternating_medians(call: Callable[[], object], rounds: int) -> dict[str, float]:
    """Median seconds of ``call`` on each available backend, the backends alternating round by
    round (the first round of each is a warm-up and not counted); the backend put back after."""
    available = [b for b in BACKENDS if b != "onednn" or torch.backends.mkldnn.is_available()]
    times: dict[str, list[float]] = {b: [] for b in available}
    previous = matmul_backend()
    try:
        for round_ in range(rounds + 1):
            for name in available:
                set_matmul_backend(name)
                start = time.perf_counter()
                call()
                if round_:
                    times[name].append(time.perf_counter() - start)
    finally:
        set_matmul_backend(previous)
    return {name: statistics.median(values) for name, values in times.items()}


def time_backends(rows: int = ROWS, channels: int = CHANNELS, rounds: int = ROUNDS) -> dict[str, float]:
    """Median seconds of the timed call, forward and backward through the two linears, on each
    available backend (:func:`alternating_medians`)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, channels, generator=generator, requires_grad=True)
    shapes = [(WIDENING * channels, channels), (channels, WIDENING * channels)]
    weights = [torch.randn(*s, generator=generator).div_(s[1] ** 0.5).requires_grad_() for s in shapes]
    return alternating_medians(lambda: linear(linear(x, weights[0]), weights[1]).sum().backward(), rounds)


def pick(seconds: dict[str, float]) -> str:
    """``onednn`` where it ran at least :data:`MARGIN` times faster than ``aten``, else ``aten``."""
    if "onednn" in seconds and seconds["aten"] >= MARGIN * seconds["onednn"]:
        return "onednn"
    return "aten"


def cache_key() -> str:
    """The host's kind, torch and this process's threads: what a cached pick holds for."""
    parts = [host_name(torch.device("cpu")), torch.__version__, torch.get_num_threads(), ROWS, CHANNELS]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def fastest_backend(cache_file: Path | None = None) -> BackendChoice:
    """The backend to run this host's float32 linears on, at this process's thread count: from
    ``cache_file`` (default ``matmul_backends.json`` in :func:`~processor.host.cache_dir`) when
    this host measured it, else measured now and saved."""
    cache_file = cache_dir() / CACHE_NAME if cache_file is None else cache_file
    host = host_name(torch.device("cpu"))
    if not torch.backends.mkldnn.is_available():
        return BackendChoice("aten", host=host)
    key = cache_key()
    entry = read_choices(cache_file).get(key)
    if isinstance(entry, dict) and entry.get("backend") in BACKENDS:
        return BackendChoice(entry["backend"], dict(entry.get("seconds", {})), cached=True, host=host)
    seconds = time_backends()
    choice = BackendChoice(pick(seconds), seconds, host=host)
    add_choice(
        cache_file, key, {"backend": choice.backend, "seconds": seconds, "host": host, "torch": torch.__version__}
    )
    return choice
