"""``model.attention_path=auto``: the launching process measures which attention path runs this
run's attention call fastest on this host (:func:`processor.attention.autotune.fastest_path`,
cached on disk per host, torch and call shape), before any rank starts, and hands every rank
the concrete path, so a model group never mixes kernels. The pick and each candidate's time are
printed and kept under ``model.attention_auto`` (logged to MLflow with the other parameters, as
``model.attention_auto.*``). ``model.attention_probe=false`` keeps the static rule of
:func:`processor.attention.dispatch.choose_path` (each call picks by device and dtype), and so
does the environment variable ``GRIDSHARD_ATTENTION_PROBE=0``, which test suites set: their
runs must not depend on which path a loaded machine happened to time fastest.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from processor.attention.autotune import PathChoice, ProbeShape, fastest_path

# Strategies whose ranks split the heads and see every point (the rest split the points).
HEAD_SPLITTING = ("shard_heads",)


def rank_probe_shape(
    model: Any, strategy: str, points: int, ranks: int, batch: int, precision: str, needs_grad: bool = True
) -> ProbeShape:
    """One rank's attention call in this run: its heads and points (with a halo of ``window``
    keys each side where the points are split), head dim, window and dtype."""
    channels = model.attn_channels or model.num_channels
    heads, window = model.num_heads, model.window_size
    if ranks > 1 and strategy in HEAD_SPLITTING:
        return ProbeShape(batch, math.ceil(heads / ranks), points, points, channels // heads, window,
                          _dtype(precision), needs_grad)  # fmt: skip
    n_q = math.ceil(points / ranks)
    halo = 0 if ranks == 1 or window is None else 2 * window
    n_k = min(points, n_q + halo)
    return ProbeShape(batch, heads, n_q, n_k, channels // heads, window, _dtype(precision), needs_grad)


def probing(model: Any) -> bool:
    """Whether ``attention_path=auto`` measures: ``model.attention_probe``, unless the
    environment says ``GRIDSHARD_ATTENTION_PROBE=0``."""
    return bool(model.attention_probe) and os.environ.get("GRIDSHARD_ATTENTION_PROBE", "1") != "0"


def _dtype(precision: str) -> str:
    return "bfloat16" if precision == "bf16" else "float32"


def resolve_attention_path(
    model: Any, strategy: str, points: int, ranks: int, batch: int, precision: str, device: str, threads: int
) -> PathChoice | None:
    """Replace ``model.attention_path`` ``auto`` by the measured pick (``model.attention_auto``
    keeps the figures) and return it; None, changing nothing, when the path is set, probing is
    off or the window is global (one path: the fused dense kernel)."""
    if model.attention_path != "auto" or not probing(model) or model.window_size is None:
        return None
    shape = rank_probe_shape(model, strategy, points, ranks, batch, precision)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # as fast as a rank runs it
    try:
        choice = fastest_path(shape, torch.device(device))
    finally:
        torch.set_num_threads(previous)
    print(choice.describe())
    model.attention_path = choice.path
    model.attention_auto = {
        "choice": choice.path,
        "host": choice.host,
        "cached": choice.cached,
        "seconds": {path: round(s, 6) for path, s in choice.seconds.items()},
    }
    return choice
