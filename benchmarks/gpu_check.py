"""The GPU check, one command: ``python -m benchmarks.gpu_check`` (or ``bash scripts/gpu_check.sh``).

On a machine with a CUDA GPU and PyTorch (nothing else fetched: it needs torch, einops, numpy
and pytest) it

1. runs the CUDA tests (``pytest -m cuda`` on the ``test_cuda*.py`` files);
2. times a bf16 and an fp32 dense GEMM (8192³) in this process, the yardstick;
3. times the windowed attention kernel alone, forward+backward, at o96 (40 320 points) and n320
   (542 080) sizes, 16 heads of 64 (C = 1024), W = 512, bf16 and fp32, through every path that
   runs there, and anemoi's approach (one SDPA call under an ``N x N`` mask) where it fits;
4. times the processor (2 layers, C = 1024, H = 16, W = 512) forward+backward on one GPU at
   the same sizes: TFLOP/s from the band model, peak memory, and their fraction of the GEMM;
5. writes it all, dated and with the device's name, as a section of ``docs/benchmarks.md``
   (replacing that day's section for the same device), and checks the issue's goals.

Without a GPU it says why and exits 0, writing nothing. ``--dry-run`` runs steps 2–5 on the
CPU at toy sizes to check the code path (figures meaningless; printed, never written to the
docs unless ``--doc`` names a file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from benchmarks.attention_paths import DTYPES, KernelCase, KernelResult, markdown, measure_path, timed
from benchmarks.flops import processor_flops
from processor import ProcessorConfig, TransformerProcessor

ROOT = Path(__file__).resolve().parent.parent
GRID_POINTS = {"o96": 40320, "n320": 542080}
DRY_RUN_POINTS = {"o96/64": 630, "n320/64": 8470}  # the same grids' sizes / 64, for --dry-run
HEADS, HEAD_DIM, WINDOW = 16, 64, 512
BEGIN, END = "<!-- gpu_check:begin {} -->", "<!-- gpu_check:end -->"


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


def gemm_tflops(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Dense ``size³`` matmul rate in this process (TF32 off for fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    seconds, _ = timed(lambda: a @ b, device, repeats, warmup=1)
    return 2 * size**3 / seconds / 1e12


def measure_processor(
    grid: str, n: int, dtype: str, path: str, device: torch.device, channels: int, layers: int, repeats: int = 3
) -> ProcessorResult:
    """Forward+backward of a ``layers``-layer processor on ``(1, n, channels)``; ``dtype`` bf16
    runs under autocast (fp32 parameters)."""
    config = ProcessorConfig(
        num_layers=layers, num_channels=channels, num_heads=HEADS, window_size=WINDOW, num_chunks=0,
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
    flops = processor_flops(n, channels, WINDOW, layers, config.mlp_hidden_ratio)
    return ProcessorResult(grid, n, dtype, path, seconds, peak, flops / seconds / 1e12)


def dense_mask_fits(n: int, device: torch.device) -> bool:
    """Whether anemoi's ``N x N`` mask (bool, and SDPA's additive copy) fits in half the free memory."""
    if device.type != "cuda":
        return n <= 4096
    free, _ = torch.cuda.mem_get_info(device)
    return 3 * n * n < free / 2


def run_cuda_tests() -> tuple[int, str]:
    """``pytest -m cuda`` on the CUDA test files: its exit code and last line."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_cuda*.py"))
    command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *files]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else "(no output)"


def kernel_results(device: torch.device, sizes: dict[str, int], head_dim: int) -> list[KernelResult]:
    """Every path at every size and dtype, forward+backward; dense only where its mask fits."""
    results = []
    for n in sizes.values():
        for dtype in ("bf16", "fp32"):
            for path in ("flash_attn", "flex", "sdpa_blocks", "dense"):
                case = KernelCase(n, HEADS, head_dim, WINDOW, dtype, path, backward=True)
                if path == "dense" and not dense_mask_fits(n, device):
                    results.append(
                        KernelResult(case, None, None, f"N x N mask ({3 * n * n / 2**30:.1f} GiB) does not fit")
                    )
                else:
                    results.append(measure_path(case, device))
                print(markdown(results[-1:]).splitlines()[-1], flush=True)
    return results


def processor_results(device: torch.device, sizes: dict[str, int], channels: int) -> list[ProcessorResult]:
    results = []
    for grid, n in sizes.items():
        for dtype in ("bf16", "fp32"):
            paths = ["auto"] + (["dense"] if dense_mask_fits(n, device) else [])
            for path in paths:
                results.append(measure_processor(grid, n, dtype, path, device, channels, layers=2))
                print(results[-1], flush=True)
    return results


def goals(kernels: list[KernelResult], processors: list[ProcessorResult], gemm_bf16: float, n_small: int) -> list[str]:
    """The issue's goals, each as a line saying met or not, with the figures."""
    lines = []
    at_small = [r for r in kernels if r.case.n == n_small and r.case.dtype == "bf16" and r.seconds is not None]
    dense = next((r for r in at_small if r.case.path == "dense"), None)
    sparse = [r for r in at_small if r.case.path in ("flex", "flash_attn")]
    if dense and sparse:
        best = min(sparse, key=lambda r: r.seconds)
        speed = dense.seconds / best.seconds
        memory = (dense.peak_bytes or 0) / max(best.peak_bytes or 1, 1)
        lines.append(
            f"- block-sparse kernel ({best.case.path}) vs dense masked SDPA at N = {n_small}, bf16 fwd+bwd: "
            f"{speed:.1f}x faster (goal >= 10x: {'met' if speed >= 10 else 'NOT met'}), "
            f"{memory:.1f}x less memory (goal >= 20x: {'met' if memory >= 20 else 'NOT met'})"
        )
    for r in processors:
        if r.path == "auto" and r.dtype == "bf16" and r.tflops is not None:
            share = r.tflops / gemm_bf16
            lines.append(
                f"- processor fwd+bwd at {r.grid}, bf16: {r.tflops:.1f} TFLOP/s = {share:.0%} of the bf16 GEMM's "
                f"{gemm_bf16:.1f} (goal >= 40%: {'met' if share >= 0.4 else 'NOT met'})"
            )
    return lines


def processor_markdown(results: list[ProcessorResult], gemm: dict[str, float]) -> str:
    lines = [
        "| grid | N | dtype | attention | ms | TFLOP/s | of the GEMM | peak GiB | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ms = "—" if r.seconds is None else f"{r.seconds * 1e3:.1f}"
        tf = "—" if r.tflops is None else f"{r.tflops:.2f}"
        share = "—" if r.tflops is None else f"{r.tflops / gemm[r.dtype]:.0%}"
        peak = "—" if r.peak_bytes is None else f"{r.peak_bytes / 2**30:.2f}"
        lines.append(f"| {r.grid} | {r.n} | {r.dtype} | {r.path} | {ms} | {tf} | {share} | {peak} | {r.note} |")
    return "\n".join(lines)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run: toy sizes, not figures)"


def section(
    device: torch.device, tests: str, gemm: dict[str, float], gemm_size: int, kernels, processors, goal_lines
) -> str:
    name, today = device_name(device), date.today().isoformat()
    cuda = torch.version.cuda or "none"
    return "\n".join(
        [
            BEGIN.format(f"{name} {today}"),
            f"## GPU check ({today}, {name})",
            "",
            f"`python -m benchmarks.gpu_check`; torch {torch.__version__}, CUDA {cuda}, one device. "
            f"CUDA tests: {tests}. Dense GEMM ({gemm_size}³, in this process): bf16 {gemm['bf16']:.1f} TFLOP/s, "
            f"fp32 (no TF32) {gemm['fp32']:.1f} TFLOP/s. Useful FLOPs by the band model "
            "(`benchmarks/flops.py`); peak memory above the inputs (kernel) or in all (processor).",
            "",
            "Goals:",
            *(goal_lines or ["- (no goal could be checked: see the tables)"]),
            "",
            f"### Attention kernel, forward+backward, {HEADS} heads, W = {WINDOW}",
            "",
            markdown(kernels),
            "",
            f"### Processor forward+backward on one device (2 layers, W = {WINDOW})",
            "",
            processor_markdown(processors, gemm),
            END,
        ]
    )


def write_section(doc: Path, text: str) -> None:
    """Put ``text`` at the end of ``doc``, replacing an earlier section with the same begin line."""
    old = doc.read_text() if doc.exists() else ""
    begin = text.splitlines()[0]
    if begin in old:
        head, rest = old.split(begin, 1)
        old = head + rest.split(END, 1)[1].lstrip("\n")
    doc.write_text(old.rstrip("\n") + "\n\n" + text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: run the code on CPU at toy sizes")
    parser.add_argument("--doc", type=Path, default=None, help="where to write (default docs/benchmarks.md on a GPU)")
    parser.add_argument("--section-out", type=Path, default=None, help="also write the section alone here")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu_check: skipped: no CUDA device (torch.cuda.is_available() is False); nothing run, nothing written")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    sizes = GRID_POINTS if device.type == "cuda" else DRY_RUN_POINTS
    head_dim, channels, gemm_size = (HEAD_DIM, HEADS * HEAD_DIM, 8192) if device.type == "cuda" else (16, 64, 512)
    code, tests = (0, "not run") if args.skip_tests or device.type != "cuda" else run_cuda_tests()
    gemm = {d: gemm_tflops(device, DTYPES[d], gemm_size) for d in ("bf16", "fp32")}
    kernels = kernel_results(device, sizes, head_dim)
    processors = processor_results(device, sizes, channels)
    goal_lines = goals(kernels, processors, gemm["bf16"], min(sizes.values()))
    text = section(device, tests, gemm, gemm_size, kernels, processors, goal_lines)
    print(text)
    doc = args.doc or (ROOT / "docs" / "benchmarks.md" if device.type == "cuda" else None)
    if doc is not None:
        write_section(doc, text)
    if args.section_out is not None:
        args.section_out.write_text(text + "\n")
    for path in (doc, args.section_out):
        if path is not None:
            print(f"gpu_check: wrote {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
