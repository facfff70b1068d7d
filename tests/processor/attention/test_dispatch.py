"""The rules that pick an attention path, forcing one, and the errors when it cannot run."""

from __future__ import annotations

import pytest
import torch

from processor import ConfigError, ProcessorConfig
from processor.attention import dispatch, kernel, sdpa_blocks, sliding_window_attention
from processor.attention.dispatch import AttentionCall, choose_global_path, choose_path


def _call(device="cpu", dtype=torch.float32, head_dim=32, ids=False, dropout=0.0, grad=True, n_q=1000, q_offset=0):
    return AttentionCall(device, dtype, head_dim, n_q, n_q + q_offset, 64, q_offset, ids, dropout, grad)


@pytest.fixture
def flash(monkeypatch):
    """Pretend flash-attn is installed."""
    monkeypatch.setattr(dispatch, "flash_installed", lambda: True)


@pytest.fixture
def no_flash(monkeypatch):
    """Neither flash-attn nor the fused CPU kernel (the rules of a machine without them)."""
    monkeypatch.setattr(dispatch, "flash_installed", lambda: False)
    monkeypatch.setattr(dispatch, "native_available", lambda: False)


@pytest.mark.parametrize(
    "call,expected",
    [
        (_call(), "native"),  # training on CPU
        (_call(dtype=torch.float64), "banded"),
        (_call(grad=False), "native"),
        (_call(dtype=torch.bfloat16), "native"),
        (_call(dropout=0.1), "sdpa_blocks"),
        (_call(ids=True), "native"),
        (_call(device="cuda"), "flex"),
    ],
)
def test_auto_with_the_fused_cpu_kernel_built(monkeypatch, call, expected):
    monkeypatch.setattr(dispatch, "flash_installed", lambda: False)
    monkeypatch.setattr(dispatch, "native_available", lambda: True)
    assert choose_path(call) == expected
    if expected != "native":
        with pytest.raises(ValueError, match="attention_path = 'native'"):
            choose_path(call, "native")


@pytest.mark.parametrize(
    "call,expected",
    [
        (_call(), "banded"),  # training on CPU
        (_call(dtype=torch.float64), "banded"),
        (_call(grad=False), "sdpa_blocks"),  # inference on CPU: measured faster
        (_call(dtype=torch.bfloat16), "sdpa_blocks"),
        (_call(dropout=0.1), "sdpa_blocks"),
        (_call(ids=True), "banded"),
        (_call(device="cuda", dtype=torch.bfloat16), "flex"),
        (_call(device="cuda"), "flex"),  # fp32 on CUDA
        (_call(device="cuda", dtype=torch.bfloat16, dropout=0.1), "sdpa_blocks"),
        (_call(device="cuda", head_dim=4), "sdpa_blocks"),
        (_call(device="mps"), "sdpa_blocks"),
    ],
)
def test_auto_without_flash_attn(no_flash, call, expected):
    assert choose_path(call) == expected


@pytest.mark.parametrize(
    "call,expected",
    [
        (_call(device="cuda", dtype=torch.bfloat16), "flash_attn"),
        (_call(device="cuda", dtype=torch.bfloat16, dropout=0.1), "flash_attn"),
        (_call(device="cuda", dtype=torch.bfloat16, ids=True), "flex"),  # flash-attn has no ids
        (_call(device="cuda"), "flex"),  # flash-attn takes no fp32
        (_call(device="cuda", dtype=torch.bfloat16, head_dim=512), "flex"),
        (_call(device="cuda", dtype=torch.float16, n_q=10, q_offset=500), "flash_attn"),
    ],
)
def test_auto_with_flash_attn(flash, call, expected):
    assert choose_path(call) == expected


@pytest.mark.parametrize(
    "path,call,message",
    [
        ("flex", _call(), "no backward on CPU"),
        ("flex", _call(grad=False, dropout=0.1), "no attention dropout"),
        ("banded", _call(dtype=torch.bfloat16), "fp32/fp64"),
        ("banded", _call(device="cuda"), "fp32/fp64"),
        ("banded", _call(dropout=0.1), "dropout"),
        ("flash_attn", _call(device="cuda", dtype=torch.bfloat16), "not installed"),
        ("fast", _call(), "unknown attention path"),
    ],
)
def test_a_forced_path_that_cannot_run_says_why(no_flash, path, call, message):
    with pytest.raises(ValueError, match=message) as info:
        choose_path(call, path)
    assert str(info.value).startswith(f"attention_path = {path!r}: ")
    assert "\n" not in str(info.value)


def test_flash_attn_cannot_place_queries_it_has_no_window_side_for(flash):
    # Queries at the start of a long key block: flash-attn's bottom-right alignment would need
    # a negative left side.
    call = AttentionCall("cuda", torch.bfloat16, 32, 10, 1000, 5, 0, False, 0.0, True)
    with pytest.raises(ValueError, match="window side would be negative"):
        choose_path(call, "flash_attn")
    assert choose_path(call) == "flex"


def test_forced_paths_run_what_they_name(monkeypatch):
    """``path`` reaches the kernel: a forced path calls that path's code."""
    seen = []
    monkeypatch.setattr(sdpa_blocks, "banded_flash_attention", lambda *a, **k: seen.append("banded") or a[0])
    monkeypatch.setattr(kernel, "flex_window_attention", lambda *a, **k: seen.append("flex") or a[0])
    monkeypatch.setattr(dispatch, "native_available", lambda: False)
    q = torch.randn(1, 2, 600, 16, requires_grad=True)
    sliding_window_attention(q, q, q, 40, path="banded")
    with torch.no_grad():
        sliding_window_attention(q, q, q, 40, path="flex")
    sliding_window_attention(q, q, q, 40)  # auto, with a gradient, no fused C++ kernel: banded
    assert seen == ["banded", "flex", "banded"]


def test_global_windows_run_dense_whatever_windowed_path_is_forced(monkeypatch):
    monkeypatch.setattr(kernel.NativeBandAttention, "apply", lambda *a: pytest.fail("the native kernel ran"))
    q, k, v = (torch.randn(1, 2, 50, 16, requires_grad=True) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for path in ("flex", "banded", "sdpa_blocks", "dense", "scored", "flash_attn"):
        torch.testing.assert_close(sliding_window_attention(q, k, v, None, path=path), expected)


def _global(**changes):
    fields = dict(device_type="cpu", dtype=torch.float32, head_dim=16, n_q=500, n_k=500, window=500, q_offset=0)
    fields |= dict(segment_ids=False, dropout_p=0.0, needs_grad=True) | changes
    return AttentionCall(**fields)


@pytest.mark.parametrize(
    "call,path,expected",
    [
        (_global(), "auto", "native"),  # measured 1.2-2.4x SDPA on CPU
        (_global(dtype=torch.bfloat16, needs_grad=False), "auto", "native"),
        (_global(segment_ids=True), "auto", "dense"),  # SDPA per segment computes each segment's block alone
        (_global(segment_ids=True), "native", "native"),
        (_global(dtype=torch.float64), "auto", "dense"),
        (_global(dropout_p=0.1), "auto", "dense"),
        (_global(score_mods=True), "auto", "dense"),  # the caller routes logit mods first
        (_global(device_type="cuda", dtype=torch.bfloat16), "auto", "dense"),
        (_global(), "native", "native"),
        (_global(n_q=20, n_k=20, window=20), "auto", "dense"),  # too few keys to pay its fixed cost
        (_global(n_q=20, n_k=20, window=20), "native", "native"),
        (_global(), "banded", "dense"),
        (_global(), "dense", "dense"),
    ],
)
def test_a_global_window_takes_the_native_kernel_where_it_runs(call, path, expected):
    if expected == "native" and not dispatch.native_available():
        expected = "dense"
    if path == "native" and not dispatch.native_available():
        pytest.skip("the fused CPU kernel is not built")
    assert choose_global_path(call, path) == expected


def test_a_global_window_without_the_kernel_or_forced_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(dispatch, "native_available", lambda: True)  # a built kernel, for the first two
    with pytest.raises(ValueError, match="attention_path = 'native': native runs on CPU in fp32/bf16, not cuda"):
        choose_global_path(_global(device_type="cuda"), "native")
    with pytest.raises(ValueError, match="attention_path = 'fastest': unknown attention path"):
        choose_global_path(_global(), "fastest")
    monkeypatch.setattr(dispatch, "native_available", lambda: False)
    assert choose_global_path(_global()) == "dense"
    with pytest.raises(ValueError, match="the fused CPU kernel is not built"):
        choose_global_path(_global(), "native")


def test_the_config_names_the_key():
    with pytest.raises(ConfigError, match="attention_path: 'fastest' is out of range: expected one of"):
        ProcessorConfig(num_layers=1, num_channels=8, num_heads=2, attention_path="fastest")


def test_a_forced_path_reaches_the_layer():
    from processor import TransformerProcessor

    model = TransformerProcessor(num_layers=1, num_channels=32, num_heads=2, window_size=8, attention_path="flex")
    x = torch.randn(1, 300, 32, requires_grad=True)
    with pytest.raises(ValueError, match="attention_path = 'flex': flex has no backward on CPU"):
        model(x)
