"""The differentiable all-to-all with uneven splits, and the explicit model-parallel gradient sum."""

from __future__ import annotations

import numpy as np
import torch

from processor.distributed import CommCounter, Transport, all_to_all, sum_model_parallel_gradients


def _splits(ranks: int) -> list[list[int]]:
    """splits[src][dst]: elements rank src sends to rank dst (uneven, some zero)."""
    return [[(src * 3 + dst * 5) % 4 for dst in range(ranks)] for src in range(ranks)]


def _payload(src: int, splits: list[list[int]]) -> torch.Tensor:
    return torch.arange(sum(splits[src]), dtype=torch.float32) + 1000 * src


def a2a_case(group) -> dict:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    splits = _splits(ranks)
    x = _payload(rank, splits).requires_grad_()
    counter = CommCounter()
    y = all_to_all(x, splits[rank], [splits[s][rank] for s in range(ranks)], group, Transport(counter))
    (y * (torch.arange(y.numel()) + 1)).sum().backward()  # counted too: backward uses the same transport
    return {"y": y.detach().numpy(), "dx": x.grad.numpy(), "bytes": counter.bytes_sent["all_to_all"]}


def test_all_to_all_uneven_forward_backward(rank_pool):
    for ranks in (2, 3, 4):
        parts = rank_pool.run_ok(a2a_case, ranks)
        splits = _splits(ranks)
        for dst, part in enumerate(parts):
            expected = []
            for src in range(ranks):
                start = sum(splits[src][:dst])
                expected.append(_payload(src, splits)[start : start + splits[src][dst]].numpy())
            np.testing.assert_array_equal(part["y"], np.concatenate(expected))
        for src, part in enumerate(parts):
            # x's chunk for dst lands in dst's output at an offset; its gradient is that position's weight.
            dx = []
            for dst in range(ranks):
                at = sum(splits[s][dst] for s in range(src))
                dx.append(np.arange(at, at + splits[src][dst], dtype=np.float32) + 1)
            np.testing.assert_array_equal(part["dx"], np.concatenate(dx))
            sent = sum(splits[src]) - splits[src][src]
            received = sum(splits[s][src] for s in range(ranks)) - splits[src][src]
            assert part["bytes"] == 4 * (sent + received)


def grad_sum_case(group) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank(group)
    layer = torch.nn.Linear(3, 2)
    layer.weight.grad = torch.full_like(layer.weight, float(rank + 1))
    # bias.grad stays None on purpose: it counts as zero.
    sum_model_parallel_gradients(layer.parameters(), group)
    return {"w": layer.weight.grad.numpy(), "b": layer.bias.grad.numpy()}


def test_gradient_sum_over_group(rank_pool):
    parts = rank_pool.run_ok(grad_sum_case, 3)
    for part in parts:
        np.testing.assert_array_equal(part["w"], np.full((2, 3), 6.0))
        np.testing.assert_array_equal(part["b"], np.zeros(2))
