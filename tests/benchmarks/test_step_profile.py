"""``python -m benchmarks.step_profile``: the training step's time by part and kind, from the
run's own set-up, with backward work in the part whose forward made it."""

from __future__ import annotations

from benchmarks.step_profile import PARTS, main


def test_the_profile_splits_a_step_of_the_run_by_part(one_rank_small_run, capsys):
    main(["--warmup", "2", "--steps", "3", "--profiled", "2", "--top", "5", *one_rank_small_run])
    out = capsys.readouterr().out
    assert "1 rank(s) x 1 thread(s), strategy none" in out and "steps/s" in out
    split_table = out.split("\n\n")[1]
    rows = {line.split(" | ")[0].strip("| "): line for line in split_table.splitlines() if line.startswith("| ")}
    for part in ("data", "encoder", "processor", "decoder", "optimiser", "dispatch"):
        assert part in rows, part
    assert set(rows) - {"part", "dispatch"} <= set(PARTS)
    processor = dict(zip(rows["part"].split(" | "), rows["processor"].split(" | ")))
    assert float(processor["attention"]) > 0 and float(processor["matmul"]) > 0  # its backward's too
    shares = [int(line.rsplit("|", 2)[-2].strip(" %")) for key, line in rows.items() if key != "part"]
    assert 95 <= sum(shares) <= 105  # the parts and the rest add up to the step (rounded shares)
    assert "| part | operator | ms/step | calls/step |" in out
