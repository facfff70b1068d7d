"""One benchmark point on one rank: build, warm up, time steps, count bytes and memory.

``measure(group, cfg)`` runs on every rank of the point's group (``None`` for one rank) with the
point's :class:`~benchmarks.config.BenchmarkConfig` and returns plain Python values. Each step
starts at a barrier, so the slowest rank's time is the step's time. On CUDA a step is timed
with CUDA events (the device synchronised once, after the timed steps) and memory is the
device's (``torch.cuda.max_memory_allocated``, reset when the point starts and for the one-step
peak); on CPU, wall clock and resident memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.config import BenchmarkConfig, strategy_options
from benchmarks.gemm_rate import gemm_flop_rate
from benchmarks.local_copy import LocalCopyTransport
from processor import TransformerProcessor
from processor.distributed import CommCounter, Transport, parallelize_gradients, shard_sizes
from processor.grids import get_grid, grid_points
from processor.matmul import set_matmul_backend
from processor.runtime import current_rss, peak_rss, set_freed_memory_policy
from processor.runtime.placement import this_node
from training.config.schema import processor_config

# A step on this rank, given the transport its communication goes through.
Step = Callable[[Transport], None]


def _processor(cfg: BenchmarkConfig, world: int, group: dist.ProcessGroup | None) -> TransformerProcessor:
    """The processor with this rank's share of the parameters (``shard_channels``) or all of them."""
    if world == 1:
        model = TransformerProcessor(processor_config(cfg.model, "none"))
    else:
        model = TransformerProcessor(processor_config(cfg.model, cfg.strategy, **strategy_options(cfg)))
    model.split_parameters(group)
    return model


def _parallelize(model: torch.nn.Module, group: dist.ProcessGroup | None) -> torch.nn.Module:
    """As training does: backward sums the parameter gradients over the group."""
    return model if group is None else parallelize_gradients(model, mp_group=group)


def _processor_step(cfg: BenchmarkConfig, group, rank, world, device, autocast) -> tuple[Step, dict[str, Any]]:
    n = grid_points(cfg.grid)
    sizes = shard_sizes(n, world)
    processor = _processor(cfg, world, group).to(device)
    model_group = processor.build_groups(group)  # shard_hybrid's sub-groups; the group for the others
    model = _parallelize(processor, group)
    x = torch.randn(cfg.batch_size, sizes[rank], cfg.model.num_channels, device=device, requires_grad=True)
    # The gradient the decoder would send back: a fixed tensor, so no loss temporaries count.
    cotangent = torch.randn_like(x)
    ids = _segment_ids(n, cfg.segments, sizes, rank, device)

    def step(transport: Transport) -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        with autocast:
            y = model(x, group=model_group, transport=transport, segment_ids=ids)
        y.backward(cotangent.to(y.dtype))

    return step, {"points": n, "shard_sizes": sizes}


def _segment_ids(n: int, segments: int, sizes: list[int], rank: int, device) -> torch.Tensor | None:
    """This rank's ids of ``segments`` equal runs packed along the ``n`` points (None for 0)."""
    if segments == 0:
        return None
    start = sum(sizes[:rank])
    points = torch.arange(start, start + sizes[rank], device=device)
    return points * segments // n


def _train_step(cfg: BenchmarkConfig, group, rank, world, device, autocast) -> tuple[Step, dict[str, Any]]:
    from training.config.schema import ModelConfig, TrainerConfig
    from training.launch.store_settings import GLOBAL_LR
    from training.loop.step import TrainStep, build_optimiser
    from training.model import Forecaster, ShardedGrids

    hidden = get_grid(cfg.grid)
    data = get_grid(cfg.data_grid or cfg.grid)
    defaults = ModelConfig()  # the training run's graphs and mappers (its neighbours, its mapper kind)
    grids = ShardedGrids.build(
        data.latitudes,
        data.longitudes,
        hidden,
        world,
        rank,
        defaults.encoder_neighbours,
        defaults.decoder_neighbours,
        defaults.mapper,
    )
    v, b = cfg.num_variables, cfg.batch_size
    processor = _processor(cfg, world, group)
    model = Forecaster(v, cfg.model.num_channels, processor, defaults.mapper, defaults.mapper_heads).to(device)
    model_group = model.processor.build_groups(group)
    trainer = TrainerConfig(lr=GLOBAL_LR)  # the training run's optimiser and clipping (global data's rate)
    optimiser, schedule = build_optimiser(model, trainer)
    n_data = len(data.latitudes)
    parallel = _parallelize(model, group)
    train_step = TrainStep(parallel, optimiser, schedule, trainer.grad_clip, autocast, b * n_data * v)
    x = torch.randn(b, grids.data_layout.local_size, v, device=device)
    y = torch.randn(b, grids.data_layout.local_size, v, device=device)
    grids = _to_device(grids, device)

    def step(transport: Transport) -> None:
        train_step(x, y, grids, model_group, transport)

    info = {
        "points": len(hidden.latitudes),
        "shard_sizes": list(grids.hidden_layout.sizes),
        "data_points": n_data,
        "data_shard_sizes": list(grids.data_layout.sizes),
        "encoder_halo": grids.encoder.halo,
        "decoder_halo": grids.decoder.halo,
    }
    return step, info


def _to_device(grids, device: torch.device):
    """The grids' tensors (features, graph slices) on ``device``."""
    from dataclasses import fields, replace

    def move(obj):
        if isinstance(obj, torch.Tensor):
            return obj.to(device)
        if hasattr(obj, "__dataclass_fields__"):
            return replace(obj, **{f.name: move(getattr(obj, f.name)) for f in fields(obj) if f.init})
        return obj

    return move(grids)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Memory:
    """Peak memory of the whole point above the process before the model was built."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
        else:
            # A torchrun rank measures point after point: the high-water mark starts here.
            _reset_peak_rss()
            self.base = current_rss()

    def peak(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return peak_rss()

    def step_peak(self, step: Callable[[], None]) -> int | None:
        """Peak of one more ``step`` above the memory just before it: the activations, their
        gradients and temporaries, with the model and inputs already in place. None on CPU when
        freed memory is retained (the resident size then never falls between steps)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            step()
            return torch.cuda.max_memory_allocated(self.device) - before
        if not _reset_peak_rss():
            return None
        before = current_rss()
        step()
        return peak_rss() - before


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current size; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _timed(step: Step, transport: Transport, group, device: torch.device) -> Callable[[], float]:
    """Run one step after a barrier; returns its time in seconds, to be read once the device
    is synchronised. On CUDA: CUDA events around the step, no host synchronisation here (the
    caller synchronises once after all the steps); on CPU: wall clock."""
    if group is not None:
        dist.barrier(group)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(transport)
        end.record()
        return lambda: start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    step(transport)
    seconds = time.perf_counter() - t0
    return lambda: seconds


def measure(group: dist.ProcessGroup | None, cfg: BenchmarkConfig) -> dict[str, Any]:
    """Time ``cfg.warmup + cfg.steps`` steps on this rank; report the timed ones."""
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    if cfg.device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    if device.type == "cpu":
        set_freed_memory_policy(cfg.retain_freed_memory)
        set_matmul_backend(cfg.matmul)
    memory = _Memory(device)
    torch.manual_seed(cfg.seed)
    build = _processor_step if cfg.target == "processor" else _train_step
    step, info = build(cfg, group, rank, world, device, autocast)

    pending: list[Callable[[], float]] = []
    local_copy_pending: list[Callable[[], float]] = []
    sent: dict[str, int] = {}
    for i in range(cfg.warmup + cfg.steps):
        counter = CommCounter()
        elapsed = _timed(step, Transport(counter), group, device)
        if cfg.compare_local_copy:
            local_copy = _timed(step, LocalCopyTransport(), group, device)
        if i >= cfg.warmup:
            pending.append(elapsed)
            sent = dict(counter.bytes_sent)
            if cfg.compare_local_copy:
                local_copy_pending.append(local_copy)
    _sync(device)  # once: the CUDA events of every step are then readable
    times, local_copy_times = [t() for t in pending], [t() for t in local_copy_pending]
    peak = memory.peak()
    retained = device.type == "cpu" and cfg.retain_freed_memory
    step_peak = None if retained else memory.step_peak(lambda: step(Transport()))
    report = {
        **info,
        "rank": rank,
        "times_s": times,
        "local_copy_times_s": local_copy_times,
        "peak_bytes": peak,
        "peak_increase_bytes": peak - memory.base,
        "step_peak_bytes": step_peak,
        "bytes_sent": sent,
        "gemm_flop_per_s": gemm_flop_rate(device, cfg.gemm_size),
        "node": this_node(),
    }
    if cfg.profile:
        from benchmarks.profile_split import profile_split

        split = profile_split(lambda: step(Transport()), group, device, cfg.model)
        if rank == 0:
            report["profile_split_s"] = split
    return report
