"""The ``parity`` part: ``python -m training.parity`` on the device, each strategy of the default
run on its 2 ranks sharing the GPU (``debug.share_gpu=true``: NCCL needs a GPU per rank,
so the ranks' messages go through host memory over gloo) against one rank at fp32, and
shard_sequence at bf16 too, as subprocesses, time-boxed; its verdict line per run.
``--dry-run``: the same on CPU, shrunk."""

from __future__ import annotations

import os
import shutil
import sys

from benchmarks.gpu.common import Context, PartFailed, last_line, log_tail, require_wheels, run_logged
from benchmarks.gpu.train import DRY_RUN

CASES = (  # (strategy, precision)
    ("shard_sequence", "fp32"),
    ("shard_heads", "fp32"),
    ("shard_channels", "fp32"),
    ("shard_sequence", "bf16"),
)
VERDICT = "parity: "


def parity_command(ctx: Context, strategy: str, precision: str, name: str) -> list[str]:
    """``python -m training.parity`` of the default run's 2 ranks under ``strategy``."""
    if ctx.dry_run:
        data = f"data.path={ctx.scratch / 'data' / 'rossby_haurwitz_o16.zarr'}"
        device = ("trainer.device=cpu", *DRY_RUN, data)
    else:
        device = ("trainer.device=cuda", "debug.share_gpu=true", "trainer.nprocs=2")  # a GPU derives one rank
    run_dir = ctx.scratch / "parity" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    return [
        sys.executable, "-m", "training.parity", *device, f"strategy={strategy}",
        f"trainer.precision={precision}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip


def parity_part(ctx: Context) -> str:
    """The ``parity`` part's Markdown; :class:`PartFailed` when no case ran to a verdict."""
    require_wheels()
    budget = ctx.budget()
    rows, verdicts = [], 0
    for strategy, precision in CASES:
        name = f"{strategy}-{precision}"
        if budget.spent():
            rows.append(f"| {strategy} | {precision} | — | — | {budget.note()} |")
            continue
        argv = parity_command(ctx, strategy, precision, name)
        print("parity:", " ".join(argv[1:]), flush=True)
        log = ctx.scratch / "parity" / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        code, seconds = run_logged(argv, log, budget.left(), env)
        text = log.read_text(errors="replace") if log.exists() else ""
        lines = [line for line in text.splitlines() if line.startswith(VERDICT)]
        verdicts += bool(lines)
        said = lines[-1] if lines else last_line(log_tail(log))
        shown = "— (time box)" if code is None else str(code)
        rows.append(f"| {strategy} | {precision} | {shown} | {seconds:.0f} | {said.replace('|', '/')} |")
    if not verdicts:
        raise PartFailed("`python -m training.parity` gave no verdict: " + rows[0])
    return "\n".join(
        [
            "### Parity: every strategy against one rank (`python -m training.parity`)",
            "",
            "The default run's 2 ranks sharing the GPU (`debug.share_gpu=true`), 3 steps from the same "
            "parameters on the same batches; the worst relative difference over the loss, every gradient and every "
            "parameter after the optimiser step (exit code 0: within the tolerance, 4: a breach).",
            "",
            "| strategy | precision | exit code | wall s | verdict |",
            "|---|---|---:|---:|---|",
            *rows,
        ]
    )
