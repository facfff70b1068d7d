"""The ``train`` part: the default training run on the GPU, one rank, bf16, as a subprocess
(``python -m training ...``, time-boxed); then, if its budget allows, the main job split over 2
ranks (``trainer.nprocs=2``, ``shard_sequence``) sharing the GPU (``debug.share_gpu=true``).
From each run directory: final train and validation loss, steps/s, samples/s and peak device
memory (``metrics.jsonl``), and the skill table (``skill.md``). ``--dry-run``: the same runs on
CPU, shrunk to seconds (4 steps on a small generated dataset)."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu.common import Budget, Context, PartFailed, last_line, log_tail, require_wheels, run_logged

# One GPU: one rank (the main job's other settings, i.e. the defaults).
ONE_RANK = ("trainer.nprocs=1", "trainer.ranks_per_model=1", "strategy=none")
SHARED = ("trainer.nprocs=2", "debug.share_gpu=true")  # 2 ranks of the defaults' shard_sequence, on one GPU
# --dry-run: the run shrunk to seconds on CPU (as tests/training/conftest.py's small config).
DRY_RUN = (
    "data.grid=o16",
    "data.generate_steps=40",
    "model.hidden_grid=o8",
    "model.num_layers=2",
    "model.num_channels=32",
    "model.num_heads=4",
    "model.window_size=40",
    "trainer.steps=4",
    "trainer.val_interval=2",
    "trainer.val_batches=1",
    "trainer.checkpoint_interval=4",
    "trainer.warmup_steps=1",
    "evaluate.steps=1",
    "evaluate.samples=1",
)
SECOND_RUN_FACTOR = 2.0  # the 2-rank run starts when at least this many times the first run's time is left


@dataclass(frozen=True)
class TrainRun:
    """One training run: its label, overrides, and what came of it."""

    label: str
    overrides: tuple[str, ...]
    run_dir: Path
    code: int | None = None
    seconds: float = 0.0
    note: str = ""


def command(ctx: Context, overrides: tuple[str, ...], run_dir: Path) -> list[str]:
    """``python -m training`` on the device, bf16, into ``run_dir``."""
    device = "cpu" if ctx.dry_run else "cuda"
    extra = (*DRY_RUN, f"data.path={ctx.scratch / 'data' / 'rossby_haurwitz_o16.zarr'}") if ctx.dry_run else ()
    if ctx.dry_run:  # no GPU to share: the CPU's ranks run as they always do
        overrides = tuple(o for o in overrides if not o.startswith("debug.share_gpu"))
    return [
        sys.executable, "-m", "training", f"trainer.device={device}", "trainer.precision=bf16", *overrides, *extra,
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip


def launch(ctx: Context, label: str, overrides: tuple[str, ...], name: str, timeout_s: float) -> TrainRun:
    """Run it, time-boxed; the exit code None when stopped at ``timeout_s``."""
    run_dir = ctx.scratch / "train" / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    argv = command(ctx, overrides, run_dir)
    print("train:", " ".join(argv[1:]), flush=True)
    env = dict(os.environ, HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    log = run_dir.with_suffix(".log")
    code, seconds = run_logged(argv, log, timeout_s, env)
    note = ""
    if code is None:
        note = f"stopped after {seconds:.0f} s (time box)"
    elif code != 0:
        note = f"exited {code}: {last_line(log_tail(log)).replace('|', '/')}"
    return TrainRun(label, overrides, run_dir, code, seconds, note)


def metrics(run_dir: Path) -> dict[str, float | None]:
    """Final train and validation loss, steps/s and samples/s (medians after the first tenth of
    the steps, the warm-up), peak device memory (GiB, max over the steps) and the step count."""
    from training.reporting.metrics_file import read_history

    history = [m for _, m in read_history(run_dir)]
    steps = [m for m in history if "train/loss" in m]
    val = [m["val/loss"] for m in history if "val/loss" in m]
    timed = steps[len(steps) // 10 :] or steps
    times = [m["step_time_s"] for m in timed if "step_time_s" in m]
    samples = [m["samples_per_s"] for m in timed if "samples_per_s" in m]
    peaks = [m["peak_device_memory_gib"] for m in steps if m.get("peak_device_memory_gib") is not None]
    return {
        "steps": float(len(steps)),
        "train_loss": steps[-1]["train/loss"] if steps else None,
        "val_loss": val[-1] if val else None,
        "steps_per_s": 1 / statistics.median(times) if times else None,
        "samples_per_s": statistics.median(samples) if samples else None,
        "peak_gib": max(peaks) if peaks else None,
    }


def _cell(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table(runs: list[TrainRun]) -> str:
    lines = [
        "| run | steps | wall s | final train loss | final val loss | steps/s | samples/s | peak device GiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        m = metrics(r.run_dir) if r.run_dir.exists() else {}
        steps = _cell(m.get("steps"), ".0f")
        wall = "—" if r.code is None and not r.seconds else f"{r.seconds:.0f}"
        cells = [_cell(m.get(k), f) for k, f in (("train_loss", ".4g"), ("val_loss", ".4g"), ("steps_per_s", ".1f"))]
        cells += [_cell(m.get("samples_per_s"), ".1f"), _cell(m.get("peak_gib"), ".3f")]
        lines.append(f"| {r.label} | {steps} | {wall} | {' | '.join(cells)} | {r.note} |")
    return "\n".join(lines)


def skill(run: TrainRun) -> list[str]:
    """The run's ``skill.md`` in a folded block, its headings one level down (inside the part's)."""
    path = run.run_dir / "skill.md"
    if not path.exists():
        return []
    text = [("#" + line if line.startswith("#") else line) for line in path.read_text().strip().splitlines()]
    summary = f"<details><summary>Skill of the {run.label.replace('`', '')} run (skill.md)</summary>"
    return ["", summary, "", *text, "", "</details>"]


def second_run(ctx: Context, first: TrainRun, budget: Budget) -> TrainRun:
    """The main job on 2 ranks of shard_sequence, sharing the GPU, if the budget allows it."""
    label = "2 ranks sharing the GPU, shard_sequence (`debug.share_gpu=true`)"
    if ctx.dry_run:
        label = "2 ranks, shard_sequence (CPU: no GPU to share)"
    if budget.left() < SECOND_RUN_FACTOR * first.seconds:
        note = f"skipped: {max(budget.left(), 0):.0f} s left of the {budget.seconds:.0f} s budget"
        return TrainRun(label, SHARED, ctx.scratch / "train" / "2-ranks-not-run", None, 0.0, note)
    return launch(ctx, label, SHARED, "2-ranks", budget.left())


def train_part(ctx: Context) -> str:
    """The ``train`` part's Markdown; :class:`PartFailed` when the 1-rank run fails."""
    require_wheels()
    budget = ctx.budget()
    first = launch(ctx, "1 rank, strategy=none", ONE_RANK, "1-rank", budget.left())
    if first.code != 0:
        print(log_tail(first.run_dir.with_suffix(".log")), flush=True)
        raise PartFailed(f"`python -m training` ({first.label}) {first.note}")
    runs = [first, second_run(ctx, first, budget)]
    shown = " ".join(command(ctx, ONE_RANK, Path("<run dir>"))[1:]).replace(str(ctx.scratch), "<scratch>")
    return "\n".join(
        [
            "### Training run on the device (bf16)",
            "",
            f"`python {shown}` (the 2-rank run: `trainer.nprocs=2` and the defaults' "
            "`strategy=shard_sequence`, with `debug.share_gpu=true`). Losses at the last step and the last "
            "validation; steps/s and samples/s: medians after the first tenth of the steps; peak device memory: "
            "`peak_device_memory_gib` of `metrics.jsonl`, the most over the steps.",
            "",
            table(runs),
            *skill(first),
            *skill(runs[1]),
        ]
    )
