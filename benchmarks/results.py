"""A sweep's results on disk: one JSON line per point, a CSV of the scalar columns, a table.

Bytes are stored in bytes under keys that say what they count (``bytes_sent_per_step_max``,
``bytes_sent_per_layer_max``: the most loaded rank, forward+backward); the console, the tables
and the plots show them in MiB (2**20 bytes) under the column names below.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"
MIB = 2**20

# One name per quantity wherever it is shown: console, results.md, plots, the reports in docs/benchmarks/.
PEAK_COLUMN = "peak/rank (MiB)"
DEVICE_PEAK_COLUMN = "peak device/rank (MiB)"  # CUDA points: torch.cuda.max_memory_allocated, model and inputs too
SENT_STEP_COLUMN = "sent/rank/step (MiB)"
SENT_LAYER_COLUMN = "sent/rank/layer (MiB)"
ANALYTIC_LAYER_COLUMN = "analytic/rank/layer (MiB)"

# Keys of rows stored before the bytes keys said per step: old name -> today's.
_RENAMED = {"bytes_sent_max": "bytes_sent_per_step_max", "analytic_bytes_max": "analytic_bytes_per_step_max"}

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


def upgrade_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` under today's keys: older rows' per-step bytes renamed, per-layer bytes filled in."""
    row = {_RENAMED.get(k, k): v for k, v in row.items()}
    layers = row.get("num_layers")
    if row.get("status") == "ok" and layers:
        for kind in ("bytes_sent", "analytic_bytes"):
            step, layer = f"{kind}_per_step_max", f"{kind}_per_layer_max"
            if layer not in row and step in row:
                row[layer] = row[step] / layers
            if step not in row and layer in row:
                row[step] = row[layer] * layers
    return row


def load_rows(directory: Path) -> list[dict[str, Any]]:
    """The rows of ``directory/results.jsonl`` (old rows read under today's keys)."""
    path = directory / RESULTS
    if not path.exists():
        raise FileNotFoundError(f"no benchmark results in {directory} (expected {RESULTS})")
    return [upgrade_row(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


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
    """The measured points as a Markdown table (skipped and failed points left out); a column of
    the nodes each point's ranks ran on when a sweep under torchrun spanned several, and one of
    the peak device memory per rank (all of it: model, inputs, step) when some ran on CUDA."""
    ok = [r for r in rows if r.get("status") == "ok"]
    nodes = any(r.get("nodes", 1) > 1 for r in ok)
    device = any(r.get("device") == "cuda" for r in ok)
    head = (
        f"| target | grid | points | layers | strategy | P |{' nodes |' if nodes else ''} step time (s) | spread (s) "
        f"| points/s | GFLOP/s | {PEAK_COLUMN} |{f' {DEVICE_PEAK_COLUMN} |' if device else ''} {SENT_LAYER_COLUMN} "
        f"| {ANALYTIC_LAYER_COLUMN} |"
    )
    lines = [host_line(ok), "", head, "|" + "---|" * (head.count("|") - 1)]
    for r in ok:
        node_cell = f" {r.get('nodes', 1)} |" if nodes else ""
        device_cell = f" {_device_peak(r)} |" if device else ""
        lines.append(
            f"| {r['target']} | {r['grid']} | {r['points']} | {r['num_layers']} | {r['strategy']} | {r['ranks']} "
            f"|{node_cell} {r['step_time_s']:.3f} | {r['step_time_min_s']:.3f}–{r['step_time_max_s']:.3f} "
            f"| {r['points_per_s']:.0f} | {r['processor_flop_per_s'] / 1e9:.1f} "
            f"| {r['peak_increase_bytes_max'] / MIB:.0f} |{device_cell} {r['bytes_sent_per_layer_max'] / MIB:.2f} "
            f"| {r['analytic_bytes_per_layer_max'] / MIB:.2f} |"
        )
    return "\n".join(lines) + "\n"


def host_line(rows: list[dict[str, Any]]) -> str:
    """Where the rows were measured: each CPU (model and vector extensions), torch, and the
    devices, so that a reader knows which kind of machine a figure is from."""
    cpus = sorted({str(r["cpu"]) for r in rows if r.get("cpu")}) or ["unknown CPU"]
    torches = sorted({str(r["torch"]) for r in rows if r.get("torch")})
    devices = sorted({str(r.get("device", "cpu")) for r in rows})
    return f"Measured on {'; '.join(cpus)}, torch {', '.join(torches) or '?'}, device {', '.join(devices)}."


def _device_peak(row: dict[str, Any]) -> str:
    """The most device memory any rank of a CUDA point held (MiB); a dash for a CPU point."""
    peaks = row.get("peak_bytes_per_rank")
    return f"{max(peaks) / MIB:.0f}" if row.get("device") == "cuda" and peaks else "—"


def _mib(text: str) -> float:
    """Bytes from a MiB cell."""
    return float(text) * MIB


def _spread(text: str) -> dict[str, float]:
    """The fastest and slowest step from a ``min–max`` cell."""
    low, high = text.replace("-", "–").split("–")
    return {"step_time_min_s": float(low), "step_time_max_s": float(high)}


# Columns of a results.md table (or one copied into the docs) and the row keys they hold.
_MARKDOWN_COLUMNS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "target": ("target", str),
    "grid": ("grid", str),
    "points": ("points", int),
    "layers": ("num_layers", int),
    "strategy": ("strategy", str),
    "P": ("ranks", int),
    "nodes": ("nodes", int),
    "step time (s)": ("step_time_s", float),
    PEAK_COLUMN: ("peak_increase_bytes_max", _mib),
    SENT_LAYER_COLUMN: ("bytes_sent_per_layer_max", _mib),
    ANALYTIC_LAYER_COLUMN: ("analytic_bytes_per_layer_max", _mib),
    "analytic (MiB)": ("analytic_bytes_per_layer_max", _mib),  # the header before the rename
}


def _table_lines(text: str, after: str | None) -> list[str]:
    """The first Markdown table in ``text`` (after the first line starting with ``after``)."""
    lines = text.splitlines()
    if after is not None:
        starts = [i for i, line in enumerate(lines) if line.startswith(after)]
        if not starts:
            raise ValueError(f"no line starting with {after!r}")
        lines = lines[starts[0] :]
    first = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if first is None:
        raise ValueError("no Markdown table found")
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


def markdown_rows(text: str, after: str | None = None, defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows read back from a results table (MiB and seconds as printed); ``defaults`` fill in
    what the table leaves out, e.g. ``num_layers`` of a docs table without that column."""
    head, _, *body = _table_lines(text, after)
    names = [c.strip() for c in head.strip("|").split("|")]
    rows = []
    for line in body:
        row: dict[str, Any] = {"status": "ok", **(defaults or {})}
        for name, cell in zip(names, (c.strip() for c in line.strip("|").split("|"))):
            if name == "spread (s)":
                row |= _spread(cell)
            elif name in _MARKDOWN_COLUMNS:
                key, parse = _MARKDOWN_COLUMNS[name]
                row[key] = parse(cell)
        rows.append(upgrade_row(row))
    return rows
