"""What each of anemoi's processor settings costs: the processor's forward+backward on one rank,
with each setting against the plain processor, side by side in one process.

``python -m benchmarks.anemoi_settings`` times, interleaved round by round (so that a slow
spell of a shared machine hits every variant alike), the plain processor and the same one with
``attn_channels``, a gated MLP, rotary embeddings, ALiBi, a softcap, and ALiBi with a softcap;
it prints each variant's median step and its ratio to the plain one. Needs only torch.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from processor import TransformerProcessor
from processor.host import cpu_name

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "attn_channels = C / 2": {"attn_channels": "half"},
    "mlp_implementation = swiglu": {"mlp_implementation": "swiglu"},
    "use_rotary_embeddings": {"use_rotary_embeddings": True},
    "use_alibi_slopes": {"use_alibi_slopes": True},
    "softcap = 30": {"softcap": 30.0},
    "use_alibi_slopes + softcap = 30": {"use_alibi_slopes": True, "softcap": 30.0},
}


def build(name: str, args: argparse.Namespace) -> TransformerProcessor:
    settings = dict(VARIANTS[name])
    if settings.get("attn_channels") == "half":
        settings["attn_channels"] = args.channels // 2
    torch.manual_seed(0)
    return TransformerProcessor(
        num_layers=args.layers,
        num_channels=args.channels,
        num_heads=args.heads,
        window_size=args.window,
        num_chunks=0,
        **settings,
    )


def step(model: TransformerProcessor, x: torch.Tensor) -> float:
    """Seconds of one forward+backward."""
    start = time.perf_counter()
    model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8192)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    models = {name: build(name, args) for name in VARIANTS}
    x = torch.randn(1, args.points, args.channels, requires_grad=True)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, model in models.items():
            seconds = step(model, x)
            if round_:
                times[name].append(seconds)
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    print(
        f"processor fwd+bwd, {args.layers} layers, N = {args.points}, C = {args.channels}, H = {args.heads}, "
        f"W = {args.window}, {cpu_name()}, {torch.get_num_threads()} thread(s), "
        f"median of {args.rounds} interleaved rounds"
    )
    print("| setting | step (ms) | x plain |\n|---|---:|---:|")
    for name in VARIANTS:
        print(f"| {name} | {median[name] * 1e3:.0f} | {median[name] / median['plain']:.2f} |")


if __name__ == "__main__":
    main()
