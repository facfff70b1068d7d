"""The GPU check, one command: ``python -m benchmarks.gpu_check`` (or ``bash scripts/gpu_check.sh``).

On a machine with a CUDA GPU it runs these parts, each on its own with ``--only PART`` (a comma
list or repeated; default: all, in this order), each within its time budget:

- ``tests``: the CUDA tests (``pytest -m cuda`` on the ``test_cuda*.py`` files);
- ``kernel``: the windowed attention kernel alone, forward+backward, at o96 and n320 sizes,
  16 heads of 64, W = 512, bf16 and fp32, through every path, and anemoi's dense masked SDPA
  where it fits (goal: block-sparse >= 10x faster and >= 20x less memory);
- ``processor``: the processor (2 layers, C = 1024) forward+backward on one GPU at the same
  sizes, against the bf16 and fp32 GEMM measured in the same process (goal: bf16 >= 40%);
- ``train``: the default training run on the GPU (one rank, bf16; then the 2-rank
  shard_sequence setting sharing the GPU, if time allows), as a subprocess;
- ``sweep``: a benchmark sweep over layer counts and grids, one rank, bf16;
- ``parity``: ``python -m training.parity``, each strategy on 2 ranks sharing the GPU against
  one rank, fp32 and bf16.

``train``, ``sweep`` and ``parity`` need Hydra, MLflow and zarr (``scripts/gpu_wheels.sh``); the others
need only torch, einops, numpy and pytest. Each part writes its own block of the device's report
of the day, ``docs/benchmarks/gpu_check_<device>_<date>.md`` (:mod:`benchmarks.gpu.section`),
replacing only that block; a part that fails writes why in one line there, and the other parts
still run. A new report gets its line in the index of ``docs/benchmarks.md``.

Without a GPU it says why and exits 0, writing nothing. ``--dry-run`` runs the parts on the CPU
at toy sizes to check the code path (figures meaningless; printed, never written to the docs
unless ``--doc`` names a file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import torch

from benchmarks.gpu.common import ROOT, Context, PartFailed, device_name
from benchmarks.gpu.cuda_tests import tests_part
from benchmarks.gpu.kernels import kernel_part, processor_part
from benchmarks.gpu.parity import parity_part
from benchmarks.gpu.section import BEGIN, add_to_index, compose, report_path, write_section
from benchmarks.gpu.sweep import sweep_part
from benchmarks.gpu.train import train_part

PARTS: dict[str, Callable[[Context], str]] = {
    "tests": tests_part,
    "kernel": kernel_part,
    "processor": processor_part,
    "train": train_part,
    "sweep": sweep_part,
    "parity": parity_part,
}
TITLES = {
    "tests": "CUDA tests",
    "kernel": "Attention kernel",
    "processor": "Processor forward+backward on one device",
    "train": "Training run on the device",
    "sweep": "Benchmark sweep on one device",
    "parity": "Parity: every strategy against one rank",
}
BUDGET_S = 480.0  # each part's, so that it ends within 9 minutes on an H100
REPORTS = ROOT / "docs" / "benchmarks"  # the dated reports; their index is the page beside the folder
INDEX_PAGE = ROOT / "docs" / "benchmarks.md"


def selected_parts(only: list[str] | None) -> list[str]:
    """The parts ``--only`` names (comma lists, repeatable), in the canonical order; all without it."""
    if not only:
        return list(PARTS)
    names = {n.strip() for item in only for n in item.split(",") if n.strip()}
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise SystemExit(f"gpu_check: unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    return [p for p in PARTS if p in names]


def run_part(name: str, ctx: Context) -> tuple[str, bool]:
    """The part's Markdown and whether it succeeded. A failure (any exception) becomes one
    line, with the traceback printed; it never stops the other parts."""
    start = time.monotonic()
    print(f"gpu_check: part {name} ...", flush=True)
    try:
        body, ok = PARTS[name](ctx), True
    except PartFailed as exc:
        body, ok = f"### {TITLES[name]}\n\n**failed**: {exc.line}\n\n{exc.details}".rstrip(), False
    except Exception as exc:
        traceback.print_exc()
        message = (str(exc).strip().splitlines() or [""])[0][:200]
        body, ok = f"### {TITLES[name]}\n\n**failed**: {type(exc).__name__}: {message}", False
    seconds = time.monotonic() - start
    stamp = f"_`--only {name}`: {'done' if ok else 'failed'} in {seconds:.0f} s ({datetime.now():%H:%M})._"
    print(f"gpu_check: part {name} {'done' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
    return f"{body}\n\n{stamp}", ok


def default_doc(device: torch.device) -> Path:
    """The report the check writes by default: the device's of today, in :data:`REPORTS`."""
    return report_path(REPORTS, device_name(device), date.today().isoformat())


def index_line(doc: Path, device: torch.device, page: Path) -> str:
    """The report's line in the index on ``page``: a link to it, the device and the day."""
    link = Path(os.path.relpath(doc.resolve(), page.resolve().parent)).as_posix()
    return f"- [{doc.name}]({link}): the GPU check on {device_name(device)}, {date.today().isoformat()}."


def header(device: torch.device) -> tuple[str, str]:
    """The section's begin line (device and day) and its header, whose first line is the report's title."""
    name, today = device_name(device), date.today().isoformat()
    cuda = torch.version.cuda or "none"
    return BEGIN.format(f"{name} {today}"), "\n".join(
        [
            f"# GPU check ({today}, {name})",
            "",
            f"`bash scripts/gpu_check.sh` (`python -m benchmarks.gpu_check`); torch {torch.__version__}, "
            f"CUDA {cuda}, one device. Each part below is written by `--only PART` alone (the day's other "
            "parts are kept).",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="PART[,PART]", help=f"of {', '.join(PARTS)}")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: run the code on CPU at toy sizes")
    parser.add_argument(
        "--doc", type=Path, default=None, help="where to write (default on a GPU: the device's report of the day)"
    )
    parser.add_argument(
        "--index",
        type=Path,
        default=None,
        help="the page that lists the reports (default with the default --doc: docs/benchmarks.md)",
    )
    parser.add_argument("--section-out", type=Path, default=None, help="also write the section alone here")
    parser.add_argument("--skip-tests", action="store_true", help="leave the tests part out")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="each part's time budget")
    parser.add_argument("--scratch", type=Path, default=None, help="the runs' folder (default outputs/gpu_check/<now>)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, writing each one's block as it ends; 1 if any part failed."""
    args = parse_args(argv)
    names = [n for n in selected_parts(args.only) if not (args.skip_tests and n == "tests")]
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu_check: skipped: no CUDA device (torch.cuda.is_available() is False); nothing run, nothing written")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    scratch = args.scratch or ROOT / "outputs" / "gpu_check" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}"
    scratch.mkdir(parents=True, exist_ok=True)
    doc = args.doc or (default_doc(device) if device.type == "cuda" else None)
    index = args.index or (INDEX_PAGE if args.doc is None and doc is not None else None)
    ctx = Context(device, args.budget_s, scratch, doc)
    begin, head = header(device)
    blocks, failed, text = {}, [], ""
    for name in names:
        blocks[name], ok = run_part(name, ctx)
        failed += [] if ok else [name]
        print(blocks[name], flush=True)
        if doc is not None:
            doc.parent.mkdir(parents=True, exist_ok=True)
            text = write_section(doc, begin, head, {name: blocks[name]}, tuple(PARTS))
    if doc is not None and index is not None and add_to_index(index, doc, index_line(doc, device, index)):
        print(f"gpu_check: listed {doc.name} in {index}")
    text = text or compose(begin, head, blocks, tuple(PARTS))
    if args.section_out is not None:
        args.section_out.write_text(text + "\n")
    for path in (doc, args.section_out):
        if path is not None:
            print(f"gpu_check: wrote {path}")
    tail = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"gpu_check: {len(names) - len(failed)} of {len(names)} parts done{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
