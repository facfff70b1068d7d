"""Where a forecast puts a tracer: the position error of its centroid, by lead time.

A transport forecast can have a small RMSE and the plume in the wrong place, or the plume in
the right place and a large RMSE (a smeared edge): forecasters check the position too. The
centroid of a field ``c`` is the direction of the area-weighted mean position of its plume,
the excess over a threshold ``t``: ``sum_p w_p (c_p - t)+ x_p`` (a vector inside the sphere,
whose length says how spread out the plume is: only its direction is the position). ``t``
(the variable's mean plus one standard
deviation, from the dataset's statistics, in :func:`training.skill.by_lead.centroid_accumulator`)
keeps a faint background, which a forecast smears over the globe, from pulling the centroid
towards the centre. Its error is the great-circle distance between the forecast's and the
truth's centroids, in km. Per sample, then averaged over samples;
persistence (the initial field) scores how far the tracer really moved.

Sharded like :class:`training.skill.scores.SkillAccumulator`: each rank adds sums over its block of
points, :meth:`CentroidAccumulator.finalize` adds them over the model-parallel group and the
samples over the data-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch.distributed as dist

from processor.geometry import great_circle_km
from training.skill.scores import check_same_keys, lead_labels, metric_part, sum_over


@dataclass(frozen=True)
class CentroidTable:
    """Mean centroid error (km) per kind, one per lead; ``spacing_km``: the hidden grid's
    spacing, to say the error in grid lengths (None: not known)."""

    variable: str
    lead_hours: list[float]
    error_km: dict[str, list[float]]
    spacing_km: float | None = None

    def to_markdown(self) -> str:
        kinds = [k for k in self.error_km if any(math.isfinite(e) for e in self.error_km[k])]
        head = ["lead (h)", *(f"{k} (km)" for k in kinds)]
        if self.spacing_km and "model" in kinds:
            head.append("model / hidden-grid spacing")
        lines = [
            "",
            f"### {self.variable}: centroid position error",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---:|" * len(head),
        ]
        for i, lead in enumerate(self.lead_hours):
            cells = [f"{lead:g}", *(f"{self.error_km[k][i]:.0f}" for k in kinds)]
            if self.spacing_km and "model" in kinds:
                cells.append(f"{self.error_km['model'][i] / self.spacing_km:.2f}")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def metrics(self) -> dict[str, float]:
        """``eval/centroid_km/<variable>/<kind>/<lead>`` for every finite error."""
        labels = lead_labels(self.lead_hours)
        name = metric_part(self.variable)
        return {
            f"eval/centroid_km/{name}/{kind}/{labels[lead]}": float(e)
            for kind, errors in self.error_km.items()
            for lead, e in zip(self.lead_hours, errors)
            if math.isfinite(e)
        }


class CentroidAccumulator:
    """Sums of one rank's points for each (sample, kind, lead): see the module's docstring.

    Args:
        variable: the tracer's name; ``index`` its column in the forecasts.
        xyz: ``(local points, 3)`` unit vectors of this rank's points.
        weights: ``(local points,)`` their area weights.
        threshold: the plume's edge ``t``, in the variable's units.
    """

    def __init__(
        self,
        variable: str,
        index: int,
        xyz: np.ndarray,
        weights: np.ndarray,
        lead_hours: list[float],
        kinds: tuple[str, ...],
        threshold: float = 0.0,
    ) -> None:
        self.variable, self.index, self.threshold = variable, index, float(threshold)
        self.xyz, self.weights = np.asarray(xyz, dtype=np.float64), np.asarray(weights, dtype=np.float64)
        self.lead_hours, self.kinds = [float(h) for h in lead_hours], tuple(kinds)
        self._sums: dict[tuple[int, int, int], np.ndarray] = {}  # -> (8,): forecast then truth

    def add(self, kind: str, lead_index: int, forecast: np.ndarray, truth: np.ndarray, sample_id: int) -> None:
        """``forecast`` and ``truth`` ``(local points, variables)``, physical units."""
        parts = []
        for field in (forecast, truth):
            excess = np.asarray(field, dtype=np.float64)[:, self.index] - self.threshold
            mass = self.weights * np.clip(excess, 0.0, None)
            parts += [mass @ self.xyz, [mass.sum()]]
        self._sums[(int(sample_id), self.kinds.index(kind), int(lead_index))] = np.concatenate(parts)

    def finalize(self, mp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None, spacing_km=None):
        """The :class:`CentroidTable` of every sample added on every rank (the same on each)."""
        keys = sorted(self._sums)
        check_same_keys(keys, mp_group)
        sums = np.stack([self._sums[k] for k in keys]) if keys else np.zeros((0, 8))
        if mp_group is not None and keys:
            sums = sum_over(sums, mp_group)
        totals = np.zeros((len(self.kinds), len(self.lead_hours), 2))  # error sum, samples
        for (_, kind, lead), s in zip(keys, sums):
            if s[3] > 0 and s[7] > 0:
                totals[kind, lead] += [great_circle_km(s[:3], s[4:7]), 1]
        if dp_group is not None:
            totals = sum_over(totals, dp_group)
        with np.errstate(divide="ignore", invalid="ignore"):
            means = totals[..., 0] / totals[..., 1]
        errors = {kind: [float(e) for e in means[k]] for k, kind in enumerate(self.kinds)}
        return CentroidTable(self.variable, self.lead_hours, errors, spacing_km)
