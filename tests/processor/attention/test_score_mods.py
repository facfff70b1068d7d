"""anemoi's attention settings (softcap, ALiBi, rotary, attention width, gated MLPs) against
direct formulas: the kernel on its own, and the whole processor on one rank through every
attention path that can run them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from processor import ConfigError, ProcessorConfig, TransformerProcessor
from processor.attention import sliding_window_attention
from processor.attention.flex import flex_available
from processor.attention.score_mods import ScoreMods, alibi_slopes, rotate

F64 = torch.float64


def formula_attention(q, k, v, window, q_offset=0, softcap=None, slopes=None, ids=None):
    """Softmax of ``c tanh(q.k / sqrt(d) / c) - slope_h |i - j|`` under the band and the ids."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(q.shape[2])[:, None] + q_offset
    j = torch.arange(k.shape[2])[None, :]
    if slopes is not None:
        scores = scores - slopes.to(scores)[:, None, None] * (i - j).abs()
    if window is not None:
        scores = scores.masked_fill((i - j).abs() > window, float("-inf"))
    if ids is not None:
        same = ids[:, q_offset : q_offset + q.shape[2], None] == ids[:, None, :]
        scores = scores.masked_fill(~same[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def formula_rotary(x, first_point):
    """flash-attn's non-interleaved rotary embedding, written out: angle ``p / 10000^(2m/d)``."""
    d = x.shape[-1]
    m = torch.arange(d // 2, dtype=torch.float32)
    angle = torch.arange(first_point, first_point + x.shape[2], dtype=torch.float32)[:, None] * (
        1.0 / 10000.0 ** (2 * m / d)
    )
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


MODS = [
    dict(softcap=0.7),
    dict(slopes=True),
    dict(softcap=2.5, slopes=True),
]


@pytest.mark.parametrize("window", [0, 6, 45, None])
@pytest.mark.parametrize("mods", MODS, ids=["softcap", "alibi", "both"])
def test_the_kernel_applies_softcap_and_alibi_as_the_formula(window, mods) -> None:
    g = torch.Generator().manual_seed(window or 1)
    q = torch.randn(2, 3, 150, 8, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, 3, 170, 8, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(2, 3, 170, 8, generator=g, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 3, (2, 170), generator=g).sort(dim=1).values
    slopes = alibi_slopes(3) if mods.get("slopes") else None
    score_mods = ScoreMods(mods.get("softcap"), slopes)
    out = sliding_window_attention(q, k, v, window, q_offset=9, segment_ids=ids, mods=score_mods)
    expected = formula_attention(q, k, v, window, 9, mods.get("softcap"), slopes, ids)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(out.shape, generator=g, dtype=F64)
    ours = torch.autograd.grad(out, (q, k, v), cotangent)
    theirs = torch.autograd.grad(expected, (q, k, v), cotangent)
    for name, a, b in zip("qkv", ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11, msg=f"d{name}")


def test_rotary_is_flash_attns_and_depends_on_the_global_position_only() -> None:
    x = torch.randn(2, 3, 64, 16, dtype=F64)
    whole = rotate(x, 0)
    torch.testing.assert_close(whole, formula_rotary(x, 0), rtol=0, atol=1e-15)
    torch.testing.assert_close(rotate(x[:, :, 20:], 20), whole[:, :, 20:], rtol=0, atol=0)
    assert not torch.allclose(rotate(x[:, :, 20:], 0), whole[:, :, 20:])  # the position matters
    # q.k after rotation depends on i - j only: shifting both by 1000 changes nothing.
    q, k = torch.randn(1, 1, 8, 16, dtype=F64), torch.randn(1, 1, 8, 16, dtype=F64)
    near = rotate(q, 3) @ rotate(k, 0).transpose(-1, -2)
    far = rotate(q, 1003) @ rotate(k, 1000).transpose(-1, -2)
    torch.testing.assert_close(near, far, rtol=1e-4, atol=1e-4)  # float32 angles, as flash-attn's


def test_alibi_slopes_are_anemois_closed_form() -> None:
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    # 6 heads: 4 from 2^(-8/4), then 2^(-4/4) to the powers 1 and 3.
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


def formula_processor(model: TransformerProcessor, x: torch.Tensor) -> torch.Tensor:
    """The processor written out from its parameters and its config (one rank, no kernel)."""
    c = model.config
    for block in model.blocks:
        h = F.layer_norm(x, (c.num_channels,), block.attn_norm.weight, block.attn_norm.bias)
        qkv = h @ block.attn.qkv.weight.T
        q, k, v = (t.unflatten(-1, (c.num_heads, c.head_dim)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        if c.qk_norm:
            q = F.layer_norm(q, (c.head_dim,), block.attn.q_norm.weight, block.attn.q_norm.bias)
            k = F.layer_norm(k, (c.head_dim,), block.attn.k_norm.weight, block.attn.k_norm.bias)
        if c.use_rotary_embeddings:
            q, k = formula_rotary(q, 0), formula_rotary(k, 0)
        slopes = alibi_slopes(c.num_heads) if c.use_alibi_slopes else None
        heads = formula_attention(q, k, v, c.window_size, softcap=c.softcap, slopes=slopes)
        x = x + heads.transpose(1, 2).flatten(2) @ block.attn.proj.weight.T + block.attn.proj.bias
        h = F.layer_norm(x, (c.num_channels,), block.mlp_norm.weight, block.mlp_norm.bias)
        if c.mlp_implementation == "mlp":
            hidden = F.gelu(block.mlp[0](h))
        else:
            gating = {"glu": torch.sigmoid, "swiglu": F.silu, "geglu": F.gelu, "reglu": F.relu}
            layer = block.mlp[0]
            hidden = gating[c.mlp_implementation](layer.gate_proj(h)) * layer.value_proj(h)
        x = x + F.linear(hidden, block.mlp.narrow.weight, block.mlp.narrow.bias)
    return x


SETTINGS = dict(attn_channels=40, mlp_implementation="geglu", use_rotary_embeddings=True, qk_norm=True)
MODDED = dict(SETTINGS, softcap=1.2, use_alibi_slopes=True, mlp_implementation="swiglu")
PATHS = [(SETTINGS, p) for p in ("auto", "dense", "banded", "sdpa_blocks", "scored")] + [
    (MODDED, p) for p in ("auto", "scored")
]


@pytest.mark.parametrize("settings,path", PATHS, ids=[f"{'mods' if s is MODDED else 'plain'}-{p}" for s, p in PATHS])
@pytest.mark.parametrize("window", [5, None])
def test_one_rank_is_the_formula_through_every_path(settings, path, window) -> None:
    torch.manual_seed(3)
    block = 16 if path in ("banded", "sdpa_blocks") else None
    model = TransformerProcessor(
        num_layers=2,
        num_channels=24,
        num_heads=4,
        window_size=window,
        attention_path=path,
        attention_block_size=block,
        **settings,
    ).double()
    x = torch.randn(2, 130, 24, dtype=F64, requires_grad=True)
    y = model(x)
    expected = formula_processor(model, x)
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)
    cotangent = torch.randn_like(y)
    params = list(model.parameters())
    ours = torch.autograd.grad(y, [x, *params], cotangent)
    theirs = torch.autograd.grad(expected, [x, *params], cotangent)
    for (name, _), a, b in zip([("x", None), *model.named_parameters()], ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")
def test_flex_applies_softcap_and_alibi_in_inference() -> None:
    torch.manual_seed(4)
    model = TransformerProcessor(
        num_layers=1, num_channels=64, num_heads=4, window_size=20, **{**MODDED, "attn_channels": 64}
    )
    x = torch.randn(1, 300, 64)
    with torch.no_grad():
        expected = model(x)
        model.blocks[0].attn.path = "flex"
        torch.testing.assert_close(model(x), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "settings,key",
    [
        (dict(softcap=1.0, attention_path="banded"), "attention_path"),
        (dict(use_alibi_slopes=True, attention_path="sdpa_blocks"), "attention_path"),
        (dict(softcap=-1.0), "softcap"),
        (dict(use_alibi_slopes=True, dropout_p=0.1), "dropout_p"),
        (dict(attn_channels=30), "num_heads"),
        (dict(attn_channels=36, num_heads=12, use_rotary_embeddings=True), "use_rotary_embeddings"),
        (dict(mlp_implementation="swish"), "mlp_implementation"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_key(settings, key) -> None:
    with pytest.raises(ConfigError) as info:
        ProcessorConfig(**{"num_layers": 1, "num_channels": 32, "num_heads": 4, **settings})
    assert info.value.key == key
