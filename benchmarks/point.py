"""Run one benchmark point in fresh processes and turn the ranks' reports into one result row."""

from __future__ import annotations

import platform
import statistics
from datetime import datetime, timezone
from typing import Any

from benchmarks.config import BenchmarkConfig
from benchmarks.worker import measure
from processor.host import cpu_name
from processor.plan import Workload, processor_bytes, processor_flops, saved_activation_bytes, segment_id_bytes
from processor.strategies import SingleRank, Strategy, resolve_strategy, strategy_options
from processor.strategies.traffic import halo_bytes


def _on_world(cfg: BenchmarkConfig) -> dict[str, Any]:
    import torch.distributed as dist

    return measure(dist.group.WORLD if dist.get_world_size() > 1 else None, cfg)


def run_ranks(cfg: BenchmarkConfig) -> list[dict[str, Any]]:
    """Measure on ``cfg.ranks`` freshly spawned local ranks (gloo on CPU, NCCL on GPUs), or
    on ranks of the torchrun world when started by torchrun (:mod:`benchmarks.torchrun_world`)."""
    from processor.runtime import run_local
    from processor.runtime.torchrun import under_torchrun

    if under_torchrun():
        from benchmarks.torchrun_world import run_on_torchrun_world

        return run_on_torchrun_world(cfg)
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    return run_local(
        _on_world,
        cfg.ranks,
        cfg,
        backend=backend,
        timeout_s=cfg.timeout_s,
        threads_per_rank=cfg.threads_per_rank,
    )


def _strategy(cfg: BenchmarkConfig) -> Strategy:
    """The strategy the point ran, with its options."""
    if cfg.ranks == 1:
        return SingleRank()
    name = cfg.strategy
    return resolve_strategy(name, {k: getattr(cfg, k) for k in strategy_options(name) if getattr(cfg, k) is not None})


def _workload(cfg: BenchmarkConfig, points: int) -> Workload:
    return Workload.of(points, cfg.model, cfg.batch_size, cfg.ranks, cfg.precision)


def analytic_bytes(cfg: BenchmarkConfig, report: dict[str, Any]) -> int:
    """What this rank should have sent in one step, as the strategy states it
    (:class:`~processor.strategies.cost.StrategyCost`)."""
    m, rank, world, sizes = cfg.model, report["rank"], cfg.ranks, report["shard_sizes"]
    strategy, work = _strategy(cfg), _workload(cfg, sum(sizes))
    total = processor_bytes(strategy, work, sizes, rank)
    if cfg.segments and world > 1:  # the ids, int64, shared once per step (no backward)
        total += segment_id_bytes(strategy, work, sizes, rank)
    if cfg.target == "train_step" and world > 1:
        # The encoder's halo of embedded data rows (bf16 under autocast) and the decoder's of
        # processor output rows (fp32: the residual stream).
        row = cfg.batch_size * m.num_channels
        data_element = 2 if cfg.precision == "bf16" else 4
        total += halo_bytes(report["data_shard_sizes"], rank, report["encoder_halo"], row * data_element)
        total += halo_bytes(report["shard_sizes"], rank, report["decoder_halo"], row * 4)
    return total


def summarise(cfg: BenchmarkConfig, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One row: step time (slowest rank per step), throughput, FLOP/s, memory and bytes per rank
    (per step, and per step over the layer count: the most loaded rank's, in bytes)."""
    m = cfg.model
    steps = [max(r["times_s"][i] for r in reports) for i in range(cfg.steps)]
    median = statistics.median(steps)
    quartiles = statistics.quantiles(steps, n=4, method="inclusive") if len(steps) > 1 else [median] * 3
    points = reports[0]["points"]
    flops = processor_flops(points, m.num_channels, m.window_size, m.num_layers, m.mlp_hidden_ratio)
    flops *= cfg.batch_size
    counted = [sum(r["bytes_sent"].values()) for r in reports]
    analytic = [analytic_bytes(cfg, r) for r in reports]
    errors = [abs(c - a) / a if a else float(c != 0) for c, a in zip(counted, analytic)]
    row = {
        "status": "ok",
        "points": points,
        "step_time_s": median,
        "step_time_min_s": min(steps),
        "step_time_p25_s": quartiles[0],
        "step_time_p75_s": quartiles[2],
        "step_time_max_s": max(steps),
        "step_times_s": steps,
        "points_per_s": cfg.batch_size * points / median,
        "processor_flop_per_step": flops,
        "processor_flop_per_s": flops / median,
        "peak_bytes_per_rank": [r["peak_bytes"] for r in reports],
        "peak_increase_bytes_per_rank": [r["peak_increase_bytes"] for r in reports],
        "peak_increase_bytes_max": max(r["peak_increase_bytes"] for r in reports),
        "bytes_sent_per_rank": counted,
        "bytes_sent_by_kind_per_rank": [r["bytes_sent"] for r in reports],
        "bytes_sent_per_step_max": max(counted),
        "bytes_sent_per_layer_max": max(counted) / m.num_layers,
        "analytic_bytes_per_rank": analytic,
        "analytic_bytes_per_step_max": max(analytic),
        "analytic_bytes_per_layer_max": max(analytic) / m.num_layers,
        "bytes_rel_error_max": max(errors),
        "gemm_flop_per_s": min(r["gemm_flop_per_s"] for r in reports),
        "nodes": len({r.get("node") for r in reports}),  # under torchrun, maybe several
    }
    # Useful FLOP/s per rank against what one rank's threads do on a big matmul.
    row["gemm_efficiency"] = row["processor_flop_per_s"] / len(reports) / row["gemm_flop_per_s"]
    if cfg.target == "processor":
        saved = saved_activation_bytes(_workload(cfg, points), _strategy(cfg))
        row["analytic_saved_bytes_per_rank"] = saved
        step_peaks = [r["step_peak_bytes"] for r in reports]
        if None not in step_peaks:
            row["step_peak_bytes_per_rank"] = step_peaks
            row["peak_over_saved"] = max(step_peaks) / saved
    if cfg.compare_local_copy and cfg.ranks > 1:
        # The same step with every exchange a local copy: what communication costs after overlap.
        local = [max(r["local_copy_times_s"][i] for r in reports) for i in range(cfg.steps)]
        row["step_time_local_copy_s"] = statistics.median(local)
        row["comm_overhead"] = median / row["step_time_local_copy_s"] - 1
    if "profile_split_s" in reports[0]:
        row["profile_split_s"] = reports[0]["profile_split_s"]
    return row


def machine() -> dict[str, Any]:
    import os

    import torch

    return {
        "host": platform.node(),
        "cpu": cpu_name(),  # model and vector extensions: figures from other CPU kinds differ
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def run_point(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Measure one point (``cfg`` is the resolved benchmark config) and return its row."""
    return summarise(cfg, run_ranks(cfg))
