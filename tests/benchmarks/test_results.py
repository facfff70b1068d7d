"""Bytes have one name and one unit: per step and per layer, MiB = 2**20 bytes, the same in the
console, results.md and the stored rows; older rows read under today's keys."""

import json

import pytest

from benchmarks.__main__ import done_line
from benchmarks.results import MIB, load_rows, markdown_rows, markdown_table, upgrade_row

ROW = {
    "status": "ok", "target": "processor", "grid": "o96", "points": 40320, "strategy": "shard_sequence",
    "ranks": 2, "num_layers": 4, "step_time_s": 2.5, "step_time_min_s": 2.25, "step_time_max_s": 3.0,
    "points_per_s": 16128.0, "processor_flop_per_s": 1.0e11, "peak_increase_bytes_max": 582 * MIB,
    "bytes_sent_per_step_max": 2 * MIB, "bytes_sent_per_layer_max": MIB / 2,
    "analytic_bytes_per_step_max": 2 * MIB, "analytic_bytes_per_layer_max": MIB / 2,
}  # fmt: skip


def test_results_md_names_the_per_layer_unit():
    host, _, head, _, line = markdown_table([ROW]).splitlines()
    assert host.startswith("Measured on ") and ", torch " in host  # which kind of machine the figures are from
    assert "| peak/rank (MiB) | sent/rank/layer (MiB) | analytic/rank/layer (MiB) |" in head
    assert line.endswith("| 582 | 0.50 | 0.50 |")


def test_results_md_names_each_cpu_its_rows_ran_on():
    rows = [ROW | {"cpu": "AMD EPYC (AVX2)", "torch": "2.13.0"}, ROW | {"cpu": "Intel Xeon (AVX2, AVX-512, AMX)"}]
    host = markdown_table(rows).splitlines()[0]
    assert "AMD EPYC (AVX2); Intel Xeon (AVX2, AVX-512, AMX)" in host and "torch 2.13.0" in host


def test_the_console_says_per_step_and_per_layer():
    line = done_line("grid=o96", ROW)
    assert "sent/rank/step (MiB) 2.00" in line
    assert "sent/rank/layer (MiB) 0.50" in line
    assert "analytic/rank/layer (MiB) 0.50" in line
    assert "peak/rank (MiB) 582" in line


def test_older_rows_are_read_under_todays_keys(tmp_path):
    old = {k: v for k, v in ROW.items() if "bytes_sent_per" not in k and "analytic_bytes_per" not in k}
    old |= {"bytes_sent_max": 8 * MIB, "analytic_bytes_max": 8 * MIB}
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(ROW) + "\n")
    first, second = load_rows(tmp_path)
    assert first["bytes_sent_per_step_max"] == 8 * MIB and "bytes_sent_max" not in first
    assert first["bytes_sent_per_layer_max"] == first["analytic_bytes_per_layer_max"] == 2 * MIB
    assert second == ROW
    assert upgrade_row({"status": "skipped", "num_layers": 2}) == {"status": "skipped", "num_layers": 2}


def test_a_results_table_reads_back_as_rows():
    (row,) = markdown_rows("intro\n\n" + markdown_table([ROW]) + "\nafter\n")
    for key in ("grid", "points", "strategy", "ranks", "num_layers", "step_time_s", "step_time_min_s"):
        assert row[key] == ROW[key]
    assert row["peak_increase_bytes_max"] == 582 * MIB
    assert row["bytes_sent_per_layer_max"] == row["analytic_bytes_per_layer_max"] == MIB / 2
    assert row["bytes_sent_per_step_max"] == 2 * MIB  # per layer x 4 layers


def test_a_docs_table_without_layers_takes_them_from_defaults():
    text = "## A\n| strategy | P | analytic (MiB) |\n|---|---|---|\n| shard_heads | 2 | 1.50 |\n"
    (row,) = markdown_rows(text, after="## A", defaults={"num_layers": 2, "grid": "o48"})
    assert row["analytic_bytes_per_layer_max"] == 1.5 * MIB  # the column's name before the rename
    assert row["analytic_bytes_per_step_max"] == 3 * MIB
    with pytest.raises(ValueError, match="no line starting"):
        markdown_rows(text, after="## B")
