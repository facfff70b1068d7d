"""Where a training step's time goes, from the PyTorch profiler: each operator's self time put in
a part of the step (:data:`PARTS`) and a kind of work (:data:`KINDS`).

Forward work is put in a part by the profiler range ``part/<name>`` it runs under (the model's
parts get theirs from forward hooks, :func:`model_parts_marked`); backward work goes to the
part whose forward made it, by the profiler's sequence numbers. A run profiles one step of its
own (:class:`StepSplit`, ``logging.profile_after``) and reports the share of the step spent in
the model's matmuls, attention and message passing (:func:`model_compute_share`);
``python -m benchmarks.step_profile`` prints the whole split.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from training.config.schema import RunConfig

__all__ = [
    "KINDS",
    "PARTS",
    "StepSplit",
    "kind_of",
    "model_compute_share",
    "model_parts_marked",
    "split_events",
    "top_operators",
]

PARTS = ("data", "embed", "encoder", "processor", "decoder", "head", "loss+rollout", "clip", "optimiser", "metrics")
KINDS = ("matmul", "attention", "gather/scatter", "norm", "elementwise", "copy", "communication", "other", "python")
# The work the step is for: the model's matmuls, attention and message passing.
MODEL_COMPUTE = (("encoder", "processor", "decoder"), ("matmul", "attention", "gather/scatter"))
_KIND_WORDS = {
    "attention": ("scaled_dot_product", "flash_attention", "band_attention", "edge_attention", "unfold"),
    "communication": ("c10d", "gloo", "nccl", "all_to_all", "send", "recv", "barrier", "allreduce"),
    "gather/scatter": ("scatter", "gather", "index_select", "index_add", "index", "segment", "softmax"),
    "matmul": (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::matmul",
        "aten::linear",
        "aten::baddbmm",
        "mkldnn::_linear_pointwise",  # processor/matmul's oneDNN backend
    ),
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
# The forecaster's modules (training.model.Forecaster's attributes) and the part each one is.
MODEL_PARTS = (
    ("data_embed", "embed"),
    ("hidden_embed", "embed"),
    ("data_nodes", "embed"),
    ("hidden_nodes", "embed"),
    ("encoder", "encoder"),
    ("processor", "processor"),
    ("decoder", "decoder"),
    ("head", "head"),
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
def model_parts_marked(model: nn.Module) -> Iterator[None]:
    """Each part of ``model``'s forward (:data:`MODEL_PARTS`) under the profiler range
    ``part/<part>`` while inside, by forward hooks (removed on exit)."""
    handles = []
    for attribute, part in MODEL_PARTS:
        module = getattr(model, attribute, None)
        if module is None:
            continue
        open_ranges: list[record_function] = []

        def enter(_module, _args, label=f"part/{part}", stack=open_ranges) -> None:
            stack.append(record_function(label).__enter__())

        def leave(_module, _args, _output, stack=open_ranges) -> None:
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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


def _forward_parts(events) -> dict[int, str]:
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
    by_sequence = _forward_parts(events)
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
    by_sequence = _forward_parts(events)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for event in events:
        total = totals[(_part_of(event, by_sequence) or "metrics", event.name)]
        total[0] += event.self_cpu_time_total / 1e3 / steps
        total[1] += 1 / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:count]
    return [(part, name, ms, round(calls)) for (part, name), (ms, calls) in ranked]


def model_compute_share(split: dict[tuple[str, str], float]) -> float:
    """The share of the step (all of ``split``) in the model's matmuls, attention and message
    passing (:data:`MODEL_COMPUTE`), in [0, 1]."""
    parts, kinds = MODEL_COMPUTE
    compute = sum(ms for (part, kind), ms in split.items() if part in parts and kind in kinds)
    return compute / max(sum(split.values()), 1e-12)


class StepSplit:
    """Profiles one step of a run, the one after its first ``after`` steps (counted from where it
    started or resumed; ``None``: none), and gives ``model_compute_share``: the share of that
    step in the model's matmuls, attention and message passing, the mean over the ranks
    (``mean_over_ranks`` of a list of floats, a collective every rank calls)."""

    def __init__(
        self, model: nn.Module, start: int, after: int | None, mean_over_ranks: Callable[[list[float]], list[float]]
    ) -> None:
        self.model, self.mean_over_ranks = model, mean_over_ranks
        self.step = None if after is None else start + after

    @contextmanager
    def around(self, step: int) -> Iterator[dict[str, float]]:
        """Around ``step``'s work: yields a dict, filled with ``model_compute_share`` on exit when
        this is the profiled step (left empty otherwise)."""
        found: dict[str, float] = {}
        if step != self.step:
            yield found
            return
        with model_parts_marked(self.model), profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            yield found
            wall = time.perf_counter() - start
        share = model_compute_share(split_events(prof.events(), 1, wall))
        found["model_compute_share"] = self.mean_over_ranks([share])[0]


def profile_after(cfg: RunConfig, device: torch.device) -> int | None:
    """``logging.profile_after``, or ``None`` where the profiler's CPU split would not say what
    the step computes (a GPU's work is asynchronous; compiled code has no module ranges)."""
    if cfg.trainer.compile or device.type != "cpu":
        return None
    return cfg.logging.profile_after
