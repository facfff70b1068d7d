"""Check an install: the processor on 2 local ranks equals the processor on one.

    python -m processor.demo [--strategy shard_heads] [--grid o48] [--ranks 2]

Runs forward+backward of a small processor on the points of a real grid, split over local
gloo ranks, and prints the largest difference from the one-rank result.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import CommCounter, Transport, parallelize_gradients, shard_offsets, shard_sizes
from processor.grids import get_grid
from processor.runtime import run_local

MODEL = dict(num_layers=2, num_channels=64, num_heads=8, window_size=256, mlp_hidden_ratio=2, num_chunks=1)


def _inputs(points: int) -> torch.Tensor:
    return torch.randn(1, points, MODEL["num_channels"], generator=torch.Generator().manual_seed(1))


def _run(strategy: str, points: int) -> dict:
    group = dist.group.WORLD if dist.is_initialized() else None
    ranks, rank = (dist.get_world_size(), dist.get_rank()) if group else (1, 0)
    torch.manual_seed(0)
    model = TransformerProcessor(ProcessorConfig(**MODEL, strategy=strategy))
    if group is not None:
        model = parallelize_gradients(model, mp_group=group)  # backward sums the gradients over the ranks
    sizes = shard_sizes(points, ranks)
    start = shard_offsets(sizes)[rank]
    x = _inputs(points)[:, start : start + sizes[rank]].clone().requires_grad_()
    t0 = time.perf_counter()
    counter = CommCounter()
    y = model(x, group=group, transport=Transport(counter))
    # Each rank adds its points to the global mean; summed over ranks it is the one-rank loss.
    y.square().sum().div(points * MODEL["num_channels"]).backward()
    return {
        "seconds": time.perf_counter() - t0,
        "y": y.detach().numpy(),
        "grad": np.concatenate([p.grad.numpy().ravel() for p in model.parameters()]),
        "bytes": counter.total_bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="shard_sequence", choices=["shard_sequence", "shard_heads"])
    parser.add_argument("--grid", default="o48")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args(argv)
    points = get_grid(args.grid).n_points
    print(f"{args.grid}: {points} points, model {MODEL}")
    torch.set_num_threads(max(1, torch.get_num_threads() // args.ranks))
    one = _run("none", points)
    parts = run_local(_run, args.ranks, args.strategy, points, threads_per_rank=torch.get_num_threads())
    y = np.concatenate([p["y"] for p in parts], axis=1)
    err_y = np.abs(y - one["y"]).max() / np.abs(one["y"]).max()
    err_g = np.abs(parts[0]["grad"] - one["grad"]).max() / np.abs(one["grad"]).max()
    print(f"1 rank:  fwd+bwd {one['seconds']:.2f} s")
    print(
        f"{args.ranks} ranks ({args.strategy}): fwd+bwd {max(p['seconds'] for p in parts):.2f} s, "
        f"{parts[0]['bytes'] / 2**20:.2f} MiB sent by rank 0"
    )
    print(f"relative difference from one rank: output {err_y:.1e}, parameter gradients {err_g:.1e}")
    if max(err_y, err_g) > 1e-5:
        raise SystemExit("FAILED: the sharded processor differs from one rank")
    print("OK: sharded and one-rank results agree")


if __name__ == "__main__":
    main()
