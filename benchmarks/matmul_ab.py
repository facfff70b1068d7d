"""The linear layers' two float32 GEMMs (processor/matmul: ``aten``, torch's MKL, and
``onednn``) side by side on this host: each layer shape alone, then the whole training step,
the two backends alternating in one process.

    OMP_NUM_THREADS=1 python -m benchmarks.matmul_ab --layers-only     # the layers, one thread
    python -m benchmarks.matmul_ab                                     # and the default run's step
    python -m benchmarks.matmul_ab data=zarr data.path=S               # a store's run

The layers: forward and backward of ``(rows, in) -> (rows, out)`` at the default run's and o96's
sizes, alternating rounds, the median of each. The step: the training command's overrides are
composed and launched as ``python -m training`` would be (its ranks, threads and strategy); each
rank trains ``--warmup`` steps, then ``--blocks`` blocks of ``--steps`` steps on each backend in
turn, and the median step of each backend (the slowest rank's) is reported with their ratio.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

import training.config.schema  # noqa: F401 - registers the schema
from benchmarks.rank_trainer import on_run_ranks, rank_trainer
from processor.host import cpu_name
from processor.matmul import BACKENDS, linear, set_matmul_backend
from processor.matmul.backends import large_enough_for_onednn
from processor.matmul.probe import alternating_medians
from training.config.schema import RunConfig

# (rows, in, out): the default run's processor on one of 2 ranks (800 points, C = 64: qkv, MLP)
# and on one (1,600: its attention's projection), its decoder's data points, and o96's processor
# at C = 256 (qkv, MLP in and out).
SHAPES = (
    (800, 64, 192),
    (800, 64, 256),
    (800, 256, 64),
    (1600, 64, 64),
    (2624, 64, 64),
    (40320, 256, 768),
    (40320, 1024, 256),
)


def time_layer(rows: int, features_in: int, features_out: int, rounds: int) -> dict[str, float]:
    """Median seconds of one linear's forward and backward on each backend, alternating."""
    x = torch.randn(rows, features_in, requires_grad=True)
    weight = torch.randn(features_out, features_in, requires_grad=True)
    bias = torch.randn(features_out, requires_grad=True)
    cotangent = torch.randn(rows, features_out)
    return alternating_medians(
        lambda: torch.autograd.grad(linear(x, weight, bias), (x, weight, bias), cotangent), rounds
    )


def layers_table(rounds: int, shapes: tuple[tuple[int, int, int], ...] = SHAPES) -> str:
    """The table of each layer shape ``(rows, in, out)`` on both backends, this host named."""
    lines = [
        f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s): one linear's forward+backward,"
        f" median of {rounds} alternating rounds",
        "",
        "| rows x in -> out | aten (ms) | onednn (ms) | onednn's speed-up | on oneDNN under `onednn` |",
        "|---|---:|---:|---:|---|",
    ]
    for rows, features_in, features_out in shapes:
        t = time_layer(rows, features_in, features_out, rounds)
        taken = "yes" if large_enough_for_onednn(rows * features_in * features_out) else "no: too small, torch's GEMM"
        lines.append(
            f"| {rows} x {features_in} -> {features_out} | {t['aten'] * 1e3:.3f} | {t['onednn'] * 1e3:.3f} |"
            f" {t['aten'] / t['onednn']:.2f}x | {taken} |"
        )
    return "\n".join(lines)


def steps_on_rank(cfg: RunConfig, warmup: int, steps: int, blocks: int) -> dict[str, Any]:
    """Train ``warmup`` steps, then ``blocks`` blocks of ``steps`` on each backend in turn; the
    median step of each backend, the slowest rank's."""
    times: dict[str, list[float]] = {b: [] for b in BACKENDS}
    with rank_trainer(cfg, warmup) as (clock, dims):
        for _ in range(blocks):
            for backend in BACKENDS:
                set_matmul_backend(backend)
                times[backend] += [clock.step() for _ in range(steps)]
        medians = dims.max_over_world([statistics.median(times[b]) for b in BACKENDS])
    t = cfg.trainer
    setup = f"{t.nprocs} rank(s) x {t.threads_per_rank} thread(s), strategy {cfg.strategy.name}"
    return {"setup": setup, "median_s": dict(zip(BACKENDS, medians))}


class _RankBody:
    """:func:`steps_on_rank` with the counts bound (picklable for spawned ranks)."""

    def __init__(self, warmup: int, steps: int, blocks: int) -> None:
        self.counts = (warmup, steps, blocks)

    def __call__(self, cfg: RunConfig) -> dict[str, Any]:
        return steps_on_rank(cfg, *self.counts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each layer")
    parser.add_argument("--layers-only", action="store_true", help="time the layers, not a training step")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12, help="steps a block")
    parser.add_argument("--blocks", type=int, default=8, help="blocks of each backend")
    parser.add_argument("overrides", nargs="*", help="python -m training's overrides")
    args = parser.parse_args(argv)
    print(layers_table(args.rounds))
    if args.layers_only:
        return
    result = on_run_ranks(args.overrides, _RankBody(args.warmup, args.steps, args.blocks), "matmul-ab")
    aten, onednn = (result["median_s"][b] for b in BACKENDS)
    print(
        f"\nthe training step, `{' '.join(args.overrides) or '(defaults)'}`: {result['setup']}; median of"
        f" {args.blocks} x {args.steps} steps each, alternating blocks\n\n"
        "| aten (ms) | onednn (ms) | onednn's speed-up |\n|---:|---:|---:|\n"
        f"| {aten * 1e3:.1f} | {onednn * 1e3:.1f} | {aten / onednn:.2f}x |"
    )


if __name__ == "__main__":
    main()
