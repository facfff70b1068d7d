"""The ``kernel`` and ``processor`` parts: the windowed attention kernel alone, and the processor
forward+backward on one GPU, at o96 (40 320 points) and n320 (542 080) sizes, 16 heads of 64
(C = 1024), W = 512, bf16 and fp32. Their goals: the block-sparse kernel >= 10x faster and
>= 20x less memory than anemoi's dense masked SDPA; the processor's bf16 rate >= 40% of the
bf16 GEMM measured in the same process. ``--dry-run``: the same code on CPU at toy sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.attention_paths import KernelCase, KernelResult, markdown, measure_path, timed
from benchmarks.gpu.common import Budget, Context, gemm_tflops, rate
from processor import ProcessorConfig, TransformerProcessor
from processor.plan.flops import processor_flops

GRID_POINTS = {"o96": 40320, "n320": 542080}
HEADS, HEAD_DIM, WINDOW = 16, 64, 512
DRY_RUN_POINTS = {"o96/64": 630, "n320/256": 2118}  # --dry-run: the grids' sizes shrunk, and W = 40
DRY_RUN_WINDOW, DRY_RUN_GEMM = 40, 512
DTYPE = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class ProcessorResult:
    grid: str
    n: int
    dtype: str
    path: str
    seconds: float | None
    peak_bytes: int | None
    tflops: float | None
    note: str = ""


@dataclass(frozen=True)
class Sizes:
    """The grids, head size, channels, window and GEMM size of a run: the real ones on a GPU,
    toys on CPU."""

    points: dict[str, int]
    head_dim: int
    channels: int
    window: int
    gemm: int

    @staticmethod
    def of(ctx: Context) -> Sizes:
        if ctx.dry_run:
            return Sizes(DRY_RUN_POINTS, 16, 64, DRY_RUN_WINDOW, DRY_RUN_GEMM)
        return Sizes(GRID_POINTS, HEAD_DIM, HEADS * HEAD_DIM, WINDOW, 8192)


def measure_processor(
    grid: str, n: int, dtype: str, path: str, device: torch.device, channels: int, window: int, repeats: int = 3
) -> ProcessorResult:
    """Forward+backward of a 2-layer processor on ``(1, n, channels)``; ``dtype`` bf16 runs under
    autocast (fp32 parameters)."""
    layers = 2
    config = ProcessorConfig(
        num_layers=layers, num_channels=channels, num_heads=HEADS, window_size=window, num_chunks=0,
        attention_path=path,
    )  # fmt: skip
    try:
        model = TransformerProcessor(config).to(device)
        x = torch.randn(1, n, channels, device=device, requires_grad=True)

        def step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                y = model(x)
            y.float().square().mean().backward()

        seconds, peak = timed(step, device, repeats, warmup=2)
    except (torch.OutOfMemoryError, ValueError) as exc:
        return ProcessorResult(grid, n, dtype, path, None, None, None, str(exc).splitlines()[0][:120])
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    flops = processor_flops(n, channels, window, layers, config.mlp_hidden_ratio)
    return ProcessorResult(grid, n, dtype, path, seconds, peak, flops / seconds / 1e12)


def dense_mask_fits(n: int, device: torch.device) -> bool:
    """Whether anemoi's ``N x N`` mask (bool, and SDPA's additive copy) fits in half the free memory."""
    if device.type != "cuda":
        return n <= 4096
    free, _ = torch.cuda.mem_get_info(device)
    return 3 * n * n < free / 2


def kernel_results(device: torch.device, sizes: Sizes, budget: Budget) -> list[KernelResult]:
    """Every path at every size and dtype, forward+backward; dense only where its mask fits;
    the cases left once ``budget`` is spent are skipped, saying so."""
    results = []
    for n in sizes.points.values():
        for dtype in ("bf16", "fp32"):
            for path in ("flash_attn", "flex", "sdpa_blocks", "dense"):
                case = KernelCase(n, HEADS, sizes.head_dim, sizes.window, dtype, path, backward=True)
                if budget.spent():
                    results.append(KernelResult(case, None, None, budget.note()))
                elif path == "dense" and not dense_mask_fits(n, device):
                    note = f"N x N mask ({3 * n * n / 2**30:.1f} GiB) does not fit"
                    results.append(KernelResult(case, None, None, note))
                else:
                    results.append(measure_path(case, device))
                print(markdown(results[-1:]).splitlines()[-1], flush=True)
    return results


def processor_results(device: torch.device, sizes: Sizes, budget: Budget) -> list[ProcessorResult]:
    """Two layers, the automatic attention path (and dense where its mask fits), bf16 and fp32."""
    results = []
    for grid, n in sizes.points.items():
        for dtype in ("bf16", "fp32"):
            for path in ["auto"] + (["dense"] if dense_mask_fits(n, device) else []):
                if budget.spent():
                    results.append(ProcessorResult(grid, n, dtype, path, None, None, None, budget.note()))
                else:
                    results.append(measure_processor(grid, n, dtype, path, device, sizes.channels, sizes.window))
                print(results[-1], flush=True)
    return results


def kernel_goal(kernels: list[KernelResult], n_small: int) -> list[str]:
    """The kernel's goal at the smaller size, bf16, as a line saying met or not, with the figures."""
    at_small = [r for r in kernels if r.case.n == n_small and r.case.dtype == "bf16" and r.seconds is not None]
    dense = next((r for r in at_small if r.case.path == "dense"), None)
    sparse = [r for r in at_small if r.case.path in ("flex", "flash_attn")]
    if not (dense and sparse):
        return []
    best = min(sparse, key=lambda r: r.seconds or 0.0)
    speed = (dense.seconds or 0.0) / (best.seconds or 1.0)
    memory = (dense.peak_bytes or 0) / max(best.peak_bytes or 1, 1)
    return [
        f"- block-sparse kernel ({best.case.path}) vs dense masked SDPA at N = {n_small}, bf16 fwd+bwd: "
        f"{speed:.1f}x faster (goal >= 10x: {'met' if speed >= 10 else 'NOT met'}), "
        f"{memory:.1f}x less memory (goal >= 20x: {'met' if memory >= 20 else 'NOT met'})"
    ]


def processor_goals(processors: list[ProcessorResult], gemm_bf16: float) -> list[str]:
    """The processor's goal at each size, bf16, automatic path."""
    lines = []
    for r in processors:
        if r.path == "auto" and r.dtype == "bf16" and r.tflops is not None:
            share = r.tflops / gemm_bf16
            lines.append(
                f"- processor fwd+bwd at {r.grid}, bf16: {rate(r.tflops)} TFLOP/s = {share:.0%} of the bf16 GEMM's "
                f"{rate(gemm_bf16)} (goal >= 40%: {'met' if share >= 0.4 else 'NOT met'})"
            )
    return lines


def processor_markdown(results: list[ProcessorResult], gemm: dict[str, float]) -> str:
    lines = [
        "| grid | N | dtype | attention | ms | TFLOP/s | of the GEMM | peak GiB | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ms = "—" if r.seconds is None else f"{r.seconds * 1e3:.1f}"
        tf = "—" if r.tflops is None else rate(r.tflops)
        share = "—" if r.tflops is None else f"{r.tflops / gemm[r.dtype]:.0%}"
        peak = "—" if r.peak_bytes is None else f"{r.peak_bytes / 2**30:.2f}"
        lines.append(f"| {r.grid} | {r.n} | {r.dtype} | {r.path} | {ms} | {tf} | {share} | {peak} | {r.note} |")
    return "\n".join(lines)


def _goal_block(lines: list[str], why_not: str) -> list[str]:
    return ["Goal:", *(lines or [f"- (not checked: {why_not})"]), ""]


def kernel_part(ctx: Context) -> str:
    """The ``kernel`` part's Markdown."""
    sizes = Sizes.of(ctx)
    results = kernel_results(ctx.device, sizes, ctx.budget())
    goal = kernel_goal(results, min(sizes.points.values()))
    return "\n".join(
        [
            f"### Attention kernel, forward+backward, {HEADS} heads × {sizes.head_dim}, W = {sizes.window}",
            "",
            "Useful FLOPs by the band model (`processor/plan/flops.py`); peak device memory above the inputs "
            "(`torch.cuda.max_memory_allocated`, reset per case); time per call: CUDA events around 5 calls after 2 "
            "warm-ups, synchronised once.",
            "",
            *_goal_block(goal, "dense SDPA or no block-sparse path ran at the smaller size"),
            markdown(results),
        ]
    )


def processor_part(ctx: Context) -> str:
    """The ``processor`` part's Markdown, with the GEMM yardstick measured in this process."""
    sizes = Sizes.of(ctx)
    gemm = {d: gemm_tflops(ctx.device, DTYPE[d], sizes.gemm) for d in ("bf16", "fp32")}
    results = processor_results(ctx.device, sizes, ctx.budget())
    return "\n".join(
        [
            f"### Processor forward+backward on one device (2 layers, C = {sizes.channels}, W = {sizes.window})",
            "",
            f"Dense GEMM ({sizes.gemm}³, in this process): bf16 {rate(gemm['bf16'])} TFLOP/s, "
            f"fp32 (no TF32) {rate(gemm['fp32'])} TFLOP/s. Peak device memory in all (weights, input, "
            "activations), reset per case; time per step: CUDA events around 3 steps after 2 warm-ups.",
            "",
            *_goal_block(processor_goals(results, gemm["bf16"]), "no bf16 row ran"),
            processor_markdown(results, gemm),
        ]
    )
