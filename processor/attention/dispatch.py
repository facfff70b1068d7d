"""Which kernel runs an attention call: :func:`choose_path` for a window that cuts,
:func:`choose_global_path` where every query sees every key, with their rules.

The paths (``attention_path`` in :class:`~processor.ProcessorConfig`, ``path=`` of
:func:`~processor.attention.sliding_window_attention`):

- ``dense``: one fused ``scaled_dot_product_attention`` call. Taken when every query's window
  holds every key (global attention), whatever is asked for, but ``native`` (below,
  :func:`choose_global_path`); forced on a window that cuts, it is one call under an
  ``(n_q, n_k)`` boolean mask (anemoi's approach, ``O(N^2)``).
- ``flash_attn``: flash-attn's native sliding window (CUDA, fp16/bf16, head_dim a multiple of
  8 up to 256, no segment ids), when the package is installed.
- ``flex``: compiled FlexAttention with a block-sparse ``BlockMask`` (:mod:`.flex`). CUDA
  forward and backward; CPU forward only. No dropout.
- ``native``: the fused C++ CPU kernel (:mod:`.native`, built by ``scripts/setup.sh``): tiles of
  queries against exactly the keys their band reaches, online softmax, a backward that
  recomputes the probabilities from the log-sum-exp; CPU, fp32 and bf16 (bf16 products where the
  host multiplies bf16 natively), no dropout.
- ``banded``: PyTorch's fused CPU flash kernel block by block, with its own backward
  (:mod:`.banded`); CPU, fp32/fp64, no dropout.
- ``sdpa_blocks``: blocks of queries against their key bands in one SDPA call on strided views
  (any device, dtype and dropout): the fallback.
- ``scored``: explicit logits in bounded pieces (:mod:`.scored`), any device and dtype, no
  dropout: the one CPU path for a softcap or ALiBi (:mod:`.score_mods`), which only it and
  ``flex`` apply.

A run's launcher replaces ``auto`` by the path it measured fastest on its host
(:mod:`.autotune`); the rules here are ``auto`` where nothing was measured (probing off, a
library call). ``auto`` picks, for a window that cuts: on CUDA ``flash_attn``, else ``flex``, else
``sdpa_blocks``; on CPU ``native`` where it is built (fp32/bf16, no dropout), else ``banded``
when a gradient is needed (fp32/fp64, no dropout), else ``sdpa_blocks``. With a softcap or
ALiBi (global windows too): ``flex`` where it runs, else ``scored``. A global window on CPU runs
``native`` where it is built (fp32/bf16, no dropout, no segment ids) and there are at least
:data:`GLOBAL_NATIVE_MIN_KEYS` keys, else ``dense``: the fused kernel over every key took
0.42-0.84 of SDPA's time, forward and forward+backward, in all 14 cases measured at 326-10,000
points and head dims 16-64 (2 threads, AMD Zen 4). The CPU rules are measured
(``python -m benchmarks.attention_paths``, 2-core VM, N = 8192, 8 heads of 32 or 64, W =
64/256/1024, forward only): FlexAttention's compiled CPU forward was 2.3–5.8x slower than the
best path in all 12 cases, fp32 and bf16, so ``auto`` never takes it on CPU; without the fused
kernel, for inference the blocked SDPA took 9–20% less time than the banded kernel (6 of 6 fp32
cases), whose worth is its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from processor.attention.flash import flash_installed, flash_window_sides
from processor.attention.flex import flex_available
from processor.attention.native import native_available

PATHS = ("auto", "dense", "flash_attn", "flex", "native", "banded", "sdpa_blocks", "scored")
SCORE_MOD_PATHS = ("auto", "flex", "scored")  # the paths that apply a softcap or ALiBi
# Fewer keys than this, and the native kernel's fixed cost outweighs what it saves over SDPA on a
# global window (8 x 4 heads x 16 channels, fwd+bwd, Zen 4: 11 keys 0.36x, 35 keys 1.01x, 100 keys 1.47x).
GLOBAL_NATIVE_MIN_KEYS = 32
_HALF = (torch.float16, torch.bfloat16)
_FULL = (torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionCall:
    """What the choice depends on: where and in what the tensors are, the geometry, the options."""

    device_type: str
    dtype: torch.dtype
    head_dim: int
    n_q: int
    n_k: int
    window: int
    q_offset: int
    segment_ids: bool
    dropout_p: float
    needs_grad: bool
    score_mods: bool = False  # a softcap or ALiBi changes the logits

    @classmethod
    def of(
        cls,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        window: int,
        q_offset: int,
        segment_ids: bool,
        dropout_p: float,
        score_mods: bool = False,
    ):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return cls(
            q.device.type,
            q.dtype,
            q.shape[-1],
            q.shape[2],
            k.shape[2],
            window,
            q_offset,
            segment_ids,
            dropout_p,
            needs_grad,
            score_mods,
        )


def path_problem(path: str, call: AttentionCall) -> str | None:
    """Why ``path`` cannot run ``call`` (one line), or None when it can."""
    if path not in PATHS:
        return f"unknown attention path {path!r}; choose one of {list(PATHS)}"
    if call.score_mods and path not in SCORE_MOD_PATHS:
        return f"{path} applies no softcap or ALiBi; choose one of {list(SCORE_MOD_PATHS)}"
    if path == "scored" and call.dropout_p > 0:
        return "scored has no attention dropout; set dropout_p=0 or choose sdpa_blocks"
    if path == "flash_attn":
        return _flash_problem(call)
    if path == "flex":
        return _flex_problem(call)
    if path == "native":
        return _native_problem(call)
    if path == "banded":
        if call.device_type != "cpu" or call.dtype not in _FULL:
            return f"banded runs on CPU in fp32/fp64, not {call.device_type} {call.dtype}; choose sdpa_blocks"
        if call.dropout_p > 0:
            return "banded cannot replay attention dropout; set dropout_p=0 or choose sdpa_blocks"
    return None


def _native_problem(call: AttentionCall) -> str | None:
    if not native_available():
        return "native: the fused CPU kernel is not built (python -m processor.attention.build_kernel); choose banded"
    if call.device_type != "cpu" or call.dtype not in (torch.float32, torch.bfloat16):
        return f"native runs on CPU in fp32/bf16, not {call.device_type} {call.dtype}; choose banded or sdpa_blocks"
    if call.dropout_p > 0:
        return "native has no attention dropout; set dropout_p=0 or choose sdpa_blocks"
    return None


def _flash_problem(call: AttentionCall) -> str | None:
    if not flash_installed():
        return "flash_attn: the flash-attn package is not installed; choose flex or sdpa_blocks"
    if call.device_type != "cuda" or call.dtype not in _HALF:
        return f"flash_attn runs on CUDA in fp16/bf16, not {call.device_type} {call.dtype}"
    if call.head_dim % 8 or call.head_dim > 256:
        return f"flash_attn takes head_dim a multiple of 8 up to 256, not {call.head_dim}"
    if call.segment_ids:
        return "flash_attn has no segment ids; choose flex or sdpa_blocks"
    if min(flash_window_sides(call.n_q, call.n_k, call.window, call.q_offset)) < 0:
        return "flash_attn cannot place these queries in their keys (a window side would be negative)"
    return None


def _flex_problem(call: AttentionCall) -> str | None:
    if not flex_available():
        return f"flex: this torch ({torch.__version__}) has no FlexAttention; choose sdpa_blocks"
    if call.dropout_p > 0:
        return "flex has no attention dropout; set dropout_p=0 or choose sdpa_blocks"
    if call.device_type == "cpu" and call.needs_grad:
        return "flex has no backward on CPU; run it under torch.no_grad() or choose banded/sdpa_blocks"
    if call.device_type not in ("cpu", "cuda"):
        return f"flex runs on CPU and CUDA, not {call.device_type}"
    if call.head_dim < 16 or call.head_dim % 8:
        return f"flex takes head_dim >= 16 and a multiple of 8, not {call.head_dim}"
    return None


def choose_path(call: AttentionCall, path: str = "auto") -> str:
    """The path that runs ``call``: ``path`` itself when forced (a ``ValueError`` naming
    ``attention_path`` when it cannot), else by the rules in this module's docstring."""
    if path != "auto":
        problem = path_problem(path, call)
        if problem is not None:
            raise ValueError(f"attention_path = {path!r}: {problem}")
        return path
    if call.score_mods:
        return "flex" if call.device_type == "cuda" and path_problem("flex", call) is None else "scored"
    if call.device_type == "cuda":
        for candidate in ("flash_attn", "flex"):
            if path_problem(candidate, call) is None:
                return candidate
        return "sdpa_blocks"
    if call.device_type == "cpu" and path_problem("native", call) is None:
        return "native"
    if call.device_type == "cpu" and call.needs_grad and path_problem("banded", call) is None:
        return "banded"
    return "sdpa_blocks"


def sees_every_key(n_q: int, n_k: int, window: int | None, q_offset: int) -> bool:
    """Whether every query's window holds every key: global attention, whatever ``window`` says."""
    # The last query must reach key 0 and the first query the last key.
    return window is None or (q_offset + n_q - 1 - window <= 0 and q_offset + window >= n_k - 1)


def choose_global_path(call: AttentionCall, path: str = "auto") -> str:
    """The path for a call whose every query sees every key: ``native`` when forced (a
    ``ValueError`` naming ``attention_path`` when it cannot run), or under ``auto`` where it runs
    and pays (at least :data:`GLOBAL_NATIVE_MIN_KEYS` keys, no segment ids); else ``dense``, one
    fused SDPA call (per segment id, with ids), whatever else is forced (the windowed paths would
    only run it slower)."""
    if path not in PATHS:
        raise ValueError(f"attention_path = {path!r}: {path_problem(path, call)}")
    if path == "native":
        return choose_path(call, "native")
    # With ids, SDPA per segment computes each segment's own block; the kernel would mask N x N.
    pays = call.n_k >= GLOBAL_NATIVE_MIN_KEYS and not call.segment_ids and not call.score_mods
    if path == "auto" and pays and path_problem("native", call) is None:
        return "native"
    return "dense"
