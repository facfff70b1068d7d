"""The planner behind strategy=auto: candidates, what moves a prediction, the choice, the report."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks.auto_report import choice_table, measured_rows, point_table
from processor.plan import PRESETS, Machine, Workload, candidates, choose, load_machine, predict
from processor.strategies import ShardSequence

CPU = Machine("test", 20e9, 5e9, 10e9, latency_s=1e-4, bandwidth_b_s=2e9, memory_b=8 * 2**30, parallel_ranks=2)


def _work(**changes) -> Workload:
    base = dict(points=20000, num_layers=2, num_channels=128, num_heads=8, window_size=64, ranks=4)
    return Workload(**(base | changes))


def test_candidates_are_the_strategies_and_knobs_that_run() -> None:
    assert [c.label for c in candidates(_work(ranks=1))] == ["none"]
    labels = [c.label for c in candidates(_work(ranks=4))]
    assert labels == ["shard_sequence", "shard_heads", "shard_channels", "shard_hybrid(head_group_size=2)"]
    wide = [c.label for c in candidates(_work(ranks=16))]  # more ranks than heads: no shard_heads
    assert "shard_heads" not in wide and "shard_sequence" in wide
    assert [c for c in wide if c.startswith("shard_hybrid")] == [
        f"shard_hybrid(head_group_size={g})" for g in (2, 4, 8)
    ]


def test_slower_links_cost_the_exchanging_strategies_more() -> None:
    work = _work()
    slow = dataclasses.replace(CPU, bandwidth_b_s=CPU.bandwidth_b_s / 100)
    for c in candidates(work):
        fast, slowed = predict(work, c, CPU), predict(work, c, slow)
        assert slowed.comm_s > fast.comm_s and slowed.compute_s == fast.compute_s
    # shard_heads sends every point's q, k, v; the halo only W rows: the halo wins on a slow link.
    assert choose(work, slow)[0].strategy.name == "shard_sequence"


def test_ranks_sharing_cores_compute_slower() -> None:
    c = ShardSequence()
    two, four = predict(_work(ranks=2), c, CPU), predict(_work(ranks=4), c, CPU)
    assert four.compute_s == pytest.approx(two.compute_s, rel=0.05)  # half the work each, at half the speed


def test_memory_decides_what_fits_and_says_so_when_nothing_does() -> None:
    work = _work(points=200000, window_size=None)
    tight = dataclasses.replace(CPU, memory_b=2**20)
    assert not any(predict(work, c, tight).fits for c in candidates(work))
    with pytest.raises(ValueError, match="no strategy fits 200000 points"):
        choose(work, tight)


def test_groups_wider_than_a_node_use_the_links_between_nodes() -> None:
    h100 = PRESETS["h100_nvlink_ib"]
    assert h100.link(8) == (h100.latency_s, h100.bandwidth_b_s)
    assert h100.link(16) == (h100.inter_node_latency_s, h100.inter_node_bandwidth_b_s)
    # n320, global attention, 32 GPUs, 16 heads: heads alone cannot run it; the pick keeps the
    # all-to-all inside a node.
    work = _work(points=542080, num_channels=1024, num_heads=16, window_size=None, ranks=32, precision="bf16")
    pick, table = choose(work, h100)
    assert pick.fits and pick.strategy.name in ("shard_hybrid", "shard_sequence")
    assert pick.step_s == min(p.step_s for p in table if p.fits)


def test_machines_load_by_preset_or_saved_probe(tmp_path) -> None:
    assert load_machine("h100_nvlink_ib") is PRESETS["h100_nvlink_ib"]
    saved = tmp_path / "machine.json"
    saved.write_text(json.dumps(dataclasses.asdict(CPU)))
    assert load_machine(str(saved)) == CPU
    with pytest.raises(ValueError, match="machine 'tpu'"):
        load_machine("tpu")


def test_the_report_compares_auto_with_the_fastest_measured(tmp_path) -> None:
    work = _work(ranks=2)
    row = dict(
        status="ok", target="processor", grid="o64", points=work.points, num_layers=2, num_channels=128, num_heads=8,
        window_size=64, mlp_hidden_ratio=2.0, num_chunks=0, batch_size=1, ranks=2, precision="fp32",
    )  # fmt: skip
    pick = choose(work, CPU)[0].strategy.name
    other = next(c.name for c in candidates(work) if c.name != pick)
    lines = [{**row, "strategy": pick, "step_time_s": 1.05}, {**row, "strategy": other, "step_time_s": 1.0}]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    rows = measured_rows(tmp_path)
    [choice] = choice_table(rows, CPU)
    assert choice["auto"] == pick and choice["fastest"] == other
    assert choice["ratio"] == pytest.approx(1.05) and choice["within"]
    assert len(point_table(rows, CPU)) == 2


def test_the_attention_rate_follows_the_measured_curve_in_log_window() -> None:
    machine = dataclasses.replace(CPU, window_attention_curve=((16, 1e9), (256, 5e9)))
    assert machine.attention_flop_s(8) == 1e9 and machine.attention_flop_s(1024) == 5e9  # clamped
    assert machine.attention_flop_s(64) == pytest.approx(3e9)  # half-way in log W
    assert machine.attention_flop_s(None) == CPU.global_attention_flop_s
    assert CPU.attention_flop_s(64) == CPU.window_attention_flop_s  # no curve: the one rate
