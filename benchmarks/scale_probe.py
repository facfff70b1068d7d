"""``python -m benchmarks.scale_probe``: the largest grid whose processor forward+backward fits
in ``probe.budget_gib``, for one strategy and rank count (sweep them with ``--multirun``).

It measures peak memory at the small ``probe.fit_grids``, fits memory = a + b N (+ c N^2 for
global attention), picks the largest ``oN`` (or ``fN``) predicted to fit under
``probe.margin * budget``, then runs that grid to check it, stepping down while it does not
fit. On CPU the budget is the machine's memory shared by all ranks (the sum of the ranks'
peak resident sizes); on GPUs it is each GPU's memory (the largest rank's peak allocation).

python -m benchmarks.scale_probe --multirun strategy=shard_heads,shard_sequence ranks=2 \\
    probe.budget_gib=20 model.num_layers=4 model.num_channels=256
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig

import benchmarks.config  # noqa: F401 - registers the schema
from benchmarks.config import BenchmarkConfig, check_point, point_config, skip_reason
from benchmarks.point import machine, run_ranks
from processor.grids import grid_points
from training.config.settings import to_settings


def used_bytes(cfg: BenchmarkConfig, reports: list[dict[str, Any]]) -> int:
    """What counts against the budget: all ranks' peaks on CPU, the largest on GPUs."""
    peaks = [r["peak_bytes"] for r in reports]
    return max(peaks) if cfg.device == "cuda" else sum(peaks)


def measure_grid(cfg: BenchmarkConfig, grid: str) -> int:
    point = dataclasses.replace(cfg, grid=grid)
    used = used_bytes(point, run_ranks(point))
    print(f"  {grid:>6s} ({grid_points(grid):>8d} points): {used / 2**30:7.2f} GiB")
    return used


def largest_fitting(
    samples: dict[int, int], budget: float, family: str, step: int, global_attention: bool, below: int | None = None
) -> str:
    """The largest grid of ``family`` (fewer than ``below`` points) predicted to fit in ``budget`` bytes."""
    n = np.array(sorted(samples), dtype=float)
    used = np.array([samples[int(k)] for k in n], dtype=float)
    degree = 2 if global_attention and len(n) >= 3 else 1
    coeffs = np.polyfit(n, used, degree)
    if coeffs[-2] <= 0 and (degree == 1 or coeffs[0] <= 0):
        raise ValueError(
            f"memory did not grow with the grid over {sorted(samples)} points: choose larger probe.fit_grids"
        )
    best = None
    for order in range(step, 100_000, step):
        name = f"{family}{order}"
        points = grid_points(name)
        if np.polyval(coeffs, points) > budget or (below is not None and points >= below):
            break
        best = name
    if best is None:
        raise ValueError(f"even {family}{step} is predicted not to fit in {budget / 2**30:.2f} GiB")
    return best


def probe(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Fit the memory model on ``probe.fit_grids``, then find (and check) the largest grid that fits."""
    p = cfg.probe
    budget = p.budget_gib * 2**30
    samples = {grid_points(g): measure_grid(cfg, g) for g in p.fit_grids}
    global_attention = cfg.model.window_size is None
    grid = largest_fitting(samples, p.margin * budget, p.family, p.step, global_attention)
    verified = None
    for _ in range(p.max_tries if p.verify else 0):
        used = measure_grid(cfg, grid)
        samples[grid_points(grid)] = used
        if used <= budget:
            verified = used
            break
        grid = largest_fitting(samples, p.margin * budget, p.family, p.step, global_attention, below=grid_points(grid))
    found = verified is not None or not p.verify
    return {
        "largest_grid": grid if found else None,
        "largest_points": grid_points(grid) if found else None,
        "measured_gib": None if verified is None else verified / 2**30,
        "samples_gib": {str(k): v / 2**30 for k, v in sorted(samples.items())},
    }


@hydra.main(config_path="pkg://configs.benchmark", config_name="scale_probe", version_base=None)
def main(composed: DictConfig) -> None:
    cfg = point_config(composed)
    check_point(cfg)
    reason = skip_reason(cfg)
    if reason:
        print(f"skip {cfg.strategy} on {cfg.ranks} ranks: {reason}")
        return
    m = cfg.model
    print(
        f"scale probe: {cfg.strategy}, {cfg.ranks} ranks, {m.num_layers} layers x {m.num_channels} channels, "
        f"W = {m.window_size}, budget {cfg.probe.budget_gib} GiB"
    )
    found = probe(cfg)
    row = {
        "strategy": cfg.strategy,
        "ranks": cfg.ranks,
        "device": cfg.device,
        "model": to_settings(m),
        "budget_gib": cfg.probe.budget_gib,
        **found,
        **machine(),
    }
    root = Path(cfg.results_root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "scale_probe.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    if found["largest_grid"]:
        print(
            f"largest grid: {found['largest_grid']} ({found['largest_points']} points), "
            f"measured {found['measured_gib']:.2f} GiB of {cfg.probe.budget_gib}"
        )
    else:
        print(f"no grid verified to fit within {cfg.probe.max_tries} tries: {found['samples_gib']}")


if __name__ == "__main__":
    main()
