"""Time and peak memory of one processor forward+backward on P local ranks.

    python -m benchmarks.processor_step --points 40320 --channels 128 --heads 8 \
        --window 512 --layers 2 --ranks 2 --strategy shard_sequence
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from processor import TransformerProcessor
from processor.distributed import count_communication, shard_sizes, sum_model_parallel_gradients
from processor.distributed.local import run_local
from processor.memory import track_peak_rss


def _step(args: argparse.Namespace) -> dict:
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    group = dist.group.WORLD if ranks > 1 else None
    torch.manual_seed(0)
    model = TransformerProcessor(
        num_layers=args.layers,
        num_channels=args.channels,
        num_heads=args.heads,
        window_size=args.window,
        mlp_hidden_ratio=4,
        num_chunks=args.chunks,
        strategy=args.strategy if ranks > 1 else "none",
    )
    sizes = shard_sizes(args.points, ranks)
    x = torch.randn(args.batch, sizes[rank], args.channels, requires_grad=True)
    times, peaks, sent = [], [], 0
    for it in range(args.warmup + args.steps):
        model.zero_grad(set_to_none=True)
        x.grad = None
        with track_peak_rss() as mem, count_communication() as comm:
            t0 = time.perf_counter()
            model(x, group=group).square().mean().backward()
            sum_model_parallel_gradients(model.parameters(), group)
            elapsed = time.perf_counter() - t0
        if it >= args.warmup:
            times.append(elapsed)
            peaks.append(mem.increase)
            sent = comm.total_bytes
    return {"median_s": statistics.median(times), "peak_bytes": max(peaks), "bytes_sent": sent}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=40320)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--strategy", default="shard_sequence")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.ranks == 1:
        torch.set_num_threads(args.threads)
        results = [_step(args)]
    else:
        results = run_local(_step, args.ranks, args, threads_per_rank=args.threads)
    label = "none" if args.ranks == 1 else args.strategy
    for r, res in enumerate(results):
        print(
            f"{label:15s} P={args.ranks} rank {r}: fwd+bwd {res['median_s']:.3f} s, "
            f"peak +{res['peak_bytes'] / 2**30:.2f} GiB, sent {res['bytes_sent'] / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
