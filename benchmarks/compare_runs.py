"""Training runs side by side: loss curves, seconds per step, peak memory, skill by lead.

``python -m benchmarks.compare_runs LABEL=RUN_DIR ... --plot FILE.png`` reads each run
directory (``metrics.jsonl``, ``evaluations.jsonl``) and prints one Markdown table (steps,
median seconds per step, peak RSS per rank, final validation loss, the RMSE ratio to
persistence of every variable and their mean at the leads asked for, and the centroid error
where the run scored one) and draws the training and validation losses of every run against
the step and against the wall time on one figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(label: str, run: Path, leads: list[int]) -> tuple[dict, list[dict]]:
    """One row of the table, and the run's step records."""
    steps = read_jsonl(run / "metrics.jsonl")
    evaluation = read_jsonl(run / "evaluations.jsonl")[-1]
    row = {
        "run": label,
        "steps": steps[-1]["step"] + 1,
        "s/step": float(np.median([s["step_time_s"] for s in steps])),
        "peak RSS/rank (GiB)": max(s["peak_rss_gib_mean_rank"] for s in steps),
        "val loss": [s["val/loss"] for s in steps if "val/loss" in s][-1],
    }
    variables = sorted({k.split("/")[2] for k in evaluation if k.startswith("eval/rmse/") and "/model/" in k})
    for lead in leads:
        ratios = [evaluation[f"eval/rmse/{v}/model_over_persistence/{lead:03d}h"] for v in variables]
        row[f"RMSE / persistence {lead} h ({', '.join(variables)})"] = " ".join(f"{r:.3f}" for r in ratios)
        row[f"mean {lead} h"] = float(np.mean(ratios))
        centroid = [
            v for k, v in evaluation.items() if k.startswith("eval/centroid_km/") and k.endswith(f"model/{lead:03d}h")
        ]
        if centroid:
            row[f"centroid error {lead} h (km)"] = centroid[0]
    return row, steps


def markdown(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [row.get(k, "") for k in keys]
        lines.append("| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for label, steps in curves.items():
        step = np.array([s["step"] for s in steps])
        wall = np.cumsum([s["step_time_s"] for s in steps])
        loss = np.array([s["train/loss"] for s in steps])
        smooth = np.convolve(loss, np.ones(25) / 25, mode="valid")
        val = [(s["step"], s["val/loss"]) for s in steps if "val/loss" in s]
        for ax, x in zip(axes, (step, wall)):
            (line,) = ax.plot(x[24:], smooth, label=f"{label}: training (25-step mean)", alpha=0.8)
            ax.plot(
                x[[v[0] for v in val]], [v[1] for v in val], "o-", color=line.get_color(), label=f"{label}: validation"
            )
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("training time (s, summed step times)")
    axes[0].set_ylabel("loss (normalised MSE)")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize="small")
    fig.suptitle("Training and validation loss of each run")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    parser.add_argument("--leads", type=int, nargs="+", default=[24, 48])
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    rows, curves = [], {}
    for item in args.runs:
        label, _, run = item.partition("=")
        row, steps = summary(label, Path(run), args.leads)
        rows.append(row)
        curves[label] = steps
    print(markdown(rows))
    if args.plot is not None:
        plot(curves, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
