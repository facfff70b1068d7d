"""``python -m benchmarks.matmul_ab``: both GEMM backends side by side, layer by layer and as a
whole training step alternating in one process; the backend put back after."""

from __future__ import annotations

from benchmarks.matmul_ab import layers_table, main
from processor.matmul import matmul_backend
from tests.processor.matmul.forced import needs_onednn

pytestmark = needs_onednn


def test_the_layer_table_says_which_products_onednn_takes():
    table = layers_table(1, shapes=((8, 4, 4), (4096, 256, 256)))
    rows = [line for line in table.splitlines() if line.startswith("| 8 x") or line.startswith("| 4096 x")]
    assert len(rows) == 2
    assert rows[0].endswith("| no: too small, torch's GEMM |") and rows[1].endswith("| yes |")
    assert matmul_backend() == "aten"


def test_the_step_alternates_the_backends_in_one_run(one_rank_small_run, capsys):
    main(["--rounds", "1", "--warmup", "1", "--steps", "2", "--blocks", "1", *one_rank_small_run])
    out = capsys.readouterr().out
    assert "1 rank(s) x 1 thread(s), strategy none; median of 1 x 2 steps each" in out
    aten, onednn, ratio = out.strip().splitlines()[-1].strip("| ").split(" | ")
    assert float(aten) > 0 and float(onednn) > 0 and ratio.endswith("x")
