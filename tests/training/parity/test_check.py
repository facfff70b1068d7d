"""``python -m training.parity`` end to end on spawned gloo ranks: exact layouts pass at fp32,
a perturbed rank is caught and named, bf16 drifts more, bad input is one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.processes import run_in_own_session
from tests.training.conftest import small_config, small_overrides
from tests.training.hooks.perturb import perturb_overrides
from training.config.parity_settings import TOLERANCES
from training.config.schema import ConfigValueError, run_config
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.parity.check import EXIT_BREACH, run, split_for_parity
from training.parity.record import ParityStopped, record_steps

STEPS = "parity.steps=2"


def _worst(result) -> float:
    return max(r.max_rel_diff for r in result["rows"] if r.judged)


@pytest.mark.parametrize(
    "strategy",
    ["shard_sequence", *(pytest.param(s, marks=pytest.mark.slow) for s in ("shard_heads", "shard_channels"))],
)
def test_two_ranks_give_one_ranks_loss_gradients_and_parameters(tmp_path, small_dataset, strategy):
    result = run(small_config(tmp_path, small_dataset, f"strategy={strategy}", STEPS))
    assert not result["breach"], result["verdict"]
    assert _worst(result) <= TOLERANCES["fp32"]
    assert result["verdict"].startswith("parity: within 1e-05 (fp32)")
    rows = result["rows"]
    assert {r.step for r in rows} == {0, 1}
    gradients = {r.tensor for r in rows if r.quantity == "gradients"}
    assert gradients == {r.tensor for r in rows if r.quantity == "parameters"} and len(gradients) > 20
    assert len((tmp_path / "parity.csv").read_text().splitlines()) == 1 + len(rows)
    # Not judged: only parameters the loss is blind to, a bias added to every key
    blind = {r.tensor for r in rows if not r.judged}
    assert all(name.endswith(("lin_key.bias", "k_norm.bias")) for name in blind), blind
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(result["run_id"]).data.tags["parity_verdict"] == "within"
    history = client.get_metric_history(result["run_id"], "parity/gradients")
    assert [m.step for m in history] == [0, 1] and max(m.value for m in history) <= TOLERANCES["fp32"]


def test_ranks_left_to_derive_are_two_against_one(tmp_path, small_dataset):
    """A run derives one rank for the small grid; the check splits it over two, not one against one."""
    cfg = small_config(tmp_path, small_dataset, "trainer.nprocs=null", "trainer.ranks_per_model=null", STEPS)
    result = run(cfg)
    assert not result["breach"], result["verdict"]
    assert "shard_sequence on 2 rank(s) (2 per model) against none on 1 rank(s)" in result["verdict"]
    assert cfg.trainer.nprocs is None  # the caller's configuration is left as it was


def test_a_gpu_keeps_its_rank_a_gpu(tmp_path, small_dataset):
    resolved = run_config(small_config(tmp_path, small_dataset, "trainer.nprocs=null", "trainer.device=cuda"))
    split_for_parity(resolved)
    assert resolved.trainer.nprocs is None  # derived later: one rank a GPU


@pytest.mark.slow
def test_replicas_and_a_reference_of_two_ranks(tmp_path, small_dataset):
    """2 replicas x 2 ranks against one replica of 2 ranks holding both batches, computed by each
    pair of ranks (the reference's own groups)."""
    overrides = ["trainer.nprocs=4", "trainer.ranks_per_model=2", "parity.reference=2", STEPS]
    result = run(small_config(tmp_path, small_dataset, *overrides))
    assert not result["breach"] and _worst(result) <= TOLERANCES["fp32"], result["verdict"]
    assert "against shard_sequence on 2 rank(s)" in result["verdict"]


@pytest.mark.slow
def test_bf16_drifts_more_than_fp32_and_stays_within_its_bound(tmp_path, small_dataset):
    result = run(small_config(tmp_path, small_dataset, "trainer.precision=bf16", STEPS))
    assert TOLERANCES["fp32"] < _worst(result) <= TOLERANCES["bf16"], result["verdict"]
    assert not result["breach"]


@pytest.mark.slow
def test_a_perturbed_rank_is_a_breach_that_names_the_tensor(tmp_path, small_dataset):
    """The command itself: exit code 4 and the verdict naming the worst tensor."""
    overrides = [*small_overrides(tmp_path / "run", small_dataset), STEPS, *perturb_overrides(1)]
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    rc, out, err = run_in_own_session(
        [sys.executable, "-m", "training.parity", *overrides], Path.cwd(), environ, timeout_s=240
    )
    assert rc == EXIT_BREACH, err[-2000:]
    verdict = [line for line in out.splitlines() if line.startswith("parity: ")]
    assert len(verdict) == 1 and verdict[0].startswith("parity: BREACH of 1e-05 (fp32)"), out
    assert " of " in verdict[0].split("worst relative difference")[1] or "loss at step" in verdict[0]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parity.reference=3"], r"parity.reference = 3 is above trainer.ranks_per_model = 2"),
        (["parity.reference=2"], r"parity.reference = 2 is the configured layout itself"),
        (perturb_overrides(2), r"debug.hook_settings.perturb_rank = 2: there are 2 ranks"),
        (["model.dropout_p=0.1"], r"model.dropout_p = 0.1: each layout draws its own dropout masks"),
    ],
)
def test_what_no_parity_check_can_run_is_refused_before_any_rank_starts(tmp_path, small_dataset, overrides, message):
    with pytest.raises(ConfigValueError, match=message):
        run(small_config(tmp_path, small_dataset, *overrides))
    assert not (tmp_path / "parity.csv").exists()


def test_a_stop_request_ends_the_steps_after_the_one_in_flight(tmp_path, small_dataset):
    """Ctrl-C and SIGTERM reach the ranks as a stop request, which every rank agrees on after
    each step (:func:`training.parity.check.parity_on_rank`): no more steps, no verdict."""
    one_rank = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")
    cfg = prepare(small_config(tmp_path, small_dataset, *one_rank))
    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return True

    with pytest.raises(ParityStopped):
        record_steps(cfg, ParallelDims(1, 1, 0, None, None), True, should_stop)
    assert asked == [True]  # after the first step, not before it


@pytest.mark.slow
def test_under_torchrun_every_rank_computes_and_rank_0_says_it_once(tmp_path, small_dataset):
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "training.parity"]
    overrides = [*small_overrides(tmp_path / "run", small_dataset), STEPS, "strategy=shard_heads"]
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environ["OMP_NUM_THREADS"] = "1"
    rc, out, err = run_in_own_session([sys.executable, *torchrun, *overrides], Path.cwd(), environ, timeout_s=240)
    assert rc == 0, err[-3000:]
    verdicts = [line for line in (out + err).splitlines() if line.startswith("parity: ")]
    assert len(verdicts) == 1 and verdicts[0].startswith("parity: within 1e-05 (fp32)"), verdicts
    assert (tmp_path / "run" / "parity.csv").exists()
