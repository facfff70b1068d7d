"""A benchmark sweep on the ranks of two torchrun agents (two nodes of 2 ranks on loopback): each
point measures on a group placed as training places a model group; rank 0 writes the rows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.agents import agent_env, two_nodes, wait_agents

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`


def test_a_sweep_runs_on_two_nodes_and_places_its_groups(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "benchmarks",
        "--multirun",
        f"results_root={tmp_path}",
        f"hydra.sweep.dir={sweep}",
        "grid=o12",
        "strategy=shard_sequence",
        "ranks=2,3,4",
        "placement=within_nodes,across_nodes",
        "model.num_layers=1",
        "model.num_channels=16",
        "model.window_size=16",
        "warmup=0",
        "gemm_size=256",
        "steps=2",
    ]
    procs, logs, _ = two_nodes(tmp_path, "sweep", args, agent_env())
    assert wait_agents(procs, logs) == [0, 0], logs[0].read_text()[-3000:]

    rows = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6  # rank 0 alone wrote them
    nodes = {(r["ranks"], r["placement"]): r.get("nodes") for r in rows if r["status"] == "ok"}
    assert nodes == {
        (2, "within_nodes"): 1,  # ranks 0 and 1, on node 0
        (2, "across_nodes"): 2,  # ranks 0 and 2
        (4, "within_nodes"): 2,
        (4, "across_nodes"): 2,
    }
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert {r["ranks"] for r in skipped} == {3} and "does not divide the 4 ranks" in skipped[0]["reason"]
    assert all(r["bytes_rel_error_max"] <= 0.01 for r in rows if r["status"] == "ok")
    table = (sweep / "results.md").read_text()
    assert "| P | nodes |" in table
    assert not re.search(r"^(done|skip) ", Path(logs[1]).read_text(), re.MULTILINE)  # node 1 reports nothing
    assert (sweep / "results.csv").exists() and list((sweep / "plots").glob("*.png"))
