"""Whether the model is learning, in physical units, at each validation of a training run: the
model's area-weighted RMSE at the first lead on the validation samples beside the best simple
baseline's on the same samples (the lowest of persistence, the climatologies, anomaly
persistence and the fitted baselines: :class:`training.skill.baselines.Baselines`), scored as WeatherBench 2 does
(:class:`training.skill.scores.SkillAccumulator`: ``RMSE = sqrt(mean over samples of the
area-weighted MSE)``), so equal to what :func:`training.skill.by_lead.evaluate_skill` reports for
the same samples at that lead.

The baselines do not change as the model learns: their scores are computed once, when the
:class:`ValidationSkill` is built. The trainer validates every sample on every data-parallel
replica, so the model's sums run over the model-parallel group only (each rank holds a block of
points) and every rank gets the same numbers.

Metrics, per output variable ``<v>``: ``val/rmse/<v>/model`` and ``val/rmse/<v>/best_baseline``
(the best baseline's name is in the progress bar and the log); the validator's: ``val/loss`` and
``val/rollout``, the forecast steps it is over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor, nn

from training.data.samples import Sample, evenly_spread
from training.session import Session
from training.skill.area import scored_weights
from training.skill.baselines import training_baselines
from training.skill.by_lead import lead_hours
from training.skill.scores import SkillAccumulator, SkillTable, metric_part

log = logging.getLogger(__name__)


@contextmanager
def forward_outputs(model: nn.Module) -> Iterator[list[Tensor]]:
    """A list that receives, detached, each output of ``model``'s forward while in the context
    (also when a wrapper, e.g. ``DistributedDataParallel``, calls it): the forecasts of a loss
    computation, without a second forward pass."""
    outputs: list[Tensor] = []
    handle = model.register_forward_hook(lambda _module, _args, output: outputs.append(output.detach()))
    try:
        yield outputs
    finally:
        handle.remove()


class ValidationSkill:
    """The model's and the baselines' RMSE in physical units at the first lead on ``samples``
    (the trainer's validation samples), on every rank of ``session``'s run (a collective over
    the model-parallel group when built and at each :meth:`metrics`). ``units``: the variables'
    units where known (shown in the progress bar)."""

    def __init__(self, session: Session, samples: list[Sample], units: dict[str, str] | None = None) -> None:
        self.session, self.samples, self.units = session, list(samples), units or {}
        self.variables = list(session.dataset.roles.outputs)
        lead = session.samples.lead
        self.reference = training_baselines(session, 1, [d for t, _ in self.samples for d in (t, t + lead)])
        self.baselines = self._score_baselines()
        kinds = self.reference.kinds
        self.best = {v: min(kinds, key=lambda k, v=v: self.baselines.rmse(k, v)[0]) for v in self.variables}
        self._scores = self._accumulator(("model",))
        if session.dims.rank == 0:
            log.info("validation: %s", self.describe())

    def _accumulator(self, kinds: tuple[str, ...]) -> SkillAccumulator:
        s = self.session
        weights = scored_weights(s)
        return SkillAccumulator(self.variables, lead_hours(s, 1), kinds, weights, self.reference.climatologies.plain)

    def _score_baselines(self) -> SkillTable:
        """The baselines' scores on the samples, summed over the model-parallel group."""
        s, dataset = self.session, self.session.dataset
        columns, lead = dataset.roles.output_columns(), s.samples.lead
        scores = self._accumulator(self.reference.kinds)
        for i, (t, member) in enumerate(self.samples):
            truth = dataset.denormalise_outputs(dataset.state(t + lead, s.points, member)[:, columns])
            for kind, forecast in self.reference.forecasts(t, member)[0].items():
                scores.add(kind, 0, forecast, truth, i)
        return scores.finalize(s.dims.mp_group, None)

    def describe(self) -> str:
        """The baselines' RMSE per variable, the best named: what the log says once."""
        lead_h = lead_hours(self.session, 1)[0]
        parts = []
        for v in self.variables:
            cells = ", ".join(f"{k} {self.baselines.rmse(k, v)[0]:.4g}" for k in self.reference.kinds)
            parts.append(f"{v}: {cells} (best: {self.best[v]})")
        return f"baselines' RMSE at {lead_h:g} h on {len(self.samples)} validation samples: " + "; ".join(parts)

    def add(self, first: int, forecast: Tensor, target: Tensor) -> None:
        """The model's forecasts of samples ``samples[first:first + batch]`` and their targets,
        each ``(batch, local points, outputs)`` normalised."""
        denormalise = self.session.dataset.denormalise_outputs
        forecasts, targets = (x.detach().float().cpu().numpy() for x in (forecast, target))
        for i, (f, o) in enumerate(zip(forecasts, targets)):
            self._scores.add("model", 0, denormalise(f), denormalise(o), first + i)

    def metrics(self) -> dict[str, float]:
        """The model's RMSE over the samples added since the last call and the best baseline's,
        per output variable (see the module); every rank of the model-parallel group calls."""
        table = self._scores.finalize(self.session.dims.mp_group, None)
        self._scores = self._accumulator(("model",))
        out = {}
        for v in self.variables:
            name = metric_part(v)
            out[f"val/rmse/{name}/model"] = table.rmse("model", v)[0]
            out[f"val/rmse/{name}/best_baseline"] = self.baselines.rmse(self.best[v], v)[0]
        return out

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """The progress bar's fields for the first output variable ``v`` after a validation:
        ``{"v_rmse": "1.62 K", "baseline": "1.78 (anomaly_persistence)"}``; none before one."""
        v = self.variables[0]
        model = metrics.get(f"val/rmse/{metric_part(v)}/model")
        if model is None or not np.isfinite(model):
            return {}
        unit = f" {self.units[v]}" if v in self.units else ""
        best = metrics[f"val/rmse/{metric_part(v)}/best_baseline"]
        return {f"{v}_rmse": f"{model:.3g}{unit}", "baseline": f"{best:.3g} ({self.best[v]})"}


class Validator:
    """When a training run validates, and what: ``val/loss``, the loss of a rollout of the most
    steps the run trains (:attr:`rollout`: ``trainer.rollout.max``, or ``start`` without raises)
    on the first ``trainer.val_batches`` batches of validation samples averaged over the replicas, and
    :class:`ValidationSkill`'s RMSE beside the best baseline's (built at the first validation).
    The best model is chosen on ``val/loss``: with a rollout in the loss, on the leads it trains.

    ``loss``: the step's loss, ``loss(x, targets, grids, group, transport, forcings)``
    (:meth:`training.loop.step.TrainStep.loss`); ``units``: the variables' units where known.
    """

    def __init__(self, session: Session, loss, units: dict[str, str] | None = None) -> None:
        self.session, self.loss, self.units = session, loss, units
        self.cfg = session.cfg.trainer
        self.skill: ValidationSkill | None = None
        self.last = {"val/loss": float("nan")}  # the latest validation's metrics

    def due(self, step: int) -> bool:
        """Whether the run validates after ``step`` (every ``trainer.val_interval`` steps, and the last)."""
        return (step + 1) % self.cfg.val_interval == 0 or step + 1 == self.cfg.steps

    @property
    def rollout(self) -> int:
        """The forecast steps of ``val/loss``: the most the run's loss reaches."""
        return self.cfg.rollout.most

    def validate(self) -> dict[str, float]:
        """Validate the model as it is now (every rank calls); its metrics."""
        s, trainer_cfg = self.session, self.cfg
        # spread over the whole period: the best model is chosen on more than its first days' weather
        val = evenly_spread(s.samples.val, trainer_cfg.val_batches * trainer_cfg.batch_size)
        if self.skill is None:
            self.skill = ValidationSkill(s, val, self.units)
        losses, steps, size = [], self.rollout, trainer_cfg.batch_size
        s.model.eval()
        with torch.no_grad(), forward_outputs(s.model) as forecasts:
            for first in range(0, len(val), size):  # batches of the training's size
                b = s.batches(val[first : first + size], steps)
                losses.append(self.loss(b.x, b.targets, s.grids, s.model_group, s.transport, b.forcings).item())
                self.skill.add(first, forecasts[0], b.targets[0])  # the first lead's forecasts
                forecasts.clear()
        s.model.train()
        total = sum(losses) / len(val) * size  # each batch's loss is over `size` samples' points
        loss = s.dims.sum_over_world([total])[0] / s.dims.dp
        self.last = {"val/loss": loss, "val/rollout": float(steps), **self.skill.metrics()}
        return self.last

    def progress(self) -> dict[str, str]:
        """The progress bar's fields of the latest validation: its loss, and the first variable's
        RMSE beside the best baseline's (:meth:`ValidationSkill.progress`)."""
        shown = {"val": f"{self.last['val/loss']:.4f}"}
        return shown | (self.skill.progress(self.last) if self.skill is not None else {})
