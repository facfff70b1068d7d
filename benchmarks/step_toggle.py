"""One switch's worth inside one training process: ``python -m training``'s own step, a module
attribute set to each of a few values in turn, step by step.

    python -m benchmarks.step_toggle --switch processor.matmul.backends.native_kernel \\
        --values orig "lambda: None" [--steps 300] [overrides]

Each value is a Python expression, ``orig`` bound to the attribute's own value (above: the
matmul backend's transposes by the fused kernel, then by torch). The values take turns a step
each after ``--warmup`` steps (rounds alternating their order); the report is each value's
median step (the slowest rank's) and the ratios to the first.

``--at build``: for a switch read while the run is set up (the optimiser's kind, a layout), each
value gets a trainer of its own, built with the attribute set to it, from the same seed and
data; the trainers take turns a step each, and the report adds how far apart their losses are.

Why inside one process: on a shared 2-core host a fresh process runs in one of a few speed
modes (seen: 26 or 32 ms a step of the same run, a process keeping its mode), which buries a
few percent under noise when two revisions are timed in processes of their own
(:mod:`benchmarks.step_ab`); steps in turn share the mode, the caches and the heat.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any

import torch

import training.config.schema  # noqa: F401 - registers the schema
from benchmarks.rank_trainer import new_trainer, on_run_ranks, rank_trainer
from processor.host import cpu_name
from training.config.schema import RunConfig


def steps_in_turn(cfg: RunConfig, switch: str, values: list[str], warmup: int, steps: int) -> dict[str, float]:
    """Each value's median step (seconds; the slowest rank's): ``switch`` (``module.attribute``)
    set to each value's expression in turn, a step each, after ``warmup`` steps at its own value.
    Rounds alternate their order (A B, B A, ...), so that nothing that recurs every other step
    falls on one value only."""
    module, attribute, original, settings = _resolve(switch, values)
    times: dict[str, list[float]] = {value: [] for value in values}
    try:
        with rank_trainer(cfg, warmup) as (clock, dims):
            for round_ in range(steps):
                for value in values if round_ % 2 == 0 else values[::-1]:
                    setattr(module, attribute, settings[value])
                    times[value].append(clock.step())
            medians = dims.max_over_world([statistics.median(times[value]) for value in values])
    finally:
        setattr(module, attribute, original)
    return dict(zip(values, medians))


def trainers_in_turn(cfg: RunConfig, switch: str, values: list[str], warmup: int, steps: int) -> dict[str, Any]:
    """Each value's median step (seconds; the slowest rank's) by a trainer of its own, built
    with ``switch`` set to the value, the trainers taking turns a step each (rounds alternating
    their order) after ``warmup`` steps each; and ``"loss apart"`` (``", all"``), the largest
    relative difference of a step's loss between the first value's trainer and another's over the
    first 10 steps (all steps)."""
    from training.distributed.ranks import join_ranks

    module, attribute, original, settings = _resolve(switch, values)
    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat:
        trainers, streams = {}, {}  # each trainer's own random stream, swapped in for its steps
        for value in values:
            setattr(module, attribute, settings[value])
            try:
                trainers[value] = new_trainer(cfg, dims)
                streams[value] = torch.get_rng_state()
            finally:
                setattr(module, attribute, original)
        times: dict[str, list[float]] = {value: [] for value in values}
        losses: dict[str, list[float]] = {value: [] for value in values}
        for step in range(warmup + steps):
            for value in values if step % 2 == 0 else values[::-1]:
                torch.set_rng_state(streams[value])
                start = time.perf_counter()
                loss = trainers[value].one_step(step)["train/loss"]
                if step >= warmup:
                    times[value].append(time.perf_counter() - start)
                streams[value] = torch.get_rng_state()
                losses[value].append(loss)
        for trainer in trainers.values():
            trainer.hooks.close()
        medians = dims.max_over_world([statistics.median(times[value]) for value in values])
    return {
        **dict(zip(values, medians)),
        "loss apart": _apart(losses, values, 10),
        "loss apart, all": _apart(losses, values),
    }


def _apart(losses: dict[str, list[float]], values: list[str], first_steps: int | None = None) -> float:
    """The largest relative difference of a step's loss (the first ``first_steps`` steps, or
    all) between the first value's trainer and another's."""
    mine = losses[values[0]][:first_steps]
    return max(abs(a - b) / max(abs(a), 1e-30) for value in values[1:] for a, b in zip(mine, losses[value]))


def _resolve(switch: str, values: list[str]) -> tuple[Any, str, Any, dict[str, Any]]:
    """``switch``'s module, attribute and own value, and each value's expression evaluated."""
    module_name, attribute = switch.rsplit(".", 1)
    module = importlib.import_module(module_name)
    original = getattr(module, attribute)
    settings = dict(zip(values, (eval(value, {"orig": original}) for value in values)))  # noqa: S307 - the caller's code
    return module, attribute, original, settings


def report(medians: dict[str, float], switch: str, overrides: list[str]) -> str:
    """A markdown table: each value's median step and its ratio to the first value's (and, by
    trainers in turn, how far apart their losses came)."""
    medians = dict(medians)
    apart, apart_all = medians.pop("loss apart", None), medians.pop("loss apart, all", None)
    first = next(iter(medians.values()))
    lines = [
        f"{cpu_name()}; `{switch}`, steps in turn; `{' '.join(overrides) or '(defaults)'}`",
        "",
        "| value | median step (ms) | first / this |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{value}` | {s * 1e3:.2f} | {first / s:.3f}x |" for value, s in medians.items()]
    if apart is not None:
        lines += [
            "",
            f"Losses step by step, at most apart (relative): {apart:.1e} (first 10 steps), {apart_all:.1e} (all).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", required=True, help="module.attribute to set")
    parser.add_argument("--values", nargs="+", required=True, help="Python expressions; orig: its own value")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150, help="timed steps of each value")
    parser.add_argument("--at", choices=("step", "build"), default="step", help="when the switch is read (see above)")
    parser.add_argument("overrides", nargs="*", help="python -m training's overrides")
    args = parser.parse_args(argv)
    if len(args.values) < 2 or len(set(args.values)) != len(args.values):
        parser.error("--values: two or more different expressions")
    if args.steps < 1:
        parser.error("--steps: at least 1")
    for value in args.values:  # a typo is one line here, not a traceback from every rank
        try:
            compile(value, "<value>", "eval")
        except SyntaxError as error:
            parser.error(f"--values {value!r}: {error.msg}")
    body = _RankBody(args.at, args.switch, args.values, args.warmup, args.steps)
    print(report(on_run_ranks(args.overrides, body, "step-toggle"), args.switch, args.overrides))


class _RankBody:
    """:func:`steps_in_turn` or :func:`trainers_in_turn` with its arguments bound (picklable for
    spawned ranks)."""

    def __init__(self, at: str, switch: str, values: list[str], warmup: int, steps: int) -> None:
        self.at, self.arguments = at, (switch, values, warmup, steps)

    def __call__(self, cfg: RunConfig) -> dict[str, Any]:
        return (trainers_in_turn if self.at == "build" else steps_in_turn)(cfg, *self.arguments)


if __name__ == "__main__":
    main()
