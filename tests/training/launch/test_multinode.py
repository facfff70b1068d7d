"""Several nodes on one machine: two torchrun agents meet at a c10d rendezvous on loopback, as
two nodes of 2 ranks each (``--local-addr`` 127.0.0.1 and 127.0.0.2, so that the first is node
0), and train 2 replicas x 2 model-parallel ranks. Their losses equal one agent's; a node lost
mid-run is named by the other within the timeout; a replacement node resumes bit for bit.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from processor.runtime.torchrun import FRESH_STORE_ENV, TorchrunSetupError, check_restartable
from tests.agents import AGENT_TIMEOUT_S, agent, agent_env, standalone, two_nodes, wait_agents
from tests.processes import run_in_own_session, start_in_own_session
from tests.training.conftest import small_overrides
from tests.training.hooks.faults import MARKER, fault_overrides
from training.checkpoint.files import load_checkpoint
from training.reporting.metrics_file import read_history

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

WORLD = ["trainer.nprocs=4", "trainer.ranks_per_model=2", "trainer.heartbeat_s=0.2"]
WORLD += ["evaluate.at_end_of_training=false"]
NODE_LOSS = [*fault_overrides(fault_at_step=4, fault_rank=2, fault_scope="node"), "trainer.timeout_s=30"]


def _training(run_dir: Path, dataset: Path, *overrides: str) -> list[str]:
    return ["-m", "training", *small_overrides(run_dir, dataset), *WORLD, *overrides, f"hydra.run.dir={run_dir}/hydra"]


@pytest.fixture(scope="module")
def one_agent(tmp_path_factory, small_dataset) -> Path:
    """The reference: the same 4 ranks under one torchrun agent."""
    run_dir = tmp_path_factory.mktemp("one-agent")
    command = [*standalone(4), *_training(run_dir, small_dataset)]
    rc, _, err = run_in_own_session(command, run_dir, agent_env(), AGENT_TIMEOUT_S)
    assert rc == 0, err[-3000:]
    return run_dir


def _parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert state["step"] == 6
    return state["model"]


@pytest.mark.parametrize("placement", ["within_nodes", "across_nodes"])
def test_two_nodes_train_as_one_agent_does(tmp_path, small_dataset, one_agent, placement):
    run_dir = tmp_path / "run"
    args = _training(run_dir, small_dataset, f"trainer.placement={placement}")
    procs, logs, _ = two_nodes(tmp_path, placement.replace("_", "-"), args, agent_env())
    assert wait_agents(procs, logs) == [0, 0], logs[0].read_text()[-3000:]

    layout = re.search(r"layout: (.*)", logs[0].read_text() + logs[1].read_text())
    assert layout, logs[0].read_text()[-3000:]
    groups = "[[0, 1], [2, 3]], each inside one node" if placement == "within_nodes" else "[[0, 2], [1, 3]], spanning"
    assert "4 ranks on 2 node(s)" in layout[1] and groups in layout[1], layout[1]
    reference = dict(read_history(one_agent))
    history = dict(read_history(run_dir))
    assert sorted(history) == sorted(reference) == list(range(6))
    for step, metrics in reference.items():
        assert history[step]["train/loss"] == pytest.approx(metrics["train/loss"], rel=1e-6, abs=0), step
    if placement == "within_nodes":  # the same ranks in the same groups as one agent's: the same bits
        for name, value in _parameters(one_agent).items():
            assert torch.equal(_parameters(run_dir)[name], value), name


def test_a_lost_node_is_named_and_the_other_ends_within_the_timeout(tmp_path, small_dataset):
    """Node 1 (ranks 2 and 3, and its agent) is SIGKILLed in step 4; with no restarts node 0's
    ranks stop within ``trainer.timeout_s``, each naming the node in one line."""
    run_dir = tmp_path / "run"
    procs, logs, _ = two_nodes(tmp_path, "lost", _training(run_dir, small_dataset, *NODE_LOSS), agent_env())
    started = time.monotonic()
    codes = wait_agents(procs, logs)
    log = logs[0].read_text()
    assert codes[0] != 0 and codes[1] == -9, log[-3000:]
    assert time.monotonic() - started < AGENT_TIMEOUT_S
    assert (run_dir / MARKER).read_text().startswith("rank 2 killed its node at step 4")
    # The first of ranks 0 and 1 to tell stops its agent, which then stops the other (SIGTERM).
    # Rank 0's progress bar may be mid-line when rank 1 writes: the line need not start the line.
    lines = re.findall(r"error: (?:rank (\d): )?(.*)$", log, re.MULTILINE)
    assert lines and {rank for rank, _ in lines} <= {"", "1"}, log[-3000:]
    for _, message in lines:
        assert message.startswith("node 1 ") and "(ranks [2, 3]) was lost (no heartbeat for 0.6 s)" in message
    assert "Traceback" not in log.split("error:")[0]  # one line, not a traceback
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"] == 3


def test_a_replaced_node_resumes_bit_for_bit(tmp_path, small_dataset, one_agent):
    """The same loss with ``--max-restarts 1``: node 0 restarts its ranks and waits at the
    rendezvous; a new node 1 joins, and the run resumes from step 3's checkpoint to the
    parameters of the uninterrupted run, bit for bit."""
    run_dir = tmp_path / "run"
    args = _training(run_dir, small_dataset, *NODE_LOSS)
    env = agent_env(**{FRESH_STORE_ENV: "1"})
    procs, logs, port = two_nodes(tmp_path, "replaced", args, env, "--max-restarts=1")
    deadline = time.monotonic() + AGENT_TIMEOUT_S
    while "was lost" not in logs[0].read_text() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.2)
    assert "(ranks [2, 3]) was lost" in logs[0].read_text(), logs[0].read_text()[-3000:]
    assert procs[1].wait(timeout=30) == -9
    log = tmp_path / "replaced-node1-again.log"
    replacement = start_in_own_session([*agent(1, port, "replaced", "--max-restarts=1"), *args], tmp_path, env, log)
    assert wait_agents([procs[0], replacement], [logs[0], log]) == [0, 0], logs[0].read_text()[-3000:]

    assert "resuming from step 3 of" in logs[0].read_text() + log.read_text()
    for name, value in _parameters(one_agent).items():
        assert torch.equal(_parameters(run_dir)[name], value), name
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(6))  # steps 3 and 4 ran twice, and are recorded once


def test_restarts_on_several_nodes_need_a_fresh_store_each_attempt(monkeypatch):
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(TorchrunSetupError, match=f"--max-restarts 3 .* launch torchrun with {FRESH_STORE_ENV}=1"):
        check_restartable()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # what FRESH_STORE_ENV=1 gives the ranks
    check_restartable()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")  # one node: its one agent counts every restart
    check_restartable()
