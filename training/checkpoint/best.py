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
    it was reached (None before any); ``stale``: validations since that did not beat it."""

    loss: float = math.inf
    step: int | None = None
    stale: int = 0

    def update(self, step: int, loss: float) -> bool:
        """Count the validation after ``step`` steps; whether ``loss`` is the new best (a NaN never is)."""
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
