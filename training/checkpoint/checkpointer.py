"""When a training run saves its state and where it starts from: the loop asks
:meth:`Checkpointer.save` after every step, and the checkpointer decides (every
``trainer.checkpoint_interval`` steps, at the last step, and when the run stops early). After
each validation it keeps the best model so far as ``best.pt`` (``trainer.keep_best``), which the
end-of-run report scores (:meth:`Checkpointer.load_best`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from training.checkpoint.best import BestOnValidation
from training.checkpoint.files import BEST, LATEST, remove_partials
from training.checkpoint.resume import load_model_weights, restore_training_state, save_training_state

if TYPE_CHECKING:
    from training.hooks import StepHook
    from training.loop.weight_average import WeightAverage
    from training.session import Session

log = logging.getLogger(__name__)


class Checkpointer:
    """The run directory's ``checkpoints/``: every rank calls, rank 0 writes (atomically).

    Args:
        session: the rank's run (its model, ranks and transport).
        optimiser, schedule: the rest of the training state.
        hooks: the run's step hooks, told of each write (:meth:`training.hooks.StepHook.checkpoint_write`).
        average: the moving average of the parameters (``trainer.weight_average``), if any: saved
            and restored with them, and what ``best.pt`` holds.
    """

    def __init__(
        self, session: Session, optimiser, schedule, hooks: StepHook, average: WeightAverage | None = None
    ) -> None:
        self.session, self.optimiser, self.schedule, self.hooks = session, optimiser, schedule, hooks
        self.average = average
        self.cfg = session.cfg.trainer
        self.dir = Path(session.cfg.run_dir) / "checkpoints"
        self.last = 0  # the step of the last good checkpoint: restored, then saved
        self.best = BestOnValidation()
        self.trained_s_before = 0.0  # seconds of training by earlier runs of this directory

    def restore(self) -> int:
        """Load the run directory's checkpoint when ``trainer.resume`` and one exists; the step
        training starts from (0 without)."""
        s = self.session
        if self.cfg.resume and (self.dir / LATEST).exists():
            self.last, records = restore_training_state(
                self.dir / LATEST, s.cfg, s.dims, s.model, self.optimiser, self.schedule, self.average
            )
            self.best = BestOnValidation.from_record(records.get("best_validation"))
            self.trained_s_before = float(records.get("trained_s", 0.0))
            if s.dims.rank == 0:
                log.info("resuming from step %d of %s", self.last, self.dir / LATEST)
        return self.last

    def remove_partials(self) -> None:
        """Rank 0: delete what writes that were killed left behind, saying so; and, in a run that
        starts afresh, an earlier run's ``best.pt``, which is not of this run."""
        if self.session.dims.rank == 0:
            for partial in remove_partials(self.dir):
                log.warning("removed %s, left by a checkpoint write that was interrupted", partial)
            if self.best.step is None:
                (self.dir / BEST).unlink(missing_ok=True)

    def validated(self, steps_done: int, val_loss: float, rollout: int = 1, step_decay: float = 1.0) -> bool:
        """After the validation of the model of ``steps_done`` steps (every rank, with the same
        loss over ``rollout`` forecast steps weighed by ``step_decay``): whether it is the best so
        far, then kept as ``best.pt`` (``trainer.keep_best``)."""
        improved = self.best.update(steps_done, val_loss, rollout, step_decay)
        if improved and self.cfg.keep_best:
            self._write(steps_done, BEST, trained_s=None)
        return improved

    def load_best(self) -> int:
        """Put the best model on validation into the session's model when ``trainer.keep_best``
        and it is not the current one (step ``last``); the step of the model it now holds."""
        s, best = self.session, self.best
        if not self.cfg.keep_best or best.step is None or best.step == self.last:
            if self.average is not None:  # the model scored is the average, the last one
                self.average.copy_to_model()
            return self.last
        step = load_model_weights(self.dir / BEST, s.cfg, s.dims, s.model)
        if s.dims.rank == 0:
            log.info(
                "scoring the best model on validation (%s, %s); the last (step %d) is in %s",
                best.describe(),
                self.dir / BEST,
                self.last,
                self.dir / LATEST,
            )
        return step

    def save(self, steps_done: int, trained_s: float, stopping: bool = False) -> None:
        """After ``steps_done`` steps and ``trained_s`` seconds of training in this run: save when
        it is time (the interval, the last step, a stop), unless a parameter is not finite (then
        every rank raises, together)."""
        if not (steps_done % self.cfg.checkpoint_interval == 0 or steps_done == self.cfg.steps or stopping):
            return
        self._write(steps_done, LATEST, trained_s)
        self.last = steps_done

    def _write(self, steps_done: int, name: str, trained_s: float | None) -> None:
        s = self.session
        non_finite = sum(not bool(torch.isfinite(p).all()) for p in s.model.parameters())
        # Split parameters differ by rank: agree, so that every rank stops here together.
        if s.dims.sum_over_world([float(non_finite)])[0] > 0:
            raise FloatingPointError(
                f"parameters are not finite after step {steps_done}; not overwriting the last good checkpoint "
                f"(step {self.last}) in {self.dir}"
            )
        on_write = self.hooks.checkpoint_write(steps_done)
        records = {"best_validation": self.best.record()}
        if trained_s is not None:
            records["trained_s"] = self.trained_s_before + trained_s
        if name == BEST and self.average is not None:  # the model validated: the average
            with self.average.applied():
                self._save(steps_done, name, on_write, records, average=None)
        else:
            self._save(steps_done, name, on_write, records, self.average)

    def _save(self, steps_done: int, name: str, on_write, records: dict, average: WeightAverage | None) -> None:
        s = self.session
        save_training_state(
            self.dir,
            steps_done,
            s.cfg,
            s.dims,
            s.model,
            self.optimiser,
            self.schedule,
            on_write,
            s.transport,
            records=records,
            name=name,
            average=average,
        )
