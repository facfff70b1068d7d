"""The ``sweep`` part: a benchmark sweep on the GPU with the benchmarks' own machinery
(``python -m benchmarks --multirun``, one subprocess, stopped at the part's budget): the
processor target (C = 1024, 16 heads, W = 512), one rank, bf16, over layer counts and grids,
cheapest first. Step time, TFLOP/s (and their share of the bf16 GEMM measured in this process)
and peak device memory per point, as a table; a point that does not fit says so; the sweep's
time-and-memory-vs-grid plot beside the report. ``--dry-run``: toy sizes on CPU."""

from __future__ import annotations

import shutil
import sys
from datetime import date
from itertools import product
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.common import (
    Context,
    PartFailed,
    device_name,
    gemm_tflops,
    log_tail,
    rate,
    require_wheels,
    run_logged,
)
from benchmarks.gpu.section import device_slug

GRIDS, LAYERS = ("o48", "o96", "n320"), (2, 4, 8)
MODEL = {"num_channels": 1024, "num_heads": 16, "window_size": 512}
OPTIONS = {"warmup": 2, "steps": 5}
DRY_GRIDS, DRY_LAYERS = ("o8", "o12"), (1,)
DRY_MODEL = {"num_channels": 32, "num_heads": 2, "window_size": 32}
DRY_OPTIONS = {"warmup": 0, "steps": 1, "logging.mlflow": "false"}  # MLflow: the train part checks it
PLOT = "time_memory_vs_grid"


def plan(ctx: Context) -> tuple[tuple[str, ...], tuple[int, ...], dict[str, int], dict[str, int]]:
    """Grids, layer counts, model and other options: the real ones on a GPU, toys on CPU."""
    if ctx.dry_run:
        return DRY_GRIDS, DRY_LAYERS, DRY_MODEL, DRY_OPTIONS
    return GRIDS, LAYERS, MODEL, OPTIONS


def command(ctx: Context, directory: Path) -> list[str]:
    """``python -m benchmarks --multirun`` over the plan, rows to ``directory/results.jsonl``."""
    grids, layers, model, options = plan(ctx)
    return [
        sys.executable, "-m", "benchmarks", "--multirun", "target=processor", f"device={ctx.device.type}",
        "precision=bf16", "strategy=none", "ranks=1", f"grid={','.join(grids)}",
        f"model.num_layers={','.join(map(str, layers))}", *(f"model.{k}={v}" for k, v in model.items()),
        *(f"{k}={v}" for k, v in options.items()), f"results_root={directory.parent}", f"hydra.sweep.dir={directory}",
    ]  # fmt: skip


def _note(row: dict[str, Any] | None, stopped: bool) -> str:
    """Why a point has no figures."""
    if row is None:
        return "not reached: the sweep was stopped at the part's budget" if stopped else "no row: see the sweep's log"
    if row.get("status") == "skipped":
        return f"skipped: {row.get('reason', '')}"
    error = str(row.get("error") or "")
    if "out of memory" in error.lower():
        return "does not fit: out of memory"
    lines = [line for line in error.splitlines() if line.strip()]
    return f"failed: {lines[-1][:160] if lines else 'no message'}"


def table(rows: list[dict[str, Any]], points: list[tuple[str, int]], gemm_bf16: float, stopped: bool) -> str:
    """A row per planned point, in plan order; the figures of those that ran."""
    lines = [
        "| grid | points | layers | ms/step | spread ms | TFLOP/s | of the bf16 GEMM | peak GiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for grid, layers in points:
        row = next((r for r in rows if r.get("grid") == grid and r.get("num_layers") == layers), None)
        if row is None or row.get("status") != "ok":
            n = row.get("points", "") if row else ""
            lines.append(f"| {grid} | {n} | {layers} | — | — | — | — | — | {_note(row, stopped)} |")
            continue
        tflops = row["processor_flop_per_s"] / 1e12
        spread = f"{row['step_time_min_s'] * 1e3:.1f}–{row['step_time_max_s'] * 1e3:.1f}"
        peak = max(row["peak_bytes_per_rank"]) / 2**30
        lines.append(
            f"| {grid} | {row['points']} | {layers} | {row['step_time_s'] * 1e3:.1f} | {spread} | {rate(tflops)} "
            f"| {tflops / gemm_bf16:.0%} | {peak:.2f} | |"
        )
    return "\n".join(lines)


def plot(ctx: Context, rows: list[dict[str, Any]]) -> list[str]:
    """The sweep's time-and-memory-vs-grid plot, beside the doc (Markdown lines linking it)."""
    if ctx.doc is None or not any(r.get("status") == "ok" for r in rows):
        return []
    from benchmarks.plots import sweep_plots

    name = f"gpu_check_{device_slug(device_name(ctx.device))}_{date.today().isoformat()}_sweep_{{plot}}.png"
    written = sweep_plots(rows, ctx.doc.parent, name=name, only=[PLOT])
    return ["", *(f"![step time and peak memory vs grid]({p.name})" for p in written)]


def sweep_part(ctx: Context) -> str:
    """The ``sweep`` part's Markdown; :class:`PartFailed` when no point gave a row."""
    require_wheels()
    from benchmarks.results import RESULTS, load_rows

    budget = ctx.budget()
    grids, layers, model, _ = plan(ctx)
    gemm = gemm_tflops(ctx.device, torch.bfloat16, 512 if ctx.dry_run else 8192)
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()  # the sweep's ranks have the GPU to themselves
    shutil.rmtree(ctx.scratch / "sweep", ignore_errors=True)  # a fresh sweep: its rows alone
    directory = ctx.scratch / "sweep" / "points"
    argv = command(ctx, directory)
    print("sweep:", " ".join(argv[1:]), flush=True)
    log = ctx.scratch / "sweep" / "sweep.log"
    code, seconds = run_logged(argv, log, budget.left())
    print(log_tail(log), flush=True)
    rows = load_rows(directory) if (directory / RESULTS).exists() else []
    if not rows:
        raise PartFailed(f"`python -m benchmarks --multirun` gave no row (exit {code}): see {log}")
    points = list(product(grids, layers))
    stopped = "stopped at the part's budget" if code is None else f"exit {code}"
    return "\n".join(
        [
            f"### Benchmark sweep on one device (processor, bf16, C = {model['num_channels']}, "
            f"{model['num_heads']} heads, W = {model['window_size']})",
            "",
            f"`python {' '.join(argv[1:-2])}` ({seconds:.0f} s, {stopped}). Forward+backward per step, median "
            f"(CUDA events on a GPU); spread: fastest–slowest step; peak GiB: "
            f"`torch.cuda.max_memory_allocated` of the point's rank on a GPU (resident memory on CPU). "
            f"bf16 GEMM in this process: {rate(gemm)} TFLOP/s.",
            "",
            table(rows, points, gemm, code is None),
            *plot(ctx, rows),
        ]
    )
