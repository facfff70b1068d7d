"""``python -m benchmarks.step_profile``: the training step's time by part and kind, from the
run's own set-up, with backward work in the part whose forward made it."""

from __future__ import annotations

from benchmarks.step_profile import PARTS, main
from tests.training.conftest import small_overrides
from training.data import generate_rossby_haurwitz


def test_the_profile_splits_a_step_of_the_run_by_part(tmp_path, capsys):
    store = generate_rossby_haurwitz(tmp_path / "rh_o16.zarr", "o16", steps=40, seed=3)
    overrides = [o for o in small_overrides(tmp_path / "run", store) if not o.startswith("run_dir")]
    one_rank = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "trainer.threads_per_rank=1"]
    main(["--warmup", "2", "--steps", "3", "--profiled", "2", "--top", "5", *overrides, *one_rank])
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
