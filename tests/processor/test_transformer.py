"""The processor on one rank: arguments, equivalences, checkpointing."""

from __future__ import annotations

import pytest
import torch

from processor import ConfigError, ProcessorConfig, Strategy, TransformerProcessor
from processor.strategies import ShardSequence, resolve_strategy


def _build(**overrides) -> TransformerProcessor:
    torch.manual_seed(0)
    kwargs = dict(num_layers=2, num_channels=16, num_heads=4, window_size=5, mlp_hidden_ratio=2, num_chunks=0)
    return TransformerProcessor(ProcessorConfig(**{**kwargs, **overrides}))


def _forward_backward(model: TransformerProcessor, x: torch.Tensor):
    x = x.clone().requires_grad_()
    y = model(x)
    y.pow(2).sum().backward()
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(strategy="ring"), "unknown strategy 'ring'"),
        (dict(num_heads=3), r"num_channels \(16\) is not divisible by num_heads \(3\)"),
        (dict(window_size=-1), "window_size"),
        (dict(num_chunks=3), "num_chunks"),
        (dict(num_layers=0), "num_layers"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(activation="swish2"), "activation: 'swish2' is out of range"),
        (dict(attention_block_size=0), "attention_block_size"),
        (dict(num_layers=2.5), "num_layers"),
        (dict(mlp_hidden_ratio=0), "mlp_hidden_ratio"),
    ],
)
def test_bad_arguments(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _build(**overrides)


def test_unknown_setting_is_an_error_naming_it():
    with pytest.raises(ConfigError, match="window: not a processor setting"):
        ProcessorConfig.from_mapping(dict(num_layers=2, num_channels=16, num_heads=4, window=5))


def test_the_processor_takes_a_config_only():
    with pytest.raises(TypeError, match="ProcessorConfig"):
        TransformerProcessor(dict(num_layers=2, num_channels=16, num_heads=4))  # type: ignore[arg-type]


def test_fingerprint_covers_every_setting():
    base = ProcessorConfig(num_layers=2, num_channels=16, num_heads=4, window_size=5)
    changed = dict(
        num_layers=4,
        num_channels=32,
        num_heads=2,
        window_size=6,
        mlp_hidden_ratio=2.0,
        num_chunks=2,
        dropout_p=0.1,
        qk_norm=True,
        qk_norm_bias=False,
        activation="silu",
        strategy="shard_sequence",
        attention_block_size=64,
        attention_path="sdpa_blocks",
        attn_channels=8,
        mlp_implementation="swiglu",
        softcap=5.0,
        use_alibi_slopes=True,
        use_rotary_embeddings=True,
    )
    assert set(changed) == set(base.describe())  # a new setting must be added here
    for key, value in changed.items():
        other = ProcessorConfig.from_mapping({**vars(base), key: value})
        assert other.fingerprint() != base.fingerprint(), key
    same = ProcessorConfig.from_mapping({**vars(base), "strategy": resolve_strategy("none")})
    assert same.fingerprint() == base.fingerprint()  # a name and its instance are one strategy


class _CountingStrategy(ShardSequence):
    """A user's strategy: shard_sequence that counts its calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def attend(self, attn, h, ctx):
        self.calls += 1
        return super().attend(attn, h, ctx)


def test_a_strategy_instance_plugs_in():
    strategy = _CountingStrategy()
    model = _build(strategy=strategy)
    assert isinstance(model.strategy, Strategy) and model.strategy is strategy
    assert "_CountingStrategy(ring=None)" in model.config.describe()["strategy"]
    torch.testing.assert_close(model(torch.randn(1, 30, 16)).shape, torch.Size([1, 30, 16]))
    assert strategy.calls == 0  # one rank never reaches a strategy: SingleRank runs it


def test_bad_input_shape():
    model = _build()
    with pytest.raises(ValueError, match=r"\(batch, points, 16\)"):
        model(torch.zeros(10, 16))
    with pytest.raises(ValueError, match=r"\(batch, points, 16\)"):
        model(torch.zeros(1, 10, 8))
    with pytest.raises(ValueError, match="shard_sizes"):
        model(torch.zeros(1, 10, 16), shard_sizes=[5, 5])


def test_strategy_none_refuses_a_group_of_several():
    with pytest.raises(ValueError, match="one rank"):
        resolve_strategy("none").check(num_heads=4, window_size=3, world_size=2)


@pytest.mark.parametrize("strategy", ["shard_heads", "shard_sequence"])
def test_every_strategy_on_one_rank_is_none(strategy):
    x = torch.randn(2, 150, 16)
    expected = _forward_backward(_build(), x)
    actual = _forward_backward(_build(strategy=strategy), x)
    for a, b in zip(actual[:2], expected[:2]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("chunks", [1, 2])
def test_checkpointing_changes_nothing(chunks):
    x = torch.randn(1, 90, 16)
    y0, dx0, g0 = _forward_backward(_build(num_chunks=0), x)
    y1, dx1, g1 = _forward_backward(_build(num_chunks=chunks), x)
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(dx1, dx0)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b)


def test_batch_is_independent_samples():
    model = _build(qk_norm=True)
    x = torch.randn(3, 70, 16)
    together = model(x)
    for i in range(3):
        torch.testing.assert_close(together[i : i + 1], model(x[i : i + 1]))


def test_window_covering_everything_is_global():
    x = torch.randn(1, 40, 16)
    torch.testing.assert_close(_build(window_size=39)(x), _build(window_size=None)(x))
    assert not torch.allclose(_build(window_size=3)(x), _build(window_size=None)(x))


def test_window_limits_the_receptive_field():
    """Two layers of window W: output i depends on inputs within 2W of it, and no further."""
    model = _build(window_size=3)
    x = torch.randn(1, 40, 16, requires_grad=True)
    model(x)[0, 20].sum().backward()
    touched = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == list(range(14, 27))


def test_dropout_only_in_training():
    model = _build(dropout_p=0.5)
    x = torch.randn(1, 40, 16)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.allclose(model(x), model(x))
