"""``torch.compile`` of the processor (inductor, CPU) gives eager's numbers, forward and backward."""

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from tests.processor.matmul.forced import forced_backend

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`


@pytest.mark.parametrize("matmul", ["aten", "onednn"])
def test_compiled_processor_matches_eager(matmul):
    """Under ``onednn`` eager runs oneDNN's linears, compiled code inductor's own GEMM."""
    with forced_backend(matmul):
        _compiled_matches_eager()


def _compiled_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ProcessorConfig(2, 32, 4, window_size=16, mlp_hidden_ratio=2, num_chunks=0, qk_norm=True)
    model = TransformerProcessor(config)
    x = torch.randn(1, 300, 32, requires_grad=True)  # long enough for the blocked kernel's interior and edges

    eager = model(x)
    eager.square().sum().backward()
    eager_grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    x.grad = None

    compiled = torch.compile(model)(x)
    compiled.square().sum().backward()
    compiled_grads = [x.grad] + [p.grad for p in model.parameters()]

    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def compiled_vs_eager(group, strategy: str, fullgraph: bool) -> dict:
    """This rank's output and gradients, eager and under ``torch.compile`` (AOTAutograd)."""
    import numpy as np
    import torch.distributed as dist

    from processor.distributed import shard_offsets, shard_sizes

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(0)
    config = ProcessorConfig(2, 32, 4, window_size=16, mlp_hidden_ratio=2, num_chunks=0, strategy=strategy)
    model = TransformerProcessor(config)
    model.split_parameters(group)  # shard_channels: this rank's share
    sizes = shard_sizes(203, ranks)
    x_full = torch.randn(1, 203, 32, generator=torch.Generator().manual_seed(1))
    rows = slice(shard_offsets(sizes)[rank], shard_offsets(sizes)[rank] + sizes[rank])

    def run(fn) -> list:
        model.zero_grad(set_to_none=True)
        x = x_full[:, rows].clone().requires_grad_()
        y = fn(x, group=group)
        y.square().sum().backward()
        return [y.detach().numpy(), x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]

    eager = run(model)
    compiled = run(torch.compile(model, backend="aot_eager", fullgraph=fullgraph))
    return {"max_rel": max(float(np.abs(c - e).max() / max(np.abs(e).max(), 1e-30)) for c, e in zip(compiled, eager))}


# Not one graph: the layout check's all_gather and the halo's point-to-point calls are graph
# breaks, run eagerly between the compiled pieces (the all-to-all is traced).
@pytest.mark.parametrize(
    "strategy,fullgraph", [("shard_heads", False), ("shard_sequence", False), ("shard_channels", False)]
)
def test_sharded_processor_compiles_to_eager_numbers(rank_pool, strategy, fullgraph):
    for part in rank_pool.run_ok(compiled_vs_eager, 2, strategy, fullgraph):
        assert part["max_rel"] <= 1e-5, part
