"""gridshard against anemoi-models' own ``TransformerProcessor`` (skipped without the package).

Weights go through the converters both ways and through the adapter's signature; outputs,
input gradients and parameter gradients must agree to float64 round-off (1e-12 relative) and
to 1e-5 in float32, on one rank and on 2 or 3 gloo ranks with uneven shards.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

anemoi_processor = pytest.importorskip("anemoi.models.layers.processor")
from anemoi.models.distributed.shapes import GraphShardInfo  # noqa: E402
from anemoi.utils.config import DotDict  # noqa: E402

from processor import TransformerProcessor  # noqa: E402
from processor.interop.anemoi import (  # noqa: E402
    from_anemoi_state_dict,
    processor_kwargs_from_anemoi,
    to_anemoi_state_dict,
)
from processor.interop.anemoi_processor import AnemoiTransformerProcessor  # noqa: E402

BATCH, POINTS, CHANNELS = 2, 40, 32
# float32: the k_norm weight's gradient (a sum over every point) on 3 ranks reached 1.05e-5 of
# its largest value on one of this farm's two CPU kinds; round-off, not a wrong exchange (O(1)).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


# anemoi's settings that its CPU path runs: a narrower attention, each gated MLP.
WIDTHS_AND_GATES = [
    {"attn_channels": 48},
    {"attn_channels": 16, "mlp_implementation": "glu"},
    {"mlp_implementation": "swiglu"},
    {"attn_channels": 24, "mlp_implementation": "geglu"},
    {"mlp_implementation": "reglu"},
]


def settings(window: int | None, qk_norm: bool, **extra) -> dict:
    """An anemoi processor config section (flash-attn is not installed: its SDPA path)."""
    return {
        **extra,
        "num_layers": 2,
        "num_channels": CHANNELS,
        "num_chunks": 1,
        "num_heads": 4,
        "mlp_hidden_ratio": 2.0,
        "window_size": window,
        "qk_norm": qk_norm,
        "dropout_p": 0.0,
        "attention_implementation": "scaled_dot_product_attention",
        "softcap": None,
        "use_alibi_slopes": False,
        "cpu_offload": False,
    }


def anemoi_model(window: int | None, qk_norm: bool, dtype: torch.dtype, **extra) -> torch.nn.Module:
    torch.manual_seed(3)
    with warnings.catch_warnings():  # a gated MLP: "layer_kernels.Activation is ignored", as it is
        warnings.simplefilter("ignore", UserWarning)
        model = anemoi_processor.TransformerProcessor(**settings(window, qk_norm, **extra), layer_kernels=DotDict())
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm_scale = "norm" in name and name.endswith("weight")
            p.copy_(1 + 0.2 * torch.randn_like(p) if is_norm_scale else torch.randn_like(p))
            if p.ndim == 2:
                p.mul_(p.shape[1] ** -0.5)
    return model.to(dtype)


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH * POINTS, CHANNELS, generator=g, dtype=torch.float64).to(dtype)
    weights = torch.randn(BATCH * POINTS, CHANNELS, generator=g, dtype=torch.float64).to(dtype)
    return x, weights


def run_anemoi(model, x, weights) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Output, input gradient and parameter gradients (anemoi's names) of ``sum(out * weights)``."""
    model.zero_grad()
    x = x.clone().requires_grad_()
    out = model(x, batch_size=BATCH, shard_info=GraphShardInfo(nodes=None))
    (out * weights).sum().backward()
    return out.detach(), x.grad, {name: p.grad for name, p in model.named_parameters()}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def assert_close(found: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert relative(found, expected) < TOLERANCE[dtype], (what, relative(found, expected))


CONVERTED = [(3, True, {}), (3, False, {}), (25, True, {}), (None, False, {})]
CONVERTED += [(window, True, extra) for window, extra in zip((3, 25, None, 5, 9), WIDTHS_AND_GATES)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("window, qk_norm, extra", CONVERTED, ids=[str(c) for c in CONVERTED])
def test_converted_anemoi_weights_give_anemois_numbers(window, qk_norm, extra, dtype):
    theirs = anemoi_model(window, qk_norm, dtype, **extra)
    ours = TransformerProcessor(**processor_kwargs_from_anemoi(settings(window, qk_norm, **extra))).to(dtype)
    ours.load_state_dict(from_anemoi_state_dict(theirs.state_dict()))
    x, weights = inputs(dtype)
    out, grad_x, grads = run_anemoi(theirs, x, weights)

    x_ours = x.clone().view(BATCH, POINTS, CHANNELS).requires_grad_()
    out_ours = ours(x_ours)
    (out_ours * weights.view_as(out_ours)).sum().backward()
    assert_close(out_ours.detach().view_as(out), out, dtype, "output")
    assert_close(x_ours.grad.view_as(grad_x), grad_x, dtype, "input gradient")
    expected = from_anemoi_state_dict(grads)
    for name, p in ours.named_parameters():
        assert_close(p.grad, expected[name], dtype, name)


@pytest.mark.parametrize(
    "window, qk_norm, extra",
    [(3, True, {}), (None, False, {}), (4, True, {"attn_channels": 40, "mlp_implementation": "geglu"})],
)
def test_gridshard_weights_load_into_anemoi_and_agree(window, qk_norm, extra):
    ours = TransformerProcessor(**processor_kwargs_from_anemoi(settings(window, qk_norm, **extra))).double()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.3 * torch.randn_like(p))
    theirs = anemoi_model(window, qk_norm, torch.float64, **extra)
    theirs.load_state_dict(to_anemoi_state_dict(ours.state_dict()), strict=True)
    x, weights = inputs(torch.float64)
    out, _, _ = run_anemoi(theirs, x, weights)
    with torch.no_grad():
        assert_close(ours(x.view(BATCH, POINTS, CHANNELS)).view_as(out), out, torch.float64, "output")


def test_the_adapter_takes_anemois_checkpoint_and_signature_on_one_rank():
    theirs = anemoi_model(3, True, torch.float64)
    adapter = AnemoiTransformerProcessor(**settings(3, True), strategy="shard_sequence").double()
    adapter.load_state_dict(theirs.state_dict(), strict=True)  # anemoi's own names
    assert adapter.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(adapter.state_dict()[k], v) for k, v in theirs.state_dict().items())
    x, weights = inputs(torch.float64)
    out, grad_x, _ = run_anemoi(theirs, x, weights)
    x_ours = x.clone().requires_grad_()
    out_ours = adapter(x_ours, batch_size=BATCH, shard_info=GraphShardInfo(nodes=[BATCH * POINTS]))
    (out_ours * weights).sum().backward()
    assert_close(out_ours.detach(), out, torch.float64, "output")
    assert_close(x_ours.grad, grad_x, torch.float64, "input gradient")


def adapter_on_ranks(
    group, strategy: str, window: int, sizes: list[int], dtype: torch.dtype, extra: dict | None = None
) -> dict:
    """This rank's errors against anemoi on one rank: output, input and parameter gradients."""
    rank, extra = dist.get_rank(group), extra or {}
    theirs = anemoi_model(window, True, dtype, **extra)
    x, weights = inputs(dtype)
    out, grad_x, grads = run_anemoi(theirs, x, weights)
    adapter = AnemoiTransformerProcessor(**settings(window, True, **extra), strategy=strategy).to(dtype)
    adapter.load_state_dict(theirs.state_dict())

    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    local = lambda t: t.view(BATCH, POINTS, CHANNELS)[:, lo:hi].reshape(-1, CHANNELS)  # noqa: E731
    x_local = local(x).clone().requires_grad_()
    out_local = adapter(x_local, BATCH, GraphShardInfo(nodes=sizes), model_comm_group=group)
    (out_local * local(weights)).sum().backward()
    errors = {"output": relative(out_local.detach(), local(out)), "input": relative(x_local.grad, local(grad_x))}
    for p in adapter.parameters():  # each rank holds its points' share, as in anemoi
        dist.all_reduce(p.grad, group=group)
    for name, p in adapter.named_parameters():  # anemoi's names on both sides
        errors[name] = relative(p.grad, grads[name])
    return errors


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "strategy, sizes, window",
    [("shard_sequence", [13, 27], 3), ("shard_sequence", [15, 10, 15], 25), ("shard_heads", [21, 19], 25)],
)
def test_the_adapter_on_several_ranks_equals_anemoi_on_one(rank_pool, strategy, sizes, window, dtype):
    for rank_errors in rank_pool.run_ok(adapter_on_ranks, len(sizes), strategy, window, sizes, dtype):
        worst = max(rank_errors.items(), key=lambda kv: kv[1])
        assert np.isfinite(worst[1]) and worst[1] < TOLERANCE[dtype], worst


@pytest.mark.parametrize(
    "strategy, sizes, window, extra",
    [
        ("shard_sequence", [13, 27], 3, WIDTHS_AND_GATES[1]),
        ("shard_sequence", [15, 10, 15], 25, WIDTHS_AND_GATES[3]),
        ("shard_heads", [11, 17, 12], 6, WIDTHS_AND_GATES[0]),
        ("shard_heads", [21, 19], None, WIDTHS_AND_GATES[2]),
    ],
)
def test_the_adapter_with_anemois_widths_and_gates_on_several_ranks(rank_pool, strategy, sizes, window, extra):
    errors = rank_pool.run_ok(adapter_on_ranks, len(sizes), strategy, window, sizes, torch.float64, extra)
    for rank_errors in errors:
        worst = max(rank_errors.items(), key=lambda kv: kv[1])
        assert np.isfinite(worst[1]) and worst[1] < TOLERANCE[torch.float64], worst


def test_anemoi_instantiates_the_adapter_from_its_processor_config():
    """As anemoi's model builds its processor: Hydra, ``_recursive_=False``, an extra ``edge_dim``."""
    from hydra.utils import instantiate

    config = {
        "_target_": "processor.interop.anemoi_processor.AnemoiTransformerProcessor",
        "_convert_": "all",
        "strategy": "shard_heads",
        **settings(5, True),
        "layer_kernels": {"Activation": {"_target_": "torch.nn.GELU"}},
    }
    adapter = instantiate(config, _recursive_=False, edge_dim=None)
    assert adapter.num_channels == CHANNELS and adapter.processor.config.strategy == "shard_heads"
    theirs = anemoi_model(5, True, torch.float32)
    adapter.load_state_dict(theirs.state_dict())
    x, _ = inputs(torch.float32)
    with torch.no_grad():
        shards = GraphShardInfo(nodes=None)
        expected = theirs(x, batch_size=BATCH, shard_info=shards)
        assert_close(adapter(x, batch_size=BATCH, shard_info=shards), expected, torch.float32, "output")
