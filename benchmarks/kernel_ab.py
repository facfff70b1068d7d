"""The fused CPU attention kernel of the working tree against the same kernel at another git
revision, both built here and timed side by side in one process.

``python -m benchmarks.kernel_ab --baseline 5c53dd2`` compiles ``processor/attention/csrc`` as it
is at the baseline revision and as it is now (the same flags as ``scripts/setup.sh``), loads both,
and times forward+backward of one ``(1, heads, N, head_dim)`` call through each, round after
round, alternating; each call is a share of the fp32 GEMM rate measured just before and after
it on the same thread (a shared machine's speed drifts by tens of percent within minutes), and
the median share of each kernel is printed. Both kernels' outputs and gradients must agree (to
bfloat16's error where the working tree's products are bfloat16: ``--products bf16``, which with
``--baseline HEAD`` times the two kinds of products of the same kernel against each other).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from benchmarks.bf16_speedup import relative_rms
from benchmarks.gemm_rate import gemm_flop_rate
from processor.attention import native_build
from processor.host import cpu_name
from processor.plan.flops import window_pairs

CSRC = native_build.CSRC
ROOT = CSRC.parents[2]  # the repository
CPU = torch.device("cpu")


def checkout(revision: str, into: Path) -> tuple[Path, ...]:
    """``processor/attention/csrc`` at ``revision``, written into ``into``; its C++ sources (the
    ones :data:`native_build.SOURCES` names that the revision has: older ones have only the first)."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, "processor/attention/csrc/"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    for path in listing:
        text = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True, check=True, cwd=ROOT).stdout
        (into / Path(path).name).write_bytes(text)
    return tuple(into / source.name for source in native_build.SOURCES if (into / source.name).exists())


def compile_kernel(sources: tuple[Path, ...], name: str, build: Path, variant: str) -> ModuleType:
    """``sources`` built as the module ``name`` into ``build`` (the set-up's command for
    ``variant``), and loaded."""
    library = build / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(native_build.compile_command(sources, name, library, variant), check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_call(
    kernel: ModuleType, tensors: tuple[torch.Tensor, ...], window: int, bf16: bool = False
) -> tuple[float, list[torch.Tensor]]:
    """Seconds of one forward+backward, and (out, dq, dk, dv); ``bf16``: bfloat16 products (a
    kernel from before they existed takes no such argument)."""
    q, k, v, grad = tensors
    scale = q.shape[-1] ** -0.5
    products = {"bf16": True} if bf16 else {}
    start = time.perf_counter()
    out, lse = kernel.forward(q, k, v, window, 0, scale, None, None, **products)
    grads = kernel.backward(grad, q, k, v, out, lse, window, 0, scale, None, None, **products)
    return time.perf_counter() - start, [out, *grads]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision whose kernel is the baseline")
    parser.add_argument("--n", type=int, default=40320)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--variant",
        default="native",
        choices=list(native_build.VARIANT_FLAGS),
        help="build both kernels as this ISA variant (avx2 on an AVX-512 host: what an AVX2 host runs)",
    )
    parser.add_argument(
        "--products",
        default="fp32",
        choices=["fp32", "bf16"],
        help="the working tree's products (bf16: bfloat16 operands through oneDNN; the baseline's stay fp32)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        kernels = {
            args.baseline: compile_kernel(checkout(args.baseline, work), "kernel_baseline", work, args.variant),
            "working tree": compile_kernel(native_build.SOURCES, "kernel_working_tree", work, args.variant),
        }
    print(
        f"{cpu_name()}, {args.variant} build, working tree's products {args.products}, fwd+bwd, N = {args.n}, "
        f"{args.heads} heads, W = {args.window}, "
        f"{torch.get_num_threads()} thread(s); "
        f"median share of the GEMM rate around each call over {args.rounds} alternating rounds"
    )
    print("| head dim | " + " | ".join(kernels) + " | working tree / baseline |\n|---:|---:|---:|---:|")
    for dim in args.head_dim:
        g = torch.Generator().manual_seed(0)
        tensors = tuple(torch.randn(1, args.n, args.heads, dim, generator=g).transpose(1, 2) for _ in range(4))
        flops = 3 * 4 * args.heads * dim * window_pairs(args.n, args.window)
        shares: dict[str, list[float]] = {name: [] for name in kernels}
        results = {}
        for _ in range(args.rounds):
            for name, kernel in kernels.items():
                before = gemm_flop_rate(CPU, size=1024)
                bf16 = name == "working tree" and args.products == "bf16"
                seconds, results[name] = one_call(kernel, tensors, args.window, bf16)
                shares[name].append(flops / seconds / ((before + gemm_flop_rate(CPU, size=1024)) / 2))
        for a, b in zip(*results.values()):
            if args.products == "bf16":  # relative RMS: bfloat16's rounding of the operands
                assert relative_rms(a, b) < 2e-2
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        median = [statistics.median(s) for s in shares.values()]
        print(f"| {dim} | " + " | ".join(f"{m:.3f}" for m in median) + f" | {median[1] / median[0]:.2f}x |")


if __name__ == "__main__":
    main()
