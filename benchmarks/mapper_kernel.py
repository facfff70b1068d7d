"""The mappers' edge attention, fused CPU kernel against torch_geometric's message passing: one
graph-transformer mapper's forward and backward on the default run's graphs (half of them: one
rank's share when the run is split over 2), alternating the two paths call by call in one process.

    python -m benchmarks.mapper_kernel                  # encoder and decoder of the default run
    python -m benchmarks.mapper_kernel --batch 4 --rounds 40

Each line: the median of ``--rounds`` calls of each path, and their ratio; the outputs of the two
paths are checked equal first (float32 rounding).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from processor.distributed import shard_sizes
from processor.geometry import unit_vectors
from processor.grids import get_grid
from processor.host import cpu_name
from training.model.graph_transformer import GraphTransformerMapper
from training.model.graphs import knn_graph, shard_graph

# (name, source grid, destination grid, neighbours): the default run's encoder and decoder.
MAPPERS = (("encoder", "o32", "o16", 4), ("decoder", "o16", "o32", 3))


def _xyz(name: str) -> np.ndarray:
    grid = get_grid(name)
    return unit_vectors(grid.latitudes, grid.longitudes)


def time_mapper(src: str, dst: str, k: int, ranks: int, batch: int, channels: int, heads: int, rounds: int):
    """Median seconds of forward+backward of each path, rank 0's share of the graph."""
    src_xyz, dst_xyz = _xyz(src), _xyz(dst)
    dst_sizes = shard_sizes(len(dst_xyz), ranks)
    graph = shard_graph(*knn_graph(src_xyz, dst_xyz, k), shard_sizes(len(src_xyz), ranks), dst_sizes, 0)
    n_src = len(graph.lists.src_ptr) - 1
    torch.manual_seed(0)
    mapper = GraphTransformerMapper(channels, graph.edge_attr.shape[1], heads)
    x_src = torch.randn(batch, n_src, channels, requires_grad=True)
    x_dst = torch.randn(batch, dst_sizes[0], channels, requires_grad=True)
    edge_attr = graph.edge_attr.float()

    def call(fused: bool) -> torch.Tensor:
        mapper.fused_edges = fused
        out = mapper(x_src, x_dst, graph.edge_index, edge_attr, graph.lists)
        out.square().mean().backward()
        return out.detach()

    torch.testing.assert_close(call(True), call(False), rtol=1e-5, atol=1e-5)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(rounds):
        for fused in (True, False) if round_ % 2 == 0 else (False, True):
            start = time.perf_counter()
            call(fused)
            seconds[fused].append(time.perf_counter() - start)
    return statistics.median(seconds[True]), statistics.median(seconds[False]), len(graph.lists.src)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="the graph split as over this many ranks (rank 0's)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    print(
        f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); batch {args.batch}, "
        f"C = {args.channels}, {args.heads} heads, rank 0 of {args.ranks}; forward+backward, median of {args.rounds}"
    )
    print("| mapper | edges | fused kernel (ms) | torch_geometric (ms) | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name, src, dst, k in MAPPERS:
        fused, pyg, edges = time_mapper(src, dst, k, args.ranks, args.batch, args.channels, args.heads, args.rounds)
        print(
            f"| {name} ({src} -> {dst}, k = {k}) | {edges} | {fused * 1e3:.2f} | {pyg * 1e3:.2f} | {pyg / fused:.2f}x |"
        )


if __name__ == "__main__":
    main()
