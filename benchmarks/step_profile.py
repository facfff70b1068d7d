"""Where the whole training step goes: ``python -m training``'s own step, on its own ranks,
split by part of the model and kind of work, from the PyTorch profiler.

    python -m benchmarks.step_profile                                   # the default run
    python -m benchmarks.step_profile data=era5_uk_2t --steps 60        # a real store's preset
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
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from hydra import compose, initialize_config_module
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

import training.config.schema  # noqa: F401 - registers the schema
from processor.host import cpu_name
from training import step
from training.config.schema import RunConfig
from training.launch import launcher

PARTS = ("data", "embed", "encoder", "processor", "decoder", "head", "loss+rollout", "clip", "optimiser", "metrics")
KINDS = ("matmul", "attention", "gather/scatter", "norm", "elementwise", "copy", "communication", "other", "python")
_KIND_WORDS = {
    "attention": ("scaled_dot_product", "flash_attention", "band_attention", "unfold"),
    "communication": ("c10d", "gloo", "nccl", "all_to_all", "send", "recv", "barrier", "allreduce"),
    "gather/scatter": ("scatter", "gather", "index_select", "index_add", "index", "segment", "softmax"),
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"),
    "norm": ("layer_norm",),
    "copy": ("copy_", "aten::to", "aten::cat", "aten::stack", "contiguous", "clone", "empty", "zero_", "fill_"),
}


# gridshard's own profiler ranges (processor.distributed.ranges) that stand for communication; the
# others (a strategy's phases, "halo_attention/...") hold compute, their self time Python's.
_COMMUNICATION_RANGES = (
    "agree_on",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "halo_exchange",
    "reduce_scatter",
    "ring/",
)


def kind_of(name: str) -> str:
    """The kind of work of operator or range ``name`` (one of :data:`KINDS`)."""
    lowered = name.lower()
    if lowered.startswith("gridshard/"):
        return "communication" if lowered[10:].startswith(_COMMUNICATION_RANGES) else "python"
    for kind in ("attention", "communication", "gather/scatter", "matmul", "norm", "copy"):
        if any(word in lowered for word in _KIND_WORDS[kind]):
            return kind
    return "elementwise" if lowered.startswith("aten::") else "other"


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


def _part_of(event, by_sequence: dict[int, str]) -> str | None:
    """The part of :data:`PARTS` an event belongs to, from its innermost ``part/`` range or, in
    backward, the part of the forward operator of its sequence number."""
    node = event
    while node is not None:
        if node.name.startswith("part/"):
            return node.name[5:]
        if node.name.startswith("autograd::engine::evaluate_function"):
            numbers = [node.sequence_nr, *(child.sequence_nr for child in node.cpu_children)]
            return next((by_sequence[n] for n in numbers if n in by_sequence), "loss+rollout")
        if node.name.startswith("Optimizer."):
            return "optimiser"
        node = node.cpu_parent
    return None


def forward_parts(events) -> dict[int, str]:
    """The part of each forward operator, by its sequence number (which its backward carries)."""
    by_sequence: dict[int, str] = {}
    for event in events:  # in time order: an operator's forward before its backward
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            part = _part_of(event, {})
            if part is not None:
                by_sequence.setdefault(event.sequence_nr, part)
    return by_sequence


def split_events(events, steps: int, wall_s: float) -> dict[tuple[str, str], float]:
    """Milliseconds per step of self time by (part, kind); ``("dispatch", "")`` holds the
    wall time ``wall_s`` of ``steps`` steps that no operator's self time accounts for."""
    by_sequence = forward_parts(events)
    split: dict[tuple[str, str], float] = defaultdict(float)
    for event in events:
        if event.name.startswith("ProfilerStep"):
            continue
        part = _part_of(event, by_sequence) or "metrics"  # outside the step: its metrics, the host syncs
        kind = "python" if event.name.startswith("part/") else kind_of(event.name)  # a range's self time: Python's
        split[(part, kind)] += event.self_cpu_time_total / 1e3 / steps
    split[("dispatch", "")] = max(0.0, wall_s * 1e3 / steps - sum(split.values()))
    return dict(split)


def top_operators(events, steps: int, count: int) -> list[tuple[str, str, float, int]]:
    """The ``count`` operators of most self time: (part, name, ms per step, calls per step)."""
    by_sequence = forward_parts(events)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for event in events:
        total = totals[(_part_of(event, by_sequence) or "metrics", event.name)]
        total[0] += event.self_cpu_time_total / 1e3 / steps
        total[1] += 1 / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:count]
    return [(part, name, ms, round(calls)) for (part, name), (ms, calls) in ranked]


@contextmanager
def _parts_marked(trainer) -> Iterator[None]:
    """The trainer's model parts, batch reading and metrics under profiler ranges."""
    session, model = trainer.session, trainer.session.model
    marks = [
        (session, "batches", "part/data"),
        (trainer, "step_fn", "part/loss+rollout"),
        (step, "clip_grad_norm_", "part/clip"),
    ]
    marks += [
        (getattr(model, name), "forward", f"part/{label}") for name, label in _MODULE_PARTS if getattr(model, name)
    ]
    with ExitStack() as stack:
        for obj, attr, label in marks:
            stack.enter_context(_marked(obj, attr, label))
        yield


_MODULE_PARTS = (
    ("data_embed", "embed"),
    ("hidden_embed", "embed"),
    ("data_nodes", "embed"),
    ("hidden_nodes", "embed"),
    ("encoder", "encoder"),
    ("processor", "processor"),
    ("decoder", "decoder"),
    ("head", "head"),
)


def profile_on_rank(cfg: RunConfig, warmup: int, steps: int, profiled: int, top_count: int = 0) -> dict[str, Any]:
    """Train ``warmup`` steps, time ``steps``, profile ``profiled`` on this rank (the run's
    own set-up and step); the median step, and rank 0's split."""
    from training.session import join_ranks, open_session, rollout_horizon
    from training.trainer import Trainer

    dims, heartbeat = join_ranks(cfg)
    with heartbeat:
        trainer = Trainer(open_session(cfg, dims, rollout_horizon(cfg.trainer)))
        step = trainer.start
        for _ in range(warmup):
            trainer.one_step(step)
            step += 1
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.one_step(step)
            times.append(time.perf_counter() - start)
            step += 1
        with _parts_marked(trainer), profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(profiled):
                trainer.one_step(step)
                step += 1
            wall = time.perf_counter() - start
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
    compute = sum(
        v
        for (part, kind), v in split.items()
        if kind in ("matmul", "attention", "gather/scatter") and part in ("encoder", "processor", "decoder")
    )
    lines += ["", f"the model's matmuls, attention and message passing: {compute / total:.0%} of the step"]
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
    run_dir = tempfile.mkdtemp(prefix="gridshard-step-profile-")
    with initialize_config_module(config_module="configs", version_base="1.3"):
        composed = compose("config", [f"run_dir={run_dir}", "logging.mlflow=false", *args.overrides])
    body: Callable[[RunConfig], dict[str, Any]] = _RankBody(args.warmup, args.steps, args.profiled, args.top)
    print(report(launcher.run(composed, body), args.overrides))


class _RankBody:
    """:func:`profile_on_rank` with the step counts bound (picklable for spawned ranks)."""

    def __init__(self, warmup: int, steps: int, profiled: int, top: int) -> None:
        self.counts = (warmup, steps, profiled, top)

    def __call__(self, cfg: RunConfig) -> dict[str, Any]:
        return profile_on_rank(cfg, *self.counts)


if __name__ == "__main__":
    main()
