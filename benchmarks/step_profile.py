"""Where the whole training step goes: ``python -m training``'s own step, on its own ranks,
split by part of the model and kind of work, from the PyTorch profiler.

    python -m benchmarks.step_profile                                   # the default run
    python -m benchmarks.step_profile experiment=era5_uk_2t --steps 60  # a real store's tuned run
    python -m benchmarks.step_profile data=zarr data.path=S model.hidden_grid=data

The arguments after the flags are the training command's overrides: the run is composed,
checked and launched as ``python -m training`` would (its ranks, threads and strategy), then
each rank trains ``--warmup`` steps, times ``--steps`` more (the median step, as the progress bar
counts it), and profiles ``--profiled`` more. Rank 0 prints the host, the median step and
steps/s, and a table of milliseconds per step by part (data, embedding, encoder, processor,
decoder, head, loss and rollout, gradient reduction, optimiser, metrics) and kind (matmuls,
attention, gather/scatter, norms, elementwise, copies, communication, and "python": the part's
time outside any operator); "dispatch" is the step's time that neither accounts for (the loop's
Python, the autograd engine's own work).
Backward work is put in the part whose forward made it (the profiler's sequence numbers).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

import training.config.schema  # noqa: F401 - registers the schema
from benchmarks.rank_trainer import on_run_ranks, rank_trainer
from processor.host import cpu_name
from training.config.schema import RunConfig
from training.loop import step
from training.reporting.step_split import (
    KINDS,
    PARTS,
    model_compute_share,
    model_parts_marked,
    split_events,
    top_operators,
)


@contextmanager
def _marked(obj: Any, attribute: str, label: str) -> Iterator[None]:
    """``obj.attribute`` (a callable) run under the profiler range ``label`` while inside."""
    original = getattr(obj, attribute)

    def marked(*args, **kwargs):
        with record_function(label):
            return original(*args, **kwargs)

    setattr(obj, attribute, marked)
    try:
        yield
    finally:
        setattr(obj, attribute, original)


@contextmanager
def _parts_marked(trainer, compiled: bool) -> Iterator[None]:
    """The trainer's model parts, batch reading, loss and clipping under profiler ranges (a
    compiled model has no module ranges: its work is the loss and rollout's)."""
    marks = [
        (trainer.session, "batches", "part/data"),
        (trainer, "step_fn", "part/loss+rollout"),
        (step, "clip_grad_norm_", "part/clip"),
    ]
    with ExitStack() as stack:
        for obj, attr, label in marks:
            stack.enter_context(_marked(obj, attr, label))
        if not compiled:
            stack.enter_context(model_parts_marked(trainer.session.model))
        yield


def profile_on_rank(cfg: RunConfig, warmup: int, steps: int, profiled: int, top_count: int = 0) -> dict[str, Any]:
    """Train ``warmup`` steps, time ``steps``, profile ``profiled`` on this rank (the run's
    own set-up and step); the median step, and rank 0's split."""
    with rank_trainer(cfg, warmup) as (clock, dims):
        times = [clock.step() for _ in range(steps)]
        with _parts_marked(clock.trainer, cfg.trainer.compile), profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = sum(clock.step() for _ in range(profiled))
        median = dims.max_over_world([statistics.median(times)])[0]
    t = cfg.trainer
    setup = f"{t.nprocs} rank(s) x {t.threads_per_rank} thread(s), strategy {cfg.strategy.name}"
    split = split_events(prof.events(), profiled, wall)
    top = top_operators(prof.events(), profiled, top_count)
    return {"median_s": median, "split": split, "profiled_s": wall / profiled, "setup": setup, "top": top}


def report(result: dict[str, Any], overrides: list[str]) -> str:
    """The host, the step, and the split as a markdown table (ms per step, rank 0)."""
    split = result["split"]
    lines = [
        f"{cpu_name()}, torch {torch.__version__}; `{' '.join(overrides) or '(defaults)'}`: {result['setup']}",
        f"median step {result['median_s'] * 1e3:.1f} ms ({1 / result['median_s']:.1f} steps/s); "
        f"profiled {result['profiled_s'] * 1e3:.1f} ms/step (rank 0, with the profiler's overhead)",
        "",
        "| part | " + " | ".join(KINDS) + " | total | share |",
        "|---|" + "---:|" * (len(KINDS) + 2),
    ]
    total = sum(split.values())
    for part in PARTS:
        row = [split.get((part, kind), 0.0) for kind in KINDS]
        if sum(row) > 0:
            cells = " | ".join(f"{v:.2f}" for v in row)
            lines.append(f"| {part} | {cells} | {sum(row):.2f} | {sum(row) / total:.0%} |")
    dispatch = split.get(("dispatch", ""), 0.0)
    lines.append(f"| dispatch | {' | '.join('' for _ in KINDS)} | {dispatch:.2f} | {dispatch / total:.0%} |")
    share = model_compute_share(split)
    lines += ["", f"the model's matmuls, attention and message passing: {share:.0%} of the step"]
    if result["top"]:
        lines += ["", "| part | operator | ms/step | calls/step |", "|---|---|---:|---:|"]
        lines += [f"| {part} | `{name}` | {ms:.2f} | {calls} |" for part, name, ms, calls in result["top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60, help="timed steps (the median is reported)")
    parser.add_argument("--profiled", type=int, default=20)
    parser.add_argument("--top", type=int, default=0, help="also list the operators of most self time")
    parser.add_argument("overrides", nargs="*", help="python -m training's overrides")
    args = parser.parse_args(argv)
    body: Callable[[RunConfig], dict[str, Any]] = _RankBody(args.warmup, args.steps, args.profiled, args.top)
    print(report(on_run_ranks(args.overrides, body, "step-profile"), args.overrides))


class _RankBody:
    """:func:`profile_on_rank` with the step counts bound (picklable for spawned ranks)."""

    def __init__(self, warmup: int, steps: int, profiled: int, top: int) -> None:
        self.counts = (warmup, steps, profiled, top)

    def __call__(self, cfg: RunConfig) -> dict[str, Any]:
        return profile_on_rank(cfg, *self.counts)


if __name__ == "__main__":
    main()
