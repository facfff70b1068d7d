"""The best model of a run on validation: the lowest validation loss so far, the step it was
reached after, and how many validations since have not beaten it (``trainer.patience``). Saved
in every checkpoint's records, so that a resumed run keeps the same best and the same count."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class BestOnValidation:
    """``loss``: the lowest validation loss so far (inf before any); ``step``: the steps done when
    it was reached (None before any); ``stale``: validations since that did not beat it;
    ``rollout``: the forecast steps the losses are over, ``step_decay`` how they are weighed
    (``trainer.rollout.step_decay``)."""

    loss: float = math.inf
    step: int | None = None
    stale: int = 0
    rollout: int = 1
    step_decay: float = 1.0

    def update(self, step: int, loss: float, rollout: int = 1, step_decay: float = 1.0) -> bool:
        """Count the validation after ``step`` steps, its loss ``loss`` over ``rollout`` forecast
        steps weighed by ``step_decay``; whether it is the new best (a NaN never is). A loss over
        other steps or weights than the best's (a run resumed with another ``trainer.rollout.max``
        or ``step_decay``) does not compare: the best starts afresh."""
        if (rollout, step_decay) != (self.rollout, self.step_decay):
            self.loss, self.step, self.stale = math.inf, None, 0
            self.rollout, self.step_decay = rollout, step_decay
        if loss < self.loss:
            self.loss, self.step, self.stale = float(loss), step, 0
            return True
        self.stale += 1
        return False

    def out_of_patience(self, patience: int | None) -> bool:
        """Whether ``patience`` validations in a row have not beaten the best (None: never)."""
        return patience is not None and self.step is not None and self.stale >= patience

    def record(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> BestOnValidation:
        """The best of a checkpoint's :meth:`record` (a checkpoint written without one: none yet)."""
        return cls(**record) if record else cls()

    def describe(self) -> str:
        return f"validation loss {self.loss:.5g} after step {self.step}"
