"""``python -m benchmarks.matmul_ab``: both GEMM backends side by side, layer by layer and as a
whole training step alternating in one process; the backend put back after."""

from __future__ import annotations

from benchmarks.matmul_ab import layers_table, main
from processor.matmul import matmul_backend
from tests.processor.matmul.forced import needs_onednn
from tests.training.conftest import small_overrides
from training.data import generate_rossby_haurwitz

pytestmark = needs_onednn


def test_the_layer_table_says_which_products_onednn_takes():
    table = layers_table(1, shapes=((8, 4, 4), (4096, 256, 256)))
    rows = [line for line in table.splitlines() if line.startswith("| 8 x") or line.startswith("| 4096 x")]
    assert len(rows) == 2
    assert rows[0].endswith("| no: too small, torch's GEMM |") and rows[1].endswith("| yes |")
    assert matmul_backend() == "aten"


def test_the_step_alternates_the_backends_in_one_run(tmp_path, capsys):
    store = generate_rossby_haurwitz(tmp_path / "rh_o16.zarr", "o16", steps=40, seed=3)
    overrides = [o for o in small_overrides(tmp_path / "run", store) if not o.startswith("run_dir")]
    one_rank = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "trainer.threads_per_rank=1"]
    main(["--rounds", "1", "--warmup", "1", "--steps", "2", "--blocks", "1", *overrides, *one_rank])
    out = capsys.readouterr().out
    assert "1 rank(s) x 1 thread(s), strategy none; median of 1 x 2 steps each" in out
    aten, onednn, ratio = out.strip().splitlines()[-1].strip("| ").split(" | ")
    assert float(aten) > 0 and float(onednn) > 0 and ratio.endswith("x")
