"""What the processor's layout agreement costs per step: agreed on every forward (the debug
switch ``GRIDSHARD_AGREE_EVERY_FORWARD=1``) against once per shape (the default), measured in
one run on the same ranks, the two modes interleaved so that drift hits both alike.

``python -m benchmarks.agreement --ranks 2 --points 256 --layers 2 --channels 32 --steps 200``

A small model on a short sequence shows the per-forward overhead best: the agreement is one
``all_gather`` and a host sync per forward, whatever the model's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import shard_sizes
from processor.distributed.consistency import AGREE_EVERY_FORWARD_ENV
from processor.runtime import run_local

MODES = {"every forward": "1", "once per shape": "0"}


def _measure(args: dict[str, Any]) -> dict[str, list[float]]:
    """Every rank: seconds per forward+backward step, per mode (``args``: the command line)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = ProcessorConfig(
        args["layers"], args["channels"], 4, window_size=args["window"], num_chunks=0, strategy=args["strategy"]
    )
    model = TransformerProcessor(config)
    x = torch.randn(1, shard_sizes(args["points"], world)[rank], args["channels"], requires_grad=True)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for step in range(args["warmup"] + args["steps"]):
        for mode, switch in MODES.items():
            os.environ[AGREE_EVERY_FORWARD_ENV] = switch
            dist.barrier()
            start = time.perf_counter()
            model(x, group=dist.group.WORLD).square().sum().backward()
            if step >= args["warmup"]:
                times[mode].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--strategy", default="shard_sequence")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = vars(parser.parse_args(argv))
    per_rank = run_local(_measure, args["ranks"], args, threads_per_rank=1)
    print(
        f"{args['ranks']} ranks (gloo, 1 thread each), {args['strategy']}, {args['points']} points, "
        f"{args['layers']} layers x {args['channels']} channels, {args['steps']} steps per mode"
    )
    medians = {}
    for mode in MODES:
        slowest = [max(r[mode][i] for r in per_rank) for i in range(args["steps"])]  # a step ends on the last rank
        medians[mode] = statistics.median(slowest)
        q1, _, q3 = statistics.quantiles(slowest, n=4)
        print(
            f"  agreement {mode:>15}: median {1e3 * medians[mode]:.3f} ms per step "
            f"(IQR {1e3 * q1:.3f}-{1e3 * q3:.3f}, fastest {1e3 * min(slowest):.3f})"
        )
    saved = medians["every forward"] - medians["once per shape"]
    print(f"  saved per step: {1e3 * saved:.3f} ms ({100 * saved / medians['every forward']:.1f}%)")


if __name__ == "__main__":
    main()
