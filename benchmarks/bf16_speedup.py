"""The processor's forward+backward under bf16 autocast against fp32, on one rank of this host,
timed side by side in one process, with how far bf16's output and gradients lie from fp32's.

``OMP_NUM_THREADS=1 python -m benchmarks.bf16_speedup --grid o96 --channels 128``

The same weights and input run in both precisions, round after round, alternating (a shared
machine's speed drifts by tens of percent within minutes); the median of each is printed with
their ratio and the relative RMS of bf16's output, input gradient and weight gradients against
fp32's. #44's goal on an AMX host: bf16 at least 3x faster at o96, C = 128, H = 8, W = 512, its
output within 2e-2 relative RMS. The host (CPU model, AVX2 / AVX-512 / AVX512-BF16 / AMX) heads
the table; so does whether the attention kernel multiplied in bf16
(:func:`processor.attention.native.bf16_products_here`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.attention.native import bf16_products_here
from processor.grids import grid_points
from processor.host import cpu_name

PRECISIONS = ("fp32", "bf16")


def relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64."""
    want = want.double()
    return float((got.double() - want).norm() / want.norm())


def one_step(model: TransformerProcessor, x: torch.Tensor, cotangent: torch.Tensor, precision: str):
    """Seconds of one forward+backward in ``precision``; the output, dx and the weight gradients."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        y = model(x)
    y.backward(cotangent.to(y.dtype))
    seconds = time.perf_counter() - start
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return seconds, y.detach().float(), x.grad.detach().clone(), grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="o96")
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--num-chunks", type=int, default=0, help="activation checkpointing (0: none, as `benchmarks`)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention-path", default="auto", help="model.attention_path (auto: the dispatcher's rule)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = ProcessorConfig(
        num_layers=args.layers,
        num_channels=args.channels,
        num_heads=args.heads,
        window_size=args.window,
        attention_path=args.attention_path,
        num_chunks=args.num_chunks,
    )
    model = TransformerProcessor(config)
    n = grid_points(args.grid)
    x = torch.randn(1, n, args.channels, requires_grad=True)
    cotangent = torch.randn(1, n, args.channels)
    seconds: dict[str, list[float]] = {precision: [] for precision in PRECISIONS}
    results = {}
    for precision in PRECISIONS:  # warm-up: oneDNN's kernels, the attention probe
        one_step(model, x, cotangent, precision)
    for _ in range(args.rounds):
        for precision in PRECISIONS:
            took, *results[precision] = one_step(model, x, cotangent, precision)
            seconds[precision].append(took)
    median = {precision: statistics.median(values) for precision, values in seconds.items()}
    (y32, dx32, grads32), (y16, dx16, grads16) = results["fp32"], results["bf16"]
    weights = max(relative_rms(a, b) for a, b in zip(grads16, grads32))
    print(
        f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.grid} ({n} points), "
        f"C = {args.channels}, H = {args.heads}, W = {args.window}, {args.layers} layers, attention_path="
        f"{args.attention_path}; the kernel's bf16 products here: {bf16_products_here()}; "
        f"median of {args.rounds} alternating rounds"
    )
    print("| fp32 s/step | bf16 s/step | bf16 speed-up | output rel. RMS | dx rel. RMS | worst weight grad rel. RMS |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {median['fp32']:.3f} | {median['bf16']:.3f} | {median['fp32'] / median['bf16']:.2f}x "
        f"| {relative_rms(y16, y32):.1e} | {relative_rms(dx16, dx32):.1e} | {weights:.1e} |"
    )


if __name__ == "__main__":
    main()
