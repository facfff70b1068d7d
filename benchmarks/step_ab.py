"""The whole training run at an earlier revision against the working tree, as a user runs it.

``python -m benchmarks.step_ab --baseline f3c56bd [--pairs 3] [--steps 150] [--new K=V ...]
[overrides ...]`` checks ``--baseline`` out into a temporary git worktree (its attention kernel
built there, ``data/`` linked to this one's), then runs ``python -m training <overrides>`` at both
revisions, each run a fresh process in its own run directory, the two alternating (the first of
each pair swaps), ``--pairs`` times. A run's step is the median of its own ``step_time_s`` (the
loop's clock, ``metrics.jsonl``) from step ``--skip`` on. ``--new`` overrides go to the working
tree's runs only: keys the baseline does not know, or values that pin a derived setting to what
the baseline ran (the same settings on both sides are the caller's to give).

Prints a markdown table: each pair's steps, baseline / working tree, and how far the two runs'
losses of the first steps are apart (the same model and data: float32 rounding, or more where a
change altered the numbers)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from processor.host import cpu_name
from training.reporting.metrics_file import read_history

ROOT = Path(__file__).resolve().parents[1]  # the repository's working tree
LOSSES_COMPARED = 10  # the first steps' losses set side by side


@dataclass(frozen=True)
class Run:
    """One run's median step (s) and its first losses."""

    step_s: float
    losses: list[float]


def read_run(run_dir: Path, skip: int) -> Run:
    """The median ``step_time_s`` of the steps from ``skip`` on, and the first losses, from
    ``run_dir/metrics.jsonl``."""
    history = read_history(run_dir)
    steps = [metrics["step_time_s"] for step, metrics in history if step >= skip and "step_time_s" in metrics]
    if not steps:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no step from step {skip} on: give more --steps")
    losses = [metrics["train/loss"] for _, metrics in history if "train/loss" in metrics]
    return Run(statistics.median(steps), losses[:LOSSES_COMPARED])


def loss_gap(a: list[float], b: list[float]) -> float:
    """The largest relative difference between two runs' losses, step by step."""
    return max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b, strict=False)), default=0.0)


@contextmanager
def baseline_tree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary worktree, its kernel built and ``data/`` linked;
    removed (and pruned from the repository's list) after."""
    where = Path(tempfile.mkdtemp(prefix="gridshard-step-ab-")) / "tree"
    try:
        added = subprocess.run(
            ["git", "worktree", "add", "--detach", str(where), revision], cwd=ROOT, capture_output=True, text=True
        )
        if added.returncode:
            raise RuntimeError(f"--baseline {revision}: git worktree add failed: {added.stderr.strip()}")
        if (ROOT / "data").exists():
            (where / "data").symlink_to(ROOT / "data")
        built = subprocess.run([sys.executable, "-m", "processor.attention.build_kernel"], cwd=where, check=False)
        if built.returncode:
            print(f"warning: {revision}'s attention kernel did not build: its runs take the Python attention paths")
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        shutil.rmtree(where.parent, ignore_errors=True)


def train(tree: Path, run_dir: Path, overrides: list[str], skip: int) -> Run:
    """``python -m training`` run from ``tree`` into ``run_dir``; its :class:`Run`."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory left over would resume
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, "-m", "training", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} in {tree} failed:\n{done.stderr[-3000:]}")
    return read_run(run_dir, skip)


def table(pairs: list[tuple[Run, Run]]) -> str:
    """A markdown table of the pairs (baseline, working tree) and the median ratio."""
    lines = [
        "| pair | baseline (ms) | working tree (ms) | baseline / working tree | losses apart |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, (old, new) in enumerate(pairs):
        ratio = old.step_s / new.step_s
        gap = loss_gap(old.losses, new.losses)
        lines.append(f"| {i} | {old.step_s * 1e3:.1f} | {new.step_s * 1e3:.1f} | {ratio:.2f}x | {gap:.1e} |")
    median = statistics.median(old.step_s / new.step_s for old, new in pairs)
    lines.append(f"\nmedian pair: **{median:.2f}x** the baseline's steps a second")
    return "\n".join(lines)


def alternate(old_tree: Path, both: list[str], new: list[str], pairs: int, skip: int) -> list[tuple[Run, Run]]:
    """``pairs`` pairs of runs (baseline, working tree), the first of each pair swapping; the
    working tree's runs also take ``new``."""
    runs = Path(tempfile.mkdtemp(prefix="gridshard-step-ab-runs-"))
    done: list[tuple[Run, Run]] = []
    try:
        for i in range(pairs):
            pair: dict[str, Run] = {}
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                tree, overrides = (old_tree, both) if side == "old" else (ROOT, both + new)
                pair[side] = train(tree, runs / f"{side}_{i}", overrides, skip)
            done.append((pair["old"], pair["new"]))
            print(f"pair {i}: {pair['old'].step_s * 1e3:.1f} / {pair['new'].step_s * 1e3:.1f} ms", flush=True)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to run against the working tree")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150, help="trainer.steps of every run")
    parser.add_argument("--skip", type=int, default=20, help="the first steps left out of the median")
    parser.add_argument("--new", action="append", default=[], help="an override for the working tree's runs only")
    parser.add_argument("overrides", nargs="*", help="python -m training's overrides, for both revisions")
    args = parser.parse_args(argv)
    both = [*args.overrides, f"trainer.steps={args.steps}", "evaluate.at_end_of_training=false"]
    with baseline_tree(args.baseline) as old_tree:
        pairs = alternate(old_tree, both, args.new, args.pairs, args.skip)
    print(
        f"{cpu_name()}; baseline {args.baseline}; `{' '.join(args.overrides) or '(defaults)'}`"
        + (f", working tree also `{' '.join(args.new)}`" if args.new else "")
    )
    print(table(pairs))


if __name__ == "__main__":
    main()
