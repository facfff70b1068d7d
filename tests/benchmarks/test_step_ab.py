"""``python -m benchmarks.step_ab``: a run at an earlier revision against the working tree, read
from each run's own ``metrics.jsonl``."""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.step_ab import ROOT, Run, baseline_tree, loss_gap, read_run, table, train


def _write_metrics(run_dir, step_times, losses):
    run_dir.mkdir()
    rows = [{"step": i, "train/loss": loss, "step_time_s": t} for i, (t, loss) in enumerate(zip(step_times, losses))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_run_is_the_median_of_its_steps_after_the_skipped_ones(tmp_path):
    _write_metrics(tmp_path / "run", [9.0, 9.0, 0.03, 0.01, 0.02], [0.5, 0.4, 0.3, 0.2, 0.1])
    run = read_run(tmp_path / "run", skip=2)
    assert run.step_s == 0.02
    assert run.losses == [0.5, 0.4, 0.3, 0.2, 0.1]
    with pytest.raises(ValueError, match="no step from step 5 on: give more --steps"):
        read_run(tmp_path / "run", skip=5)
    with (tmp_path / "run" / "metrics.jsonl").open("a") as rows:
        rows.write(json.dumps({"step": 5, "train/nonfinite_loss": 1.0}) + "\n")  # a row with no loss
    assert read_run(tmp_path / "run", skip=2).losses == [0.5, 0.4, 0.3, 0.2, 0.1]


def test_a_revision_git_does_not_know_is_one_error_and_leaves_no_worktree():
    def worktrees() -> str:
        return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout

    before = worktrees()
    with pytest.raises(RuntimeError, match="--baseline no-such-revision: git worktree add failed"):
        with baseline_tree("no-such-revision"):
            pass
    assert worktrees() == before


def test_the_table_gives_each_pair_its_ratio_and_how_far_the_losses_are_apart():
    old, new = Run(0.030, [1.0, 0.5]), Run(0.010, [1.0, 0.5 * (1 + 2e-7)])
    assert loss_gap(old.losses, new.losses) == pytest.approx(2e-7)
    text = table([(old, new), (Run(0.020, [1.0]), Run(0.010, [1.0]))])
    assert "| 0 | 30.0 | 10.0 | 3.00x | 2.0e-07 |" in text
    assert "| 1 | 20.0 | 10.0 | 2.00x | 0.0e+00 |" in text
    assert "median pair: **2.50x**" in text


@pytest.mark.slow  # two runs in subprocesses: the slow tier's kind
def test_a_run_of_the_working_tree_is_read_back(tmp_path, one_rank_small_run):
    run = train(ROOT, tmp_path / "run", [*one_rank_small_run, "trainer.steps=3", "logging.mlflow=false"], skip=1)
    assert run.step_s > 0 and len(run.losses) == 3
    with pytest.raises(RuntimeError, match="failed"):
        train(ROOT, tmp_path / "bad", ["trainer.no_such_key=1"], skip=0)
