"""``python -m benchmarks.projections``: the cost model at cluster scale, as a Markdown table.

Every strategy (and ``shard_hybrid`` knob) that can run each grid on ``P`` GPUs of a given
machine (default ``h100_nvlink_ib``, :data:`processor.plan.PRESETS`, whose numbers
state their sources): predicted step time, bytes sent and memory per GPU, and which one
``strategy=auto`` picks. Nothing here is measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from processor.grids import grid_points
from processor.plan import Workload, choose, load_machine

GRIDS = ("o96", "n320", "o1280")
RANKS = (4, 8, 16, 32, 64)
GIB, MIB = 2**30, 2**20


def projection_rows(machine_name: str, window: int | None, grids=GRIDS, ranks=RANKS, **model) -> list[str]:
    """Markdown rows: grid, P, then per candidate step time, MiB sent and GiB per GPU."""
    machine = load_machine(machine_name)
    rows = []
    for grid in grids:
        for p in ranks:
            work = Workload(points=grid_points(grid), ranks=p, window_size=window, **model)
            try:
                pick, table = choose(work, machine)
            except ValueError:  # nothing fits: report the least memory
                pick, table = None, []
            for pred in table:
                mark = " **auto**" if pred is pick else ""
                fits = "" if pred.fits else " (does not fit)"
                rows.append(
                    f"| {grid} | {p} | {pred.label}{mark} | {pred.step_s * 1e3:.1f} | "
                    f"{pred.compute_s * 1e3:.1f} | {pred.exposed_comm_s * 1e3:.1f} | {pred.bytes_sent / MIB:.0f} | "
                    f"{pred.memory_b / GIB:.1f}{fits} |"
                )
            if pick is None:
                rows.append(f"| {grid} | {p} | nothing fits in {machine.memory_b / GIB:.0f} GiB | | | | | |")
    return rows


def markdown(machine_name: str, windows: list[int | None], **model) -> str:
    machine = load_machine(machine_name)
    header = [
        f"Machine `{machine.name}`: {machine.source}.",
        f"Model: {model}, one sample per step, forward + backward of the processor. Under bf16 autocast",
        "q, k, v and attention outputs travel in bf16, `shard_sequence`'s halo of the normed input in fp32.",
        "",
    ]
    for window in windows:
        header += [
            f"### Window {window if window is not None else 'global (None)'}",
            "",
            "| grid | P | strategy | step (ms) | compute (ms) | exposed comm (ms) | MiB sent / GPU | GiB / GPU |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
            *projection_rows(machine_name, window, **model),
            "",
        ]
    return "\n".join(header)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="h100_nvlink_ib")
    parser.add_argument("--out", type=Path, help="write the tables here (Markdown)")
    args = parser.parse_args(argv)
    model = dict(num_layers=16, num_channels=1024, num_heads=16, mlp_hidden_ratio=4.0, num_chunks=16, precision="bf16")
    text = markdown(args.machine, [512, None], **model)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
