"""``python -m benchmarks.step_toggle``: a switch set to each value in turn inside one run, and
put back after."""

from __future__ import annotations

import pytest

import processor.matmul.backends as backends
from benchmarks.step_toggle import main


def test_each_value_gets_its_steps_and_the_switch_is_put_back(one_rank_small_run, capsys):
    original = backends.native_kernel
    main(
        ["--switch", "processor.matmul.backends.native_kernel", "--values", "orig", "lambda: None"]
        + ["--warmup", "1", "--steps", "2", *one_rank_small_run]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["orig", "lambda: None"]
    assert rows[0].endswith("| 1.000x |")
    assert backends.native_kernel is original


@pytest.mark.parametrize("values", [["orig"], ["orig", "orig"], ["orig", "lambda: "]])
def test_values_that_cannot_work_are_one_line_before_any_rank_starts(values, capsys):
    with pytest.raises(SystemExit):
        main(["--switch", "processor.matmul.backends.native_kernel", "--values", *values])
    assert "--values" in capsys.readouterr().err
