"""A sweep's results on disk: one JSON line per point, a CSV of the scalar columns, a table."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"

# What identifies a point, in the order tables and CSV show it.
POINT_KEYS = [
    "target",
    "grid",
    "points",
    "strategy",
    "ranks",
    "num_layers",
    "num_channels",
    "num_heads",
    "window_size",
    "mlp_hidden_ratio",
    "num_chunks",
    "batch_size",
    "precision",
    "device",
    "threads_per_rank",
]


def append_row(directory: Path, row: dict[str, Any]) -> None:
    """Add one point's row to ``directory/results.jsonl`` (points run one after another)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / RESULTS, "a") as f:
        f.write(json.dumps(row) + "\n")


def load_rows(directory: Path) -> list[dict[str, Any]]:
    path = directory / RESULTS
    if not path.exists():
        raise FileNotFoundError(f"no benchmark results in {directory} (expected {RESULTS})")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """Every column; lists and dicts are JSON-encoded."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in row.items()})
    return path


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The measured points as a Markdown table (skipped and failed points left out)."""
    head = (
        "| target | grid | points | layers | strategy | P | step time (s) | spread (s) | points/s | GFLOP/s "
        "| peak/rank (MiB) | sent/rank/layer (MiB) | analytic (MiB) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("status") != "ok":
            continue
        layers = r["num_layers"]
        lines.append(
            f"| {r['target']} | {r['grid']} | {r['points']} | {layers} | {r['strategy']} | {r['ranks']} "
            f"| {r['step_time_s']:.3f} | {r['step_time_min_s']:.3f}–{r['step_time_max_s']:.3f} "
            f"| {r['points_per_s']:.0f} | {r['processor_flop_per_s'] / 1e9:.1f} "
            f"| {r['peak_increase_bytes_max'] / 2**20:.0f} | {r['bytes_sent_max'] / layers / 2**20:.2f} "
            f"| {r['analytic_bytes_max'] / layers / 2**20:.2f} |"
        )
    return "\n".join(lines) + "\n"
