"""``python -m benchmarks.auto_report DIR``: the cost model against a measured sweep.

For every measured point of the sweep(s) under ``DIR`` (each ``results.jsonl`` below it):
the step time the cost model predicts and its error against the measured one. For every
configuration (grid, model, ranks): the fastest strategy measured, the one ``strategy=auto``
picks, the pick's measured time over the fastest's, and whether it is within 10%.

The machine is ``--machine``: a preset, a saved probe (JSON), or ``probe``; by default
``DIR/machine.json``, probed and saved there when missing. Writes ``DIR/auto.md`` and
``DIR/auto_points.csv``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from processor.plan import Machine, Workload, choose, load_machine, predict
from processor.strategies import Strategy, resolve_strategy, strategy_options

TOLERANCE = 0.10  # auto's pick may be this much slower than the fastest measured strategy
GROUP_KEYS = ("grid", "window_size", "ranks", "num_layers", "num_channels", "num_heads", "batch_size", "precision")


def measured_rows(directory: Path) -> list[dict[str, Any]]:
    """Every measured processor point with more than one rank, from each ``results.jsonl``."""
    rows = []
    for path in sorted(directory.rglob("results.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "ok" and row.get("target") == "processor" and row["ranks"] > 1:
                rows.append(row)
    return rows


def workload(row: dict[str, Any]) -> Workload:
    return Workload.of(row["points"], row, row["batch_size"], row["ranks"], row["precision"])


def candidate(row: dict[str, Any]) -> Strategy:
    """The strategy a row measured, its options as the row set them and its defaults decided
    for the row's size (as the planner's candidates spell them)."""
    name = row["strategy"]
    options = {k: row[k] for k in strategy_options(name) if row.get(k) is not None}
    return resolve_strategy(name, options).decided(row["num_heads"], row["ranks"])


def point_table(rows: list[dict[str, Any]], machine: Machine) -> list[dict[str, Any]]:
    """Predicted against measured, per point."""
    table = []
    for row in rows:
        guess = predict(workload(row), candidate(row), machine)
        measured = row["step_time_s"]
        table.append(
            {
                **{k: row[k] for k in GROUP_KEYS},
                "strategy": candidate(row).label,
                "measured_s": measured,
                "predicted_s": guess.step_s,
                "predicted_compute_s": guess.compute_s,
                "predicted_exposed_comm_s": guess.exposed_comm_s,
                "error": guess.step_s / measured - 1,
            }
        )
    return table


def choice_table(rows: list[dict[str, Any]], machine: Machine) -> list[dict[str, Any]]:
    """auto's pick against the fastest measured strategy, per configuration."""
    groups: dict[tuple, dict[str, Any]] = defaultdict(dict)
    for row in rows:
        groups[tuple(row[k] for k in GROUP_KEYS)][candidate(row).label] = row
    table = []
    for key, measured in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pick, _ = choose(workload(next(iter(measured.values()))), machine)
        fastest = min(measured, key=lambda label: measured[label]["step_time_s"])
        best = measured[fastest]["step_time_s"]
        picked = measured.get(pick.label)
        ratio = picked["step_time_s"] / best if picked else float("nan")
        table.append(
            {
                **dict(zip(GROUP_KEYS, key)),
                "fastest": fastest,
                "fastest_s": best,
                "auto": pick.label,
                "auto_s": picked["step_time_s"] if picked else float("nan"),
                "ratio": ratio,
                "within": bool(picked) and ratio <= 1 + TOLERANCE,
                "measured": len(measured),
            }
        )
    return table


def markdown(points: list[dict[str, Any]], choices: list[dict[str, Any]], machine: Machine) -> str:
    lines = [f"# strategy=auto against the measured sweep\n\nMachine: `{machine.name}` ({machine.source}).\n"]
    within = sum(c["within"] for c in choices)
    lines.append(f"auto's pick within {TOLERANCE:.0%} of the fastest: **{within} of {len(choices)}** configurations.\n")
    lines.append("| grid | W | P | fastest (s/step) | auto's pick (s/step) | ratio | within 10% |")
    lines.append("|---|---:|---:|---|---|---:|---|")
    for c in choices:
        lines.append(
            f"| {c['grid']} | {c['window_size']} | {c['ranks']} | {c['fastest']} ({c['fastest_s']:.3f}) | "
            f"{c['auto']} ({c['auto_s']:.3f}) | {c['ratio']:.3f} | {'yes' if c['within'] else 'NO'} |"
        )
    errors = [abs(p["error"]) for p in points]
    lines.append(
        f"\nPrediction error over {len(points)} points: median {sorted(errors)[len(errors) // 2]:.0%}, "
        f"largest {max(errors):.0%}.\n"
    )
    lines.append("| grid | W | P | strategy | measured (s) | predicted (s) | error |")
    lines.append("|---|---:|---:|---|---:|---:|---:|")
    for p in points:
        lines.append(
            f"| {p['grid']} | {p['window_size']} | {p['ranks']} | {p['strategy']} | {p['measured_s']:.3f} | "
            f"{p['predicted_s']:.3f} | {p['error']:+.0%} |"
        )
    return "\n".join(lines) + "\n"


def _machine(directory: Path, name: str | None) -> Machine:
    if name is not None:
        return load_machine(name)
    saved = directory / "machine.json"
    if saved.exists():
        return load_machine(str(saved))
    machine = load_machine("probe")
    saved.write_text(json.dumps(dataclasses.asdict(machine), indent=2) + "\n")
    return machine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a sweep directory (or a folder of several)")
    parser.add_argument("--machine", help="probe, a preset, or a saved probe (.json); default DIR/machine.json")
    args = parser.parse_args(argv)
    rows = measured_rows(args.directory)
    if not rows:
        raise SystemExit(f"no measured points with more than one rank under {args.directory}")
    machine = _machine(args.directory, args.machine)
    points, choices = point_table(rows, machine), choice_table(rows, machine)
    text = markdown(points, choices, machine)
    (args.directory / "auto.md").write_text(text)
    with open(args.directory / "auto_points.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(points[0]))
        writer.writeheader()
        writer.writerows(points)
    print(text)


if __name__ == "__main__":
    main()
