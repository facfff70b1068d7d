"""Time each attention path on one device: the windowed kernel alone, forward or forward+backward.

``python -m benchmarks.attention_paths`` compares the paths :mod:`processor.attention.dispatch`
chooses between, side by side in one process (ratios, not absolute figures, are what carry
across machines). On CPU the default is the inference question the dispatch rule answers:
FlexAttention's compiled forward against the banded kernel (fp32) and the blocked SDPA (bf16).
:mod:`benchmarks.gpu_check` uses :func:`measure_path` for its GPU table.

Needs only torch (no Hydra, no MLflow): it runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from benchmarks.gemm_rate import gemm_flop_rate
from processor.attention import sliding_window_attention
from processor.attention.dispatch import AttentionCall, path_problem
from processor.attention.score_mods import ScoreMods, alibi_slopes
from processor.host import device_name
from processor.plan.flops import window_pairs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class KernelCase:
    """One attention call: ``(1, heads, n, head_dim)`` q, k, v of ``dtype`` through ``path``."""

    n: int
    heads: int
    head_dim: int
    window: int
    dtype: str
    path: str
    backward: bool
    softcap: float | None = None  # anemoi's logit softcap
    alibi: bool = False  # anemoi's ALiBi slopes

    @property
    def mods(self) -> ScoreMods | None:
        if self.softcap is None and not self.alibi:
            return None
        return ScoreMods(self.softcap, alibi_slopes(self.heads) if self.alibi else None)

    @property
    def label(self) -> str:
        """The path, and the logit settings it applies."""
        extras = (["softcap"] if self.softcap is not None else []) + (["ALiBi"] if self.alibi else [])
        return f"{self.path} + {' + '.join(extras)}" if extras else self.path

    def flops(self) -> int:
        """Useful FLOPs (band model: 4·d per (query, key) pair in the window, backward 2x forward)."""
        forward = 4 * self.heads * self.head_dim * window_pairs(self.n, self.window)
        return 3 * forward if self.backward else forward


@dataclass(frozen=True)
class KernelResult:
    case: KernelCase
    seconds: float | None  # per call: CUDA events over the repeats, or the CPU median; None when it did not run
    peak_bytes: int | None  # CUDA only
    note: str = ""
    gemm_flops: float | None = None  # CPU: the fp32 GEMM rate (FLOP/s) measured just before and after this case

    @property
    def tflops(self) -> float | None:
        return None if self.seconds is None else self.case.flops() / self.seconds / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(case: KernelCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(0)
    shape = (1, case.heads, case.n, case.head_dim)
    dtype = DTYPES[case.dtype]
    return tuple(
        torch.randn(shape, generator=g, device=device, dtype=dtype).requires_grad_(case.backward) for _ in range(3)
    )


def _problem(case: KernelCase, device: torch.device) -> str | None:
    if case.path in ("auto", "dense", "sdpa_blocks") and case.mods is None:
        return None
    call = AttentionCall(
        device.type,
        DTYPES[case.dtype],
        case.head_dim,
        case.n,
        case.n,
        case.window,
        0,
        False,
        0.0,
        case.backward,
        case.mods is not None,
    )
    return path_problem(case.path, call)


def timed(
    call: Callable[[], None], device: torch.device, repeats: int, warmup: int, above_base: bool = False
) -> tuple[float, int | None]:
    """Seconds per call of ``repeats`` calls after ``warmup``, and the CUDA peak allocation over
    them (reset after the warm-up; ``above_base``: less what was allocated before; None on CPU).
    On CUDA: CUDA events around all the repeats, synchronised once, the elapsed time over the
    repeats (no host synchronisation between calls); on CPU: the median of each call's wall time."""
    for _ in range(warmup):
        call()
    _sync(device)
    base = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if above_base else 0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            call()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / repeats
        return seconds, torch.cuda.max_memory_allocated(device) - base
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], None


def measure_path(case: KernelCase, device: torch.device, repeats: int = 5, warmup: int = 2) -> KernelResult:
    """Time per call of ``repeats`` calls after ``warmup`` (the first compiles FlexAttention; see
    :func:`timed`), and the peak CUDA memory of one call beyond the inputs. A path that cannot
    run, or runs out of memory, comes back with ``seconds=None`` and the reason in ``note``."""
    problem = _problem(case, device)
    if problem is not None:
        return KernelResult(case, None, None, problem)
    try:
        q, k, v = _inputs(case, device)
        cotangent = torch.randn_like(q) if case.backward else None

        def call() -> None:
            with torch.set_grad_enabled(case.backward):
                out = sliding_window_attention(q, k, v, case.window, path=case.path, mods=case.mods)
                if cotangent is not None:
                    torch.autograd.grad(out, (q, k, v), cotangent)

        seconds, peak = timed(call, device, repeats, warmup, above_base=True)
    except torch.OutOfMemoryError:
        return KernelResult(case, None, None, "out of memory")
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return KernelResult(case, seconds, peak)


def markdown(results: list[KernelResult], gemm_flops: float | None = None) -> str:
    """A table: one row per case, time, TFLOP/s, its share of the fp32 GEMM rate measured in the
    same process (the case's own ``gemm_flops``, else ``gemm_flops``, FLOP/s; a column only when
    either is there) and peak memory (MiB), and why a row is empty."""
    shared = gemm_flops is not None or any(r.gemm_flops for r in results)
    share = " of GEMM |" if shared else ""
    lines = [
        f"| N | heads × dim | W | dtype | pass | path | ms | TFLOP/s |{share} peak MiB | note |",
        "|---:|---|---:|---|---|---|---:|---:|" + ("---:|" if shared else "") + "---:|---|",
    ]
    for r in results:
        c = r.case
        ms = "—" if r.seconds is None else f"{r.seconds * 1e3:.2f}"
        tf = "—" if r.tflops is None else f"{r.tflops:.3g}"
        peak = "—" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.0f}"
        passes = "fwd+bwd" if c.backward else "fwd"
        part = ""
        rate = r.gemm_flops or gemm_flops
        if shared:
            part = " — |" if r.tflops is None or not rate else f" {r.tflops * 1e12 / rate:.2f} |"
        lines.append(
            f"| {c.n} | {c.heads} × {c.head_dim} | {c.window} | {c.dtype} | {passes} | {c.label} | {ms} | {tf} "
            f"|{part} {peak} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, nargs="+", default=[8192])
    parser.add_argument("--window", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--paths", nargs="+", default=["native", "flex", "banded", "sdpa_blocks"])
    parser.add_argument("--backward", action="store_true", help="time forward+backward (default: inference)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--softcap", type=float, default=None, help="also time each path with this logit softcap")
    parser.add_argument("--alibi", action="store_true", help="also time each path with ALiBi slopes")
    args = parser.parse_args(argv)
    modded = args.softcap is not None or args.alibi
    device = torch.device(args.device)
    results = []
    for n in args.n:
        for d in args.head_dim:
            for w in args.window:
                for dtype in args.dtype:
                    for path in args.paths:
                        for mods in ((None, False), (args.softcap, args.alibi)) if modded else ((None, False),):
                            case = KernelCase(n, args.heads, d, w, dtype, path, args.backward, *mods)
                            results.append(_measured_beside_gemm(case, device, args.repeats))
                            print(markdown(results[-1:]).splitlines()[-1], flush=True)
    print()
    rates = [r.gemm_flops / 1e9 for r in results if r.gemm_flops]
    rate = f"; fp32 GEMM {min(rates):.1f}-{max(rates):.1f} GFLOP/s beside the cases" if rates else ""
    print(f"{device_name(device)}, torch {torch.__version__}, {torch.get_num_threads()} threads{rate}")
    print(markdown(results))


def _measured_beside_gemm(case: KernelCase, device: torch.device, repeats: int) -> KernelResult:
    """The case, and on CPU the GEMM rate of the same threads just before and after it (a shared
    machine's speed drifts within a run: each case is a share of the rate around it)."""
    before = gemm_flop_rate(device) if device.type == "cpu" else None
    result = measure_path(case, device, repeats)
    if before is None:
        return result
    return replace(result, gemm_flops=(before + gemm_flop_rate(device)) / 2)


if __name__ == "__main__":
    main()
