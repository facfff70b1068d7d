"""Where a step's time goes, by kind of kernel, from the PyTorch profiler.

Self time of every operator is put in one bucket: ``projections`` (q, k, v and output
matmuls), ``mlp`` (matmuls touching the MLP's hidden width, and the activation),
``attention`` (the fused attention kernels and the band views' backward), ``norms``,
``communication`` (collectives and point-to-point, including waiting for peers: the
self time of the ``gridshard/`` ranges of :mod:`processor.distributed.ranges`), and
``other`` (copies, fills, adds, the optimiser, the graph mappers).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from processor.config import mlp_hidden_channels

_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn::_linear_pointwise")


def bucket(name: str, shapes: list[list[int]], mlp_hidden: int) -> str:
    lowered = name.lower()
    attention = ("scaled_dot_product", "flash_attention", "unfold", "band_attention")  # the last: the C++ kernel
    if any(k in lowered for k in attention):
        return "attention"
    if lowered.startswith("gridshard/"):  # processor.distributed.ranges: waiting for peers included
        return "communication"
    if any(k in lowered for k in ("c10d", "gloo", "nccl", "all_to_all", "send", "recv", "barrier", "allreduce")):
        return "communication"
    if "layer_norm" in lowered:
        return "norms"
    if "gelu" in lowered or "silu" in lowered or "relu" in lowered or "tanh" in lowered:
        return "mlp"
    if name in _MATMULS:
        return "mlp" if any(mlp_hidden in s for s in shapes) else "projections"
    return "other"


def profile_split(step: Callable[[], None], group, device: torch.device, model: Any) -> dict[str, float]:
    """Seconds of self time per bucket in one profiled ``step`` on this rank, for the processor of
    the ``model`` section (a :class:`benchmarks.config.BenchModelConfig`)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if group is not None:
        dist.barrier(group)
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    hidden = mlp_hidden_channels(model.num_channels, model.mlp_hidden_ratio)
    split: dict[str, float] = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        seconds = (event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total) / 1e6
        split[bucket(event.key, [list(s) for s in event.input_shapes or []], hidden)] += seconds
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))
