"""The GPU check without a GPU: it skips saying why; every part's code runs on CPU at toy sizes
(``--dry-run --only PART``); it writes the device's dated report of the day in
``docs/benchmarks/`` and lists it once in the page's index; each part writes its own block of the
report, replacing only that block; a part that fails leaves one line saying why and the others
still write; and it imports nothing a bare GPU machine lacks (no Hydra, MLflow, SciPy, zarr,
torch_geometric)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu import common, cuda_tests, kernels, section, sweep, train

ROOT = Path(__file__).resolve().parents[2]
REPORT = "gpu_check_cpu_2026-01-01.md"  # a report's name in tmp_path (the real ones: docs/benchmarks/)


def _dry_run(tmp_path: Path, *parts: str, budget_s: float = 600.0, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    doc = tmp_path / REPORT
    code = gpu_check.main(
        ["--dry-run", "--doc", str(doc), "--scratch", str(tmp_path / "scratch"), "--budget-s", str(budget_s)]
        + ["--only", ",".join(parts), *extra]
    )
    return code, doc.read_text()


def _part(text: str, name: str) -> str:
    return section.parse(text)[name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run for real")
def test_without_a_gpu_it_skips_and_writes_nothing(tmp_path, capsys):
    doc, index = tmp_path / REPORT, tmp_path / "benchmarks.md"
    assert gpu_check.main(["--doc", str(doc), "--index", str(index)]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out
    assert not doc.exists() and not index.exists()


def test_on_a_gpu_it_writes_the_devices_own_dated_report():
    assert section.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    path = section.report_path(Path("docs/benchmarks"), "NVIDIA H100 80GB HBM3", "2026-11-25")
    assert path == Path("docs/benchmarks/gpu_check_nvidia-h100-80gb-hbm3_2026-11-25.md")
    default = gpu_check.default_doc(torch.device("cpu"))
    assert default.parent == ROOT / "docs" / "benchmarks" and gpu_check.INDEX_PAGE == ROOT / "docs" / "benchmarks.md"
    assert re.fullmatch(r"gpu_check_[a-z0-9-]+_\d{4}-\d{2}-\d{2}\.md", default.name), default.name


def test_a_report_is_listed_once_at_the_end_of_the_pages_index(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.PARTS, "kernel", lambda ctx: "### Kernel\n\nfigures")
    index = tmp_path / "benchmarks.md"
    index.write_text("# Benchmarks\n\n## Reports\n\n- [a.md](benchmarks/a.md): one.\n- [b.md](benchmarks/b.md): two.\n")
    for _ in range(2):  # a second call the same day: the same report, listed once
        code, text = _dry_run(tmp_path, "kernel", extra=("--index", str(index)))
        assert code == 0
    assert text.splitlines()[1].startswith("# GPU check (")  # the report's title, after its begin marker
    lines = index.read_text().splitlines()
    assert lines[-1].startswith(f"- [{REPORT}]({REPORT}): the GPU check on ") and len(lines) == 7
    page = tmp_path / "page.md"
    assert section.add_to_index(page, tmp_path / REPORT, "- the line")  # a page without an index gets one
    assert page.read_text() == "## Reports\n\n- the line\n"


def test_only_takes_comma_lists_and_repeats_in_the_parts_order():
    assert gpu_check.selected_parts(["sweep,tests", "kernel"]) == ["tests", "kernel", "sweep"]
    assert gpu_check.selected_parts(None) == ["tests", "kernel", "processor", "train", "sweep", "parity"]
    with pytest.raises(SystemExit, match="unknown part"):
        gpu_check.selected_parts(["kernels"])


def test_write_section_replaces_one_part_and_keeps_the_others(tmp_path):
    doc = tmp_path / REPORT
    other = "<!-- gpu_check:begin GPU B 2026-01-01 -->\n## B\n<!-- gpu_check:part kernel -->\nB's\n"
    other += "<!-- gpu_check:part-end kernel -->\n<!-- gpu_check:end -->"
    doc.write_text(f"# Benchmarks\n\nearlier text\n\n{other}\n")
    begin, order = "<!-- gpu_check:begin GPU A 2026-01-02 -->", ("tests", "kernel", "sweep")
    section.write_section(doc, begin, "## A, first", {"sweep": "sweep 1"}, order)
    section.write_section(doc, begin, "## A, second", {"tests": "tests 1", "sweep": "sweep 2"}, order)
    text = doc.read_text()
    assert text.startswith(f"# Benchmarks\n\nearlier text\n\n{other}\n\n{begin}\n## A, second\n")
    assert text.count(begin) == 1 and "## A, first" not in text
    mine = text.split(begin)[1]
    assert section.parse(mine) == {"tests": "tests 1", "sweep": "sweep 2"}  # in the parts' order
    assert section.parse(other) == {"kernel": "B's"}  # another device's section untouched
    section.write_section(doc, begin, "## A, third", {"kernel": "kernel 1"}, order)
    assert list(section.parse(doc.read_text().split(begin)[1])) == ["tests", "kernel", "sweep"]


def test_a_failing_part_leaves_its_line_and_the_others_still_write(tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("boom\nsecond line")

    def refuses(ctx):
        raise common.PartFailed("the reason, in one line", "- a detail")

    monkeypatch.setitem(gpu_check.PARTS, "tests", boom)
    monkeypatch.setitem(gpu_check.PARTS, "kernel", lambda ctx: "### Kernel\n\nfigures")
    monkeypatch.setitem(gpu_check.PARTS, "processor", refuses)
    code, text = _dry_run(tmp_path, "tests", "kernel", "processor")
    assert code == 1
    parts = section.parse(text)
    assert "**failed**: RuntimeError: boom\n" in parts["tests"] and "second line" not in parts["tests"]
    assert parts["kernel"].startswith("### Kernel\n\nfigures")
    assert "**failed**: the reason, in one line\n\n- a detail" in parts["processor"]
    # A later call of the kernel part alone replaces its block only.
    monkeypatch.setitem(gpu_check.PARTS, "kernel", lambda ctx: "### Kernel\n\nnew figures")
    assert _dry_run(tmp_path, "kernel")[0] == 0
    parts = section.parse((tmp_path / REPORT).read_text())
    assert "new figures" in parts["kernel"] and "boom" in parts["tests"] and "the reason" in parts["processor"]


def _toy_sizes(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "DRY_RUN_POINTS", {"toy": 128})
    monkeypatch.setattr(kernels, "DRY_RUN_WINDOW", 16)
    monkeypatch.setattr(kernels, "DRY_RUN_GEMM", 128)


def test_the_kernel_and_processor_parts_dry_run(tmp_path, monkeypatch):
    _toy_sizes(monkeypatch)
    code, text = _dry_run(tmp_path, "kernel", "processor")
    assert code == 0
    kernel_rows = [line for line in _part(text, "kernel").splitlines() if line.startswith("| 128 | 16 × 16 | 16 |")]
    assert len(kernel_rows) == 8  # 4 paths x bf16/fp32
    timed = [row for row in kernel_rows if "| sdpa_blocks |" in row or "| dense |" in row]
    assert all(row.split("|")[7].strip() != "—" for row in timed)  # these ran on CPU
    assert any("flex has no backward on CPU" in row for row in kernel_rows)  # and these say why not
    processor = _part(text, "processor")
    assert processor.count("| toy | 128 |") == 4  # auto and dense, bf16 and fp32
    assert "Dense GEMM (128³, in this process)" in processor and "goal >= 40%" in processor


def test_a_spent_budget_skips_the_remaining_cases(tmp_path, monkeypatch):
    _toy_sizes(monkeypatch)
    code, text = _dry_run(tmp_path, "kernel", budget_s=0.0)
    assert code == 0
    assert _part(text, "kernel").count("skipped: past this part's 0 s budget") == 8


@pytest.mark.slow
def test_the_tests_part_runs_pytest_on_the_cuda_files(tmp_path, monkeypatch):
    kernel_tests = ROOT / "tests" / "benchmarks" / "test_cuda_timing.py"
    monkeypatch.setattr(cuda_tests, "cuda_test_files", lambda: [kernel_tests])
    code, text = _dry_run(tmp_path, "tests")
    assert code == 0
    assert "`pytest -m cuda` on 1 files" in _part(text, "tests") and "skipped" in _part(text, "tests")
    assert cuda_tests.imports_wheels(ROOT / "tests" / "training" / "distributed" / "test_cuda_training.py")
    assert not cuda_tests.imports_wheels(kernel_tests)


@pytest.mark.slow
def test_the_train_part_dry_runs_the_training_app(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "SECOND_RUN_FACTOR", 1e9)  # the 2-rank run: skipped for want of time
    code, text = _dry_run(tmp_path, "train")
    assert code == 0, text
    part = _part(text, "train")
    one, two = (line for line in part.splitlines() if line.startswith("| 1 rank") or line.startswith("| 2 ranks"))
    cells = [c.strip() for c in one.split("|")[1:-1]]
    assert cells[1] == "4" and all(c != "—" for c in cells[3:7])  # steps, losses, steps/s, samples/s
    assert "skipped:" in two
    assert "<details><summary>Skill of the 1 rank, strategy=none run" in part and "#### psi" in part
    assert (tmp_path / "scratch" / "train" / "1-rank" / "metrics.jsonl").exists()


def test_train_metrics_come_from_metrics_jsonl(tmp_path):
    records = [
        {"step": s, "train/loss": 1.0 / (s + 1), "step_time_s": 0.5 if s else 9.0, "samples_per_s": 4.0}
        | ({"peak_device_memory_gib": 0.25 + s / 100} if s else {})
        | ({"val/loss": 0.1 * s} if s % 5 == 4 else {})
        for s in range(10)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    m = train.metrics(tmp_path)
    assert m == pytest.approx(
        {"steps": 10, "train_loss": 0.1, "val_loss": 0.9, "steps_per_s": 2.0, "samples_per_s": 4.0, "peak_gib": 0.34}
    )


@pytest.mark.slow
def test_the_sweep_part_dry_runs_the_benchmark_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "DRY_GRIDS", ("o8",))
    code, text = _dry_run(tmp_path, "sweep")
    assert code == 0, text
    part = _part(text, "sweep")
    row = next(line for line in part.splitlines() if line.startswith("| o8 | 544 | 1 |"))
    assert all(c.strip() != "—" for c in row.split("|")[4:9])
    plot = next(line for line in part.splitlines() if line.startswith("!["))
    assert (tmp_path / plot.split("](")[1].rstrip(")")).exists()


def test_the_sweep_table_says_why_a_point_has_no_figures():
    ok = {"status": "ok", "grid": "o48", "num_layers": 2, "points": 10944, "step_time_s": 0.01}
    ok |= {"step_time_min_s": 0.009, "step_time_max_s": 0.012, "processor_flop_per_s": 4e14}
    ok |= {"peak_bytes_per_rank": [3 * 2**30]}
    oom = {"status": "error", "grid": "n320", "num_layers": 8, "points": 542080}
    oom["error"] = "RuntimeError: 1 of 1 ranks failed:\n  rank 0: torch.OutOfMemoryError: CUDA out of memory. Tried"
    points = [("o48", 2), ("n320", 8), ("n320", 4)]
    lines = sweep.table([ok, oom], points, gemm_bf16=800.0, stopped=True).splitlines()[2:]
    assert lines[0] == "| o48 | 10944 | 2 | 10.0 | 9.0–12.0 | 400.0 | 50% | 3.00 | |"
    assert lines[1].endswith("| does not fit: out of memory |")
    assert lines[2].endswith("| not reached: the sweep was stopped at the part's budget |")


def test_parts_that_need_the_wheels_say_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "missing_wheels", lambda: ["hydra", "mlflow"])
    code, text = _dry_run(tmp_path, "train", "sweep", "parity")
    assert code == 1
    for name in ("train", "sweep", "parity"):
        assert f"**failed**: {common.NEEDS_WHEELS} (missing: hydra, mlflow)" in _part(text, name)


def test_it_needs_only_torch_einops_numpy():
    blocked = ("hydra", "omegaconf", "mlflow", "scipy", "torch_geometric", "zarr", "matplotlib", "tqdm", "yaml")
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError('not on a bare GPU machine: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import benchmarks.gpu_check, benchmarks.gpu.wheels\n"
        "import tests.processor.attention.test_cuda_kernels, tests.processor.test_cuda_processor\n"
        "import tests.benchmarks.test_cuda_timing\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
