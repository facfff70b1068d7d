"""The training loop keeps the set-up's objects out of the garbage collector's full passes
(``gc.freeze`` while the steps run) and gives them back when it ends."""

from __future__ import annotations

import gc

from tests.training.conftest import small_config
from tests.training.loop.test_compile import ONE_RANK
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.loop.trainer import Trainer
from training.session import open_session


def test_the_steps_run_with_the_set_up_frozen_and_the_end_unfreezes(tmp_path, small_dataset, monkeypatch):
    cfg = prepare(small_config(tmp_path / "run", small_dataset, *ONE_RANK, "trainer.steps=3", "evaluate.steps=1"))
    trainer = Trainer(open_session(cfg, ParallelDims.build(1)))
    frozen_at_steps: list[int] = []
    one_step = trainer.one_step

    def counting_step(step: int) -> dict[str, float]:
        frozen_at_steps.append(gc.get_freeze_count())
        return one_step(step)

    monkeypatch.setattr(trainer, "one_step", counting_step)
    gc.unfreeze()
    trainer.run()
    assert len(frozen_at_steps) == 3 and min(frozen_at_steps) > 10_000
    assert gc.get_freeze_count() == 0


def test_what_the_caller_froze_stays_frozen(tmp_path, small_dataset):
    cfg = prepare(small_config(tmp_path / "run", small_dataset, *ONE_RANK, "trainer.steps=2", "evaluate.steps=1"))
    trainer = Trainer(open_session(cfg, ParallelDims.build(1)))
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        trainer.run()
        assert gc.get_freeze_count() > frozen // 2  # not unfrozen (a few frozen objects die in the run)
    finally:
        gc.unfreeze()
