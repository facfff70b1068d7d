"""``python -m benchmarks.bf16_speedup``: its table on a small grid, bf16 within its error of fp32."""

from __future__ import annotations

import torch

from benchmarks.bf16_speedup import main, relative_rms


def test_the_table_names_the_host_and_bf16_lies_within_its_error_of_fp32(capsys):
    main(["--grid", "o16", "--channels", "32", "--heads", "2", "--window", "16", "--layers", "1", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert "o16 (1600 points)" in lines[0] and "thread(s)" in lines[0]
    header = [cell.strip() for cell in lines[1].strip("|").split("|")]
    row = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert header[2] == "bf16 speed-up" and row[2].endswith("x")
    assert all(float(value) > 0 for value in row[:2])
    assert all(float(value) < 2e-2 for value in row[3:])  # output, dx, weight gradients


def test_relative_rms():
    want = torch.tensor([3.0, 4.0])
    assert relative_rms(want, want) == 0.0
    assert abs(relative_rms(want * 1.01, want) - 0.01) < 1e-6
