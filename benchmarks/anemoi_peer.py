"""gridshard's processor against anemoi-models' own ``TransformerProcessor`` on the CPU, side by
side in one process: forward+backward of the same layers, the same weights and input.

``python -m benchmarks.anemoi_peer`` (in ``.venv-anemoi``, which has anemoi-models 0.19) times,
interleaved round by round so that a slow spell of a shared machine hits every variant alike
(each round in another order: what the variant before leaves in memory moves around too):

- ``anemoi``: anemoi-models as it runs on a CPU (no flash-attn): one SDPA call under its
  ``N x N`` sliding-window mask (global attention's cost, whatever the window);
- ``anemoi + banded`` / ``anemoi + native``: the same model with its attention call given one of
  gridshard's windowed kernels (``processor.attention.sliding_window_attention``; everything
  else, projections, norms, MLP and layouts, stays anemoi's);
- ``gridshard`` (``attention_path=auto``: the fused C++ kernel where built) and
  ``gridshard + banded``, gridshard's processor loaded with anemoi's weights by the converter.

It prints each variant's median step and gridshard's speed-up over each, and checks first that
every variant's output equals anemoi's (float32 round-off), so the times compare the same sums.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from processor import TransformerProcessor
from processor.attention import sliding_window_attention
from processor.attention.native import native_available
from processor.host import cpu_name
from processor.interop.anemoi import from_anemoi_state_dict, processor_kwargs_from_anemoi

Step = Callable[[], torch.Tensor]  # one forward+backward; returns the output (batch * points, C)


class GridshardAttention(nn.Module):
    """Stands in for anemoi's attention wrapper: its call, gridshard's windowed kernel."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, query, key, value, batch_size, causal=False, window_size=None, dropout_p=0.0, **_):  # noqa: ANN001
        """q, k, v ``(batch, heads, points, head_dim)`` as anemoi hands them."""
        assert not causal and dropout_p == 0.0, "the benchmark runs anemoi without causal masks or dropout"
        return sliding_window_attention(query, key, value, window_size, path=self.path)


def anemoi_settings(args: argparse.Namespace) -> dict:
    """anemoi's processor config section for these sizes (its SDPA path: flash-attn is GPU-only)."""
    return {
        "num_layers": args.layers,
        "num_channels": args.channels,
        "num_chunks": 1,
        "num_heads": args.heads,
        "mlp_hidden_ratio": 4.0,
        "window_size": args.window,
        "qk_norm": False,
        "dropout_p": 0.0,
        "attention_implementation": "scaled_dot_product_attention",
        "softcap": None,
        "use_alibi_slopes": False,
        "cpu_offload": False,
    }


def anemoi_names() -> tuple[type, type, type]:
    """anemoi-models' ``TransformerProcessor``, ``DotDict`` and ``GraphShardInfo``; without the
    package, a one-line error that says where it is installed."""
    try:
        from anemoi.models.distributed.shapes import GraphShardInfo
        from anemoi.models.layers.processor import TransformerProcessor as AnemoiProcessor
        from anemoi.utils.config import DotDict
    except ImportError as exc:
        raise SystemExit(
            f"benchmarks.anemoi_peer needs anemoi-models ({exc}): run it with .venv-anemoi/bin/python "
            "(bash scripts/setup_anemoi.sh makes it)"
        ) from None
    return AnemoiProcessor, DotDict, GraphShardInfo


def anemoi_model(settings: dict, attention_path: str | None) -> nn.Module:
    """anemoi-models' TransformerProcessor; with ``attention_path``, its attention calls gridshard's kernel."""
    anemoi_processor, dot_dict, _ = anemoi_names()
    torch.manual_seed(0)
    model = anemoi_processor(**settings, layer_kernels=dot_dict())
    if attention_path is not None:
        for module in model.modules():
            if hasattr(module, "attention") and hasattr(module, "lin_q"):  # a MultiHeadSelfAttention
                module.attention = GridshardAttention(attention_path)
    return model


def variants(args: argparse.Namespace, x: torch.Tensor) -> dict[str, Step]:
    """Each variant's step on ``x`` ``(points, C)`` (batch 1), every model with anemoi's weights."""
    graph_shard_info = anemoi_names()[2]
    settings = anemoi_settings(args)
    steps: dict[str, Step] = {}
    reference = anemoi_model(settings, None)
    for name, path in (("anemoi", None), ("anemoi + banded", "banded"), ("anemoi + native", "native")):
        if path == "native" and not native_available():
            continue
        model = reference if path is None else anemoi_model(settings, path)
        steps[name] = _step(lambda t, m=model: m(t, batch_size=1, shard_info=graph_shard_info(nodes=None)), model, x)
    for name, path in (("gridshard", "auto"), ("gridshard + banded", "banded")):
        ours = TransformerProcessor(**processor_kwargs_from_anemoi(settings), attention_path=path)
        ours.load_state_dict(from_anemoi_state_dict(reference.state_dict()))
        steps[name] = _step(lambda t, m=ours: m(t.unsqueeze(0)).squeeze(0), ours, x)
    return steps


def _step(forward: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, x: torch.Tensor) -> Step:
    def step() -> torch.Tensor:
        inputs = x.clone().requires_grad_()
        out = forward(inputs)
        out.square().mean().backward()
        model.zero_grad(set_to_none=True)
        return out.detach()

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10240, help="grid points (o96: 40320)")
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out (e.g. 'anemoi' at o96)")
    args = parser.parse_args(argv)
    x = torch.randn(args.points, args.channels, generator=torch.Generator().manual_seed(1))
    steps = {name: step for name, step in variants(args, x).items() if name not in args.skip}
    times: dict[str, list[float]] = {name: [] for name in steps}
    outputs = {}
    names = list(steps)
    for round_ in range(args.rounds + 1):  # round 0 warms up and checks the outputs
        turn = round_ % len(names)  # each round starts with another variant: none always follows anemoi's N x N
        for name in names[turn:] + names[:turn]:
            start = time.perf_counter()
            out = steps[name]()
            if round_:
                times[name].append(time.perf_counter() - start)
            else:
                outputs[name] = out
    first = next(iter(outputs.values()))
    for name, out in outputs.items():
        error = float((out - first).abs().max() / first.abs().max())
        assert error < 1e-4, f"{name}'s output differs from {next(iter(outputs))}'s by {error:.1e} (relative)"
    median = {name: statistics.median(t) for name, t in times.items()}
    ours = median.get("gridshard")
    print(
        f"processor fwd+bwd, {args.layers} layers, N = {args.points}, C = {args.channels}, H = {args.heads}, "
        f"W = {args.window}, {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), median of "
        f"{args.rounds} interleaved rounds; outputs equal to {next(iter(outputs))}'s to 1e-4"
    )
    print("| variant | step (s) | gridshard's speed-up |\n|---|---:|---:|")
    for name, seconds in median.items():
        speedup = "—" if ours is None else f"{seconds / ours:.2f}x"
        print(f"| {name} | {seconds:.2f} | {speedup} |")


if __name__ == "__main__":
    main()
