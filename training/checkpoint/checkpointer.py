"""When a training run saves its state and where it starts from: the loop asks
:meth:`Checkpointer.save` after every step, and the checkpointer decides (every
``trainer.checkpoint_interval`` steps, at the last step, and when the run stops early)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from training.checkpoint.files import LATEST, remove_partials
from training.checkpoint.resume import restore_training_state, save_training_state

if TYPE_CHECKING:
    from training.hooks import StepHook
    from training.session import Session

log = logging.getLogger(__name__)


class Checkpointer:
    """The run directory's ``checkpoints/``: every rank calls, rank 0 writes (atomically).

    Args:
        session: the rank's run (its model, ranks and transport).
        optimiser, schedule: the rest of the training state.
        hooks: the run's step hooks, told of each write (:meth:`training.hooks.StepHook.checkpoint_write`).
    """

    def __init__(self, session: Session, optimiser, schedule, hooks: StepHook) -> None:
        self.session, self.optimiser, self.schedule, self.hooks = session, optimiser, schedule, hooks
        self.cfg = session.cfg.trainer
        self.dir = Path(session.cfg.run_dir) / "checkpoints"
        self.last = 0  # the step of the last good checkpoint: restored, then saved

    def restore(self) -> int:
        """Load the run directory's checkpoint when ``trainer.resume`` and one exists; the step
        training starts from (0 without)."""
        s = self.session
        if self.cfg.resume and (self.dir / LATEST).exists():
            self.last = restore_training_state(self.dir / LATEST, s.cfg, s.dims, s.model, self.optimiser, self.schedule)
            if s.dims.rank == 0:
                log.info("resuming from step %d of %s", self.last, self.dir / LATEST)
        return self.last

    def remove_partials(self) -> None:
        """Rank 0: delete what writes that were killed left behind, saying so."""
        if self.session.dims.rank == 0:
            for partial in remove_partials(self.dir):
                log.warning("removed %s, left by a checkpoint write that was interrupted", partial)

    def save(self, steps_done: int, stopping: bool = False) -> None:
        """After ``steps_done`` steps: save when it is time (the interval, the last step, a stop),
        unless a parameter is not finite (then every rank raises, together)."""
        if not (steps_done % self.cfg.checkpoint_interval == 0 or steps_done == self.cfg.steps or stopping):
            return
        s = self.session
        non_finite = sum(not bool(torch.isfinite(p).all()) for p in s.model.parameters())
        # Split parameters differ by rank: agree, so that every rank stops here together.
        if s.dims.sum_over_world([float(non_finite)])[0] > 0:
            raise FloatingPointError(
                f"parameters are not finite after step {steps_done}; not overwriting the last good checkpoint "
                f"(step {self.last}) in {self.dir}"
            )
        on_write = self.hooks.checkpoint_write(steps_done)
        save_training_state(
            self.dir, steps_done, s.cfg, s.dims, s.model, self.optimiser, self.schedule, on_write, s.transport
        )
        self.last = steps_done
