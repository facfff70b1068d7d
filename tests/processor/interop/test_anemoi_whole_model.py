"""anemoi's whole ``AnemoiModelEncProcDec`` with gridshard's adapter as its processor, chosen by
config alone, against the same model with anemoi's own processor and the same weights
(skipped without anemoi-models): outputs and every parameter's gradient agree to float64
round-off, on one rank and inside anemoi's model-comm group of 2 gloo ranks."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("anemoi.models.models.encoder_processor_decoder")
from anemoi.models.models.encoder_processor_decoder import AnemoiModelEncProcDec  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch_geometric.data import HeteroData  # noqa: E402

from processor.interop.anemoi_processor import AnemoiTransformerProcessor  # noqa: E402

GRID, HIDDEN, VARIABLES, CHANNELS = 30, 22, 3, 16
ADAPTER = "processor.interop.anemoi_processor.AnemoiTransformerProcessor"
# Relative max errors. The mappers' key projections get gradients that are sums of terms which
# nearly cancel (softmax's gradient sums to zero over the keys): the processor's round-off
# reaches them amplified, 7.5e-13 at worst measured (the processor's own gradients: 9e-14).
TOLERANCE, MAPPER_TOLERANCE = 1e-12, 1e-11
_KERNELS = {"Linear": {"_target_": "torch.nn.Linear"}, "LayerNorm": {"_target_": "torch.nn.LayerNorm"}}


class _Indices(SimpleNamespace):
    def __len__(self) -> int:
        return len(self.full)


def _data_indices() -> dict:
    """One dataset whose variables are all prognostic: its model and data indices."""
    idx, names = list(range(VARIABLES)), {f"v{i}": i for i in range(VARIABLES)}
    return {
        "data": SimpleNamespace(
            model=SimpleNamespace(
                input=_Indices(prognostic=idx, forcing=[], full=idx, name_to_index=names),
                output=_Indices(prognostic=idx, diagnostic=[], full=idx, name_to_index=names),
                _forcing=[],
            ),
            data=SimpleNamespace(
                input=SimpleNamespace(full=idx, name_to_index=names),
                output=SimpleNamespace(full=idx, name_to_index=names),
            ),
            name_to_index=names,
        )
    }


def _graph() -> HeteroData:
    """Data and hidden nodes with (lat, lon)-like attributes; the transformer mappers need no edges."""
    g = torch.Generator().manual_seed(0)
    graph = HeteroData()
    for name, nodes in (("data", GRID), ("hidden", HIDDEN)):
        graph[name].x = torch.rand(nodes, 2, generator=g, dtype=torch.float64)
        graph[name].num_nodes = nodes
    return graph


def _mapper(kind: str) -> dict:
    return {
        "_target_": f"anemoi.models.layers.mapper.Transformer{kind}Mapper",
        "_convert_": "all",
        **{"num_channels": CHANNELS, "num_chunks": 1, "num_heads": 4, "mlp_hidden_ratio": 2},
        "attention_implementation": "scaled_dot_product_attention",
        "layer_kernels": _KERNELS,
    }


def _model_config(processor_target: str, extra: dict) -> dict:
    processor = {
        **extra,
        "_target_": processor_target,
        "_convert_": "all",
        **{"num_layers": 2, "num_channels": CHANNELS, "num_chunks": 1, "num_heads": 4, "mlp_hidden_ratio": 2},
        **{"window_size": 4, "qk_norm": True, "dropout_p": 0.0},
        "attention_implementation": "scaled_dot_product_attention",
        "layer_kernels": _KERNELS,
    }
    if processor_target == ADAPTER:
        processor["strategy"] = "shard_sequence"
    source = {"source_datasets": ["data"], "dataset_fusing_strategy": "not_supported", "mapper": _mapper("Forward")}
    target = {"target_datasets": ["data"], "target_node_features": ["coordinates"], "mapper": _mapper("Backward")}
    return {
        "model": {
            "num_channels": CHANNELS,
            "node_trainable_parameters": {"data": 0, "hidden": 0},
            "model": {"hidden_nodes_name": "hidden", "latent_skip": True},
            "encoders": {"enc": source},
            "decoders": {"dec": target},
            "latent_aggregator": {"_target_": "anemoi.models.layers.aggregator.SumAggregator"},
            "processor": processor,
            "residual": {"datasets": {"data": {"_target_": "anemoi.models.layers.residual.SkipConnection"}}},
            "bounding": {"datasets": {"data": []}},
        }
    }


def build(processor_target: str, extra: dict | None = None) -> AnemoiModelEncProcDec:
    """anemoi's model, float64, with the processor ``processor_target`` names and ``extra`` settings."""
    model = AnemoiModelEncProcDec(
        model_config=OmegaConf.create(_model_config(processor_target, extra or {})),
        data_indices=_data_indices(),
        statistics={"data": None},
        n_step_input=2,
        n_step_output=1,
        graph_data=_graph(),
    )
    return model.double()


def randomise(model: torch.nn.Module) -> None:
    """Weights away from their initial values (zero biases, unit norms hide mistakes)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            is_norm_scale = "norm" in name and name.endswith("weight")
            p.copy_(1 + 0.2 * noise if is_norm_scale else noise * (p.shape[1] ** -0.5 if p.ndim == 2 else 1))


# anemoi's processor settings that its CPU path runs, besides the defaults.
WIDER_AND_GATED = {"attn_channels": 24, "mlp_implementation": "swiglu"}


def pair(extra: dict | None = None) -> tuple[AnemoiModelEncProcDec, AnemoiModelEncProcDec]:
    """anemoi's model with its own processor and with the adapter, the same weights."""
    with warnings.catch_warnings():  # a gated MLP: "layer_kernels.Activation is ignored", as it is
        warnings.simplefilter("ignore", UserWarning)
        theirs = build("anemoi.models.layers.processor.TransformerProcessor", extra)
    ours = build(ADAPTER, extra)
    assert isinstance(ours.processor, AnemoiTransformerProcessor)
    randomise(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


def run(model: AnemoiModelEncProcDec, batch: int, group: dist.ProcessGroup | None = None) -> tuple:
    """Output and parameter gradients (by name) of ``sum(out * weights)``."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(batch, 2, 1, GRID, VARIABLES, generator=g, dtype=torch.float64)
    weights = torch.randn(batch, 1, 1, GRID, VARIABLES, generator=g, dtype=torch.float64)
    model.zero_grad()
    out = model({"data": x}, model_comm_group=group)["data"]
    (out * weights).sum().backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


def errors(found: tuple, expected: tuple) -> dict[str, float]:
    """Relative max errors of the output and of each parameter's gradient (anemoi's mappers have
    norms that they never use: those have no gradient in either model)."""
    unused = sorted(name for name, g in expected[1].items() if g is None)
    assert unused == sorted(name for name, g in found[1].items() if g is None)
    assert not any(name.startswith("processor.") for name in unused)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    grads = {name: rel(found[1][name], g) for name, g in expected[1].items() if g is not None}
    return {"output": rel(found[0], expected[0]), **grads}


def assert_small(found: dict[str, float]) -> None:
    """The output and the processor's gradients within TOLERANCE, the rest within MAPPER_TOLERANCE."""
    for name, error in found.items():
        limit = TOLERANCE if name == "output" or name.startswith("processor.") else MAPPER_TOLERANCE
        assert np.isfinite(error) and error < limit, (name, error)


@pytest.mark.parametrize("extra", [{}, WIDER_AND_GATED], ids=["defaults", "attn_channels-swiglu"])
def test_the_whole_model_with_the_adapter_equals_anemois_on_one_rank(extra):
    theirs, ours = pair(extra)
    assert_small(errors(run(ours, batch=2), run(theirs, batch=2)))


def _on_ranks(group: dist.ProcessGroup, extra: dict) -> dict[str, float]:
    """This rank's errors: the adapter's model in a model-comm group of 2 against anemoi's own
    model on one rank (each rank's gradients hold its share: summed over the group, as anemoi's
    trainer does)."""
    theirs, ours = pair(extra)
    expected = run(theirs, batch=1)
    out, grads = run(ours, batch=1, group=group)
    for grad in grads.values():
        if grad is not None:
            dist.all_reduce(grad, group=group)
    return errors((out, grads), expected)


@pytest.mark.parametrize("extra", [{}, WIDER_AND_GATED], ids=["defaults", "attn_channels-swiglu"])
def test_the_whole_model_with_the_adapter_in_anemois_model_comm_group_of_2(rank_pool, extra):
    for rank_errors in rank_pool.run_ok(_on_ranks, 2, extra):
        assert_small(rank_errors)
