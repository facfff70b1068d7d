"""``python -m benchmarks.step_toggle``: a switch set to each value in turn inside one run, and
put back after."""

from __future__ import annotations

import pytest

import processor.matmul.backends as backends
import training.loop.step as step
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


def test_at_build_each_value_trains_its_own_trainer_and_their_losses_are_compared(one_rank_small_run, capsys):
    original = step.flattenable
    main(
        ["--at", "build", "--switch", "training.loop.step.flattenable", "--values", "orig", "lambda p: False"]
        + ["--warmup", "1", "--steps", "3", "trainer.grad_clip=0", *one_rank_small_run]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["orig", "lambda p: False"]
    # FlatAdamW and torch's AdamW without clipping: the same losses, bit for bit
    assert "0.0e+00 (first 10 steps), 0.0e+00 (all)" in out
    assert step.flattenable is original


@pytest.mark.parametrize("values", [["orig"], ["orig", "orig"], ["orig", "lambda: "]])
def test_values_that_cannot_work_are_one_line_before_any_rank_starts(values, capsys):
    with pytest.raises(SystemExit):
        main(["--switch", "processor.matmul.backends.native_kernel", "--values", *values])
    assert "--values" in capsys.readouterr().err
