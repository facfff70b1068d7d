"""Gradients right by construction: after a plain ``loss.backward()`` every rank holds the
one-rank gradients (summed over the model-parallel ranks, averaged over replicas)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import clip_grad_norm_, parallelize_gradients, shard_offsets, shard_sizes
from processor.distributed.parameter_split import gather_full, split_of

N, C = 61, 16


def _model(strategy: str) -> TransformerProcessor:
    torch.manual_seed(0)
    config = ProcessorConfig(2, C, 4, window_size=7, mlp_hidden_ratio=2, num_chunks=1, strategy=strategy)
    return TransformerProcessor(config)


def _batch(sample: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + sample)
    return torch.randn(1, N, C, generator=g), torch.randn(1, N, C, generator=g)


def _one_rank_gradients(samples: list[int]) -> dict[str, np.ndarray]:
    """The gradient of the mean over ``samples`` of ``sum(y * cotangent)``, on one rank."""
    model = _model("none")
    for sample in samples:
        x, cotangent = _batch(sample)
        ((model(x) * cotangent).sum() / len(samples)).backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters()}


def _local_loss(model, sample: int, rank: int, ranks: int, group) -> torch.Tensor:
    sizes = shard_sizes(N, ranks)
    rows = slice(shard_offsets(sizes)[rank], shard_offsets(sizes)[rank] + sizes[rank])
    x, cotangent = _batch(sample)
    return (model(x[:, rows], group=group) * cotangent[:, rows]).sum()


def plain_backward_on_group(group, strategy: str) -> dict[str, np.ndarray]:
    import torch.distributed as dist

    processor = _model(strategy)
    processor.split_parameters(group)  # shard_channels: this rank's share; the others: all
    model = parallelize_gradients(processor, mp_group=group)
    _local_loss(model, 0, dist.get_rank(group), dist.get_world_size(group), group).backward()
    return _full_gradients(processor, group)


def _full_gradients(processor, group) -> dict[str, np.ndarray]:
    return {n: gather_full(p.grad, split_of(p), group).numpy() for n, p in processor.named_parameters()}


def plain_backward_on_mesh(group, strategy: str) -> dict[str, np.ndarray]:
    """2 replicas x 2 model-parallel ranks on a ("dp", "mp") mesh; replica d trains on sample d."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "mp"))
    processor = _model(strategy)
    processor.split_parameters(mesh["mp"])
    model = parallelize_gradients(processor, mesh)
    replica, rank = divmod(dist.get_rank(), 2)
    _local_loss(model, replica, rank, 2, mesh["mp"]).backward()
    return _full_gradients(processor, mesh["mp"].get_group())


def _assert_gradients(parts: list[dict[str, np.ndarray]], expected: dict[str, np.ndarray]) -> None:
    floor = 0.1 * max(float(np.abs(g).max()) for g in expected.values())
    for r, part in enumerate(parts):
        for name, want in expected.items():
            err = float(np.abs(part[name] - want).max()) / max(float(np.abs(want).max()), floor)
            assert err <= 1e-5, f"rank {r}, {name}: relative error {err:.1e}"


@pytest.mark.parametrize(
    "strategy,ranks", [("shard_sequence", 2), ("shard_sequence", 3), ("shard_heads", 3), ("shard_channels", 3)]
)
def test_plain_backward_gives_one_rank_gradients(rank_pool, strategy, ranks):
    _assert_gradients(rank_pool.run_ok(plain_backward_on_group, ranks, strategy), _one_rank_gradients([0]))


@pytest.mark.parametrize("strategy", ["shard_sequence", "shard_heads", "shard_channels"])
def test_mesh_sums_over_mp_and_averages_over_dp(rank_pool, strategy):
    _assert_gradients(rank_pool.run_ok(plain_backward_on_mesh, 4, strategy), _one_rank_gradients([0, 1]))


def unreduced_backward(group) -> dict[str, np.ndarray]:
    import torch.distributed as dist

    model = _model("shard_sequence")
    _local_loss(model, 0, dist.get_rank(group), 2, group).backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_without_it_the_gradients_are_wrong(rank_pool):
    """The test has teeth: each rank alone holds only its own points' part."""
    with pytest.raises(AssertionError):
        _assert_gradients(rank_pool.run_ok(unreduced_backward, 2), _one_rank_gradients([0]))


def clipped_norm(group, strategy: str) -> float:
    """The whole model's gradient norm, and the clipped gradients, on a split model."""
    import torch.distributed as dist

    processor = _model(strategy)
    processor.split_parameters(group)
    model = parallelize_gradients(processor, mp_group=group)
    _local_loss(model, 0, dist.get_rank(group), dist.get_world_size(group), group).backward()
    norm = clip_grad_norm_(processor.parameters(), 0.5, mp_group=group)
    return {"norm": float(norm), "grads": _full_gradients(processor, group)}


def test_clipping_uses_the_whole_models_norm(rank_pool):
    one = _model("none")
    x, cotangent = _batch(0)
    (one(x) * cotangent).sum().backward()
    expected_norm = float(torch.nn.utils.clip_grad_norm_(one.parameters(), 0.5))
    expected = {n: p.grad.numpy() for n, p in one.named_parameters()}
    for strategy in ("shard_channels", "shard_sequence"):
        parts = rank_pool.run_ok(clipped_norm, 2, strategy)
        for part in parts:
            assert abs(part["norm"] - expected_norm) <= 1e-5 * expected_norm
        _assert_gradients([p["grads"] for p in parts], expected)


def test_clipping_a_split_model_without_its_group_is_an_error():
    model = _model("shard_channels")
    for block in model.blocks:
        model.strategy.split_parameters(block, 0, 2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="mp_group"):
        clip_grad_norm_(model.parameters(), 1.0)
