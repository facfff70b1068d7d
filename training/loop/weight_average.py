"""An exponential moving average of the model's parameters (``trainer.weight_average``), the
model that is validated, kept as ``best.pt`` and scored, as the EMA callbacks of anemoi and timm
do: training steps the parameters, the average follows them, and the average is the smoother
model of the two when a short run's steps still swing the loss.

Each rank averages its own parameters (its blocks of split ones), so the average is exact under
any layout. The decay warms up as TensorFlow's ``ExponentialMovingAverage(num_updates=n)`` does,
``min(decay, (1 + n) / (10 + n))`` after ``n`` updates, so that the first steps' random weights fade quickly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class WeightAverage:
    """The moving average of ``model``'s parameters with ``decay`` per update (see the module)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.params = [p for p in model.parameters()]
        self.average = [p.detach().clone() for p in self.params]
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the parameters after an optimiser step."""
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average inside (validation, ``best.pt``, the scores), its own
        parameters again after. Writing into the parameters inside writes into the average."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def restart(self) -> None:
        """Start the average afresh from the parameters (a checkpoint written without one)."""
        torch._foreach_copy_(self.average, [p.detach() for p in self.params])
        self.updates = 0

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Leave the average in the model (the run's end: what it scores)."""
        torch._foreach_copy_([p.data for p in self.params], self.average)

    def _swap(self) -> None:
        for i, p in enumerate(self.params):
            p.data, self.average[i] = self.average[i], p.data
