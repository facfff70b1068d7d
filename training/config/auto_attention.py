"""``model.attention_path=auto``: the launching process measures which attention path runs this
run's attention call fastest on this host (:func:`processor.attention.autotune.fastest_path`,
cached on disk per host, torch, threads and call shape), before any rank starts, and hands
every rank the concrete path, so a model group never mixes kernels. The pick and each
candidate's time are printed and kept under ``model.attention_auto`` (logged to MLflow with the
other parameters, as ``model.attention_auto.*``). ``model.attention_probe=false`` keeps the
static rule of :func:`processor.attention.dispatch.choose_path` (each call picks by device and
dtype), and so does the environment variable ``GRIDSHARD_ATTENTION_PROBE=0``, which test suites
set: their runs must not depend on which path a loaded machine happened to time fastest.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from processor.attention.autotune import PathChoice, ProbeShape, fastest_path
from processor.host import torch_threads
from processor.strategies import Strategy
from training.config.schema import RunConfig, run_processor_config


def rank_probe_shape(
    model: Any, strategy: Strategy, points: int, ranks: int, batch: int, precision: str, needs_grad: bool = True
) -> ProbeShape:
    """One rank's attention call in this run, as the strategy lays the ranks out
    (:meth:`~processor.strategies.Strategy.degrees`): its share of the heads (split by the heads
    and channels axes), its block of points with a halo of ``window`` keys each side where the
    points are split (every point's key for a global window), the head dim, window and dtype."""
    dims = strategy.degrees(model.num_heads, ranks)
    channels = model.attn_channels or model.num_channels
    window = model.window_size
    n_q = math.ceil(points / dims.points)
    halo = 0 if dims.points == 1 else points if window is None else 2 * window  # global: every key
    heads = math.ceil(model.num_heads / (dims.heads * dims.channels))
    dtype = "bfloat16" if precision == "bf16" else "float32"
    n_k = min(points, n_q + halo)
    return ProbeShape(batch, heads, n_q, n_k, channels // model.num_heads, window, dtype, needs_grad)


def wants_probe(model: Any) -> bool:
    """Whether this model's attention path is to be measured: ``auto``, ``model.attention_probe``
    and plain attention (no attention dropout, softcap or ALiBi: the probe times plain calls, and
    the paths it picks from take none of them), unless the environment says
    ``GRIDSHARD_ATTENTION_PROBE=0``. A global window is measured too (on CPU, the native kernel
    over every key against the fused dense call)."""
    probing = bool(model.attention_probe) and os.environ.get("GRIDSHARD_ATTENTION_PROBE", "1") != "0"
    plain = model.dropout_p == 0 and model.softcap is None and not model.use_alibi_slopes
    return model.attention_path == "auto" and probing and plain


def resolve_attention_path(model: Any, shape: ProbeShape, device: str, threads: int) -> PathChoice | None:
    """Replace ``model.attention_path`` ``auto`` by the path measured fastest for ``shape`` on
    ``threads`` threads (``model.attention_auto`` keeps the figures) and return it; None,
    changing nothing, where :func:`wants_probe` says no or only one path could run the call
    (``auto``'s rule picks that one)."""
    if not wants_probe(model):
        return None
    with torch_threads(threads):  # as fast as a rank runs it
        choice = fastest_path(shape, torch.device(device))
    print(choice.describe())
    if not choice.seconds:
        return None
    model.attention_path = choice.path
    model.attention_auto = {
        "choice": choice.path,
        "host": choice.host,
        "cached": choice.cached,
        "seconds": {path: round(s, 6) for path, s in choice.seconds.items()},
    }
    return choice


def resolve_run_attention(cfg: RunConfig, hidden_points: int, training: bool) -> PathChoice | None:
    """:func:`resolve_attention_path` for a training run (``training``: forward and backward) or
    an evaluation (forward only) on ``hidden_points`` points."""
    t = cfg.trainer
    if not wants_probe(cfg.model):
        return None
    strategy = run_processor_config(cfg).strategy
    shape = rank_probe_shape(cfg.model, strategy, hidden_points, t.ranks_per_model, t.batch_size, t.precision, training)
    return resolve_attention_path(cfg.model, shape, t.device, t.threads_per_rank)
