"""One benchmark point on one rank: build, warm up, time steps, count bytes and memory.

``measure(group, cfg)`` runs on every rank of the point's group (``None`` for one rank) and
returns plain Python values. Each step starts at a barrier, so the slowest rank's time is
the step's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from processor import TransformerProcessor
from processor.distributed import count_communication, shard_sizes, sum_model_parallel_gradients
from processor.grids import get_grid, grid_points
from processor.memory import track_peak_rss


def _processor(cfg: dict[str, Any], world: int) -> TransformerProcessor:
    m = cfg["model"]
    return TransformerProcessor(
        num_layers=m["num_layers"],
        num_channels=m["num_channels"],
        num_heads=m["num_heads"],
        window_size=m["window_size"],
        mlp_hidden_ratio=m["mlp_hidden_ratio"],
        num_chunks=m["num_chunks"],
        qk_norm=m["qk_norm"],
        activation=m["activation"],
        strategy=cfg["strategy"] if world > 1 else "none",
        attention_block_size=m["attention_block_size"],
    )


def _processor_step(cfg, group, rank, world, device, autocast) -> tuple[Callable[[], None], dict[str, Any]]:
    n = grid_points(cfg["grid"])
    sizes = shard_sizes(n, world)
    model = _processor(cfg, world).to(device)
    x = torch.randn(cfg["batch_size"], sizes[rank], cfg["model"]["num_channels"], device=device, requires_grad=True)
    params = list(model.parameters())

    def step() -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        with autocast:
            y = model(x, group=group)
        y.float().square().mean().backward()
        sum_model_parallel_gradients(params, group)

    return step, {"points": n, "shard_sizes": sizes}


def _train_step(cfg, group, rank, world, device, autocast) -> tuple[Callable[[], None], dict[str, Any]]:
    from training.config import ModelConfig
    from training.model import Forecaster, ShardedGrids

    hidden = get_grid(cfg["grid"])
    data = get_grid(cfg["data_grid"] or cfg["grid"])
    defaults = ModelConfig()
    grids = ShardedGrids.build(
        data.latitudes,
        data.longitudes,
        hidden,
        world,
        rank,
        defaults.encoder_neighbours,
        defaults.decoder_neighbours,
    )
    v, b = cfg["num_variables"], cfg["batch_size"]
    model = Forecaster(v, cfg["model"]["num_channels"], _processor(cfg, world)).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_data = len(data.latitudes)
    x = torch.randn(b, grids.data_layout.local_size, v, device=device)
    y = torch.randn(b, grids.data_layout.local_size, v, device=device)
    grids = _to_device(grids, device)
    params = list(model.parameters())

    def step() -> None:
        with autocast:
            pred = model(x, grids, group)
        ((pred.float() - y).pow(2).sum() / (b * n_data * v)).backward()
        sum_model_parallel_gradients(params, group)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)

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


@contextmanager
def _peak_memory(device: torch.device) -> Iterator[dict[str, int]]:
    """Peak bytes above the start of the block (``increase``) and in all (``peak``)."""
    out: dict[str, int] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield out
        torch.cuda.synchronize(device)
        out["peak"] = torch.cuda.max_memory_allocated(device)
        out["increase"] = out["peak"] - base
    else:
        with track_peak_rss() as mem:
            yield out
        out["peak"], out["increase"] = mem.peak, mem.increase


def measure(group: dist.ProcessGroup | None, cfg: dict[str, Any]) -> dict[str, Any]:
    """Time ``cfg["warmup"] + cfg["steps"]`` steps on this rank; report the timed ones."""
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    if cfg["device"] == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["precision"] == "bf16")
    torch.manual_seed(cfg["seed"])
    build = _processor_step if cfg["target"] == "processor" else _train_step
    step, info = build(cfg, group, rank, world, device, autocast)

    times: list[float] = []
    peaks: list[int] = []
    increases: list[int] = []
    sent: dict[str, int] = {}
    for i in range(cfg["warmup"] + cfg["steps"]):
        if group is not None:
            dist.barrier(group)
        with _peak_memory(device) as mem, count_communication() as comm:
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        if i >= cfg["warmup"]:
            times.append(elapsed)
            peaks.append(mem["peak"])
            increases.append(mem["increase"])
            sent = dict(comm.bytes_sent)
    return {
        **info,
        "rank": rank,
        "times_s": times,
        "peak_bytes": max(peaks),
        "peak_increase_bytes": max(increases),
        "bytes_sent": sent,
    }
