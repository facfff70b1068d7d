"""Runs side by side: the table reads each run's records, the plot is written."""

import json

from benchmarks.compare_runs import main


def _run(path, loss: float, centroid: bool) -> str:
    path.mkdir()
    steps = [
        {"step": s, "train/loss": loss / (s + 1), "step_time_s": 0.1, "peak_rss_gib_mean_rank": 0.5 + s / 100}
        | ({"val/loss": loss / (s + 2)} if s % 10 == 9 else {})
        for s in range(30)
    ]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(s) for s in steps))
    scores = {f"eval/rmse/{v}/model_over_persistence/024h": r for v, r in (("a", 0.2), ("b", 0.4))}
    scores |= {"eval/rmse/a/model/024h": 1.0, "eval/rmse/b/model/024h": 1.0}
    if centroid:
        scores["eval/centroid_km/b/model/024h"] = 123.0
    (path / "evaluations.jsonl").write_text(json.dumps({"step": 30, **scores}))
    return str(path)


def test_the_table_and_the_plot(tmp_path, capsys):
    old, new = _run(tmp_path / "old", 1.0, False), _run(tmp_path / "new", 0.5, True)
    main([f"old={old}", f"new={new}", "--leads", "24", "--plot", str(tmp_path / "loss.png")])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| old") or line.startswith("| new")]
    assert len(rows) == 2
    assert "| 30 | 0.1 | 0.79 |" in rows[0]  # steps, median s/step, peak RSS
    assert "0.200 0.400 | 0.3 |" in rows[0] and rows[1].endswith("| 123 |")
    assert (tmp_path / "loss.png").stat().st_size > 10_000
