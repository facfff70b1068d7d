"""Batches of one rank's block of data points: the model's inputs (the states, oldest first, and
the forcings), the targets of a rollout, and the forcings each later step of it is given."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from training.data.climatology_input import HourlyClimatology
from training.data.dataset import DatasetError, ZarrDataset
from training.data.forcings import computed_forcings
from training.data.samples import Sample
from training.data.state_cache import STATE_CACHE_BYTES, StateCache
from training.distributed.device import to_device


class Batch(NamedTuple):
    """One batch on this rank's points: the model's inputs, the rollout's targets, and the
    forcings the rollout's later steps are given (:class:`~training.data.forcings.VariableRoles`)."""

    x: torch.Tensor  # (batch, local points, inputs) at each sample's date
    targets: torch.Tensor  # (steps, batch, local points, outputs) at lead, ..., steps x lead dates on
    forcings: torch.Tensor  # (steps - 1, batch, local points, forcings) at lead, ..., (steps - 1) x lead


class Batches:
    """States of one member for this rank's block of data points: an input and the targets of a
    rollout, ``lead`` dates apart, on ``device``; computed forcings at each date, given to the
    step from it (and, ``valid_time_forcing``, to the step to it), followed by ``climatology``'s
    values at the date where there is one (``model.climatology_input``)."""

    def __init__(
        self,
        dataset: ZarrDataset,
        points: slice,
        lead: int,
        device: torch.device,
        valid_time_forcing: bool = False,
        history: int = 0,
        climatology: HourlyClimatology | None = None,
    ) -> None:
        self.dataset = dataset
        self.lead = lead
        self.valid_time_forcing = valid_time_forcing
        self.history = history  # earlier states in the input: model.multistep_input - 1
        self.device = device
        self.points = points  # this rank's block of the data grid's points
        self.climatology = climatology
        self._forcings = StateCache(STATE_CACHE_BYTES // 4)  # computed forcings by date

    def __call__(self, samples: list[Sample], steps: int = 1) -> Batch:
        """The :class:`Batch` of ``samples`` for a rollout of ``steps``."""
        roles = self.dataset.roles
        states = np.stack(  # (history + steps + 1, batch, local points, variables)
            [
                np.stack([self.dataset.state(t + k * self.lead, self.points, m) for t, m in samples])
                for k in range(-self.history, steps + 1)
            ]
        )
        dates = np.array([[self.dataset.dates[t + k * self.lead] for t, _ in samples] for k in range(steps + 1)])
        x, forcings = self._inputs(states, dates)
        targets = states[self.history + 1 :][..., roles.output_columns()]
        return Batch(*(to_device(a, self.device) for a in (x, targets, forcings)))

    def forecast_inputs(self, t: int, member: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The input ``(1, local points, inputs)`` at date index ``t`` and the forcings ``(steps -
        1, 1, local points, forcings)`` of a forecast of ``steps`` leads, which may run past the
        store's last date when every forcing is computed."""
        dataset, roles = self.dataset, self.dataset.roles
        if t - self.history * self.lead < 0:
            raise DatasetError(
                f"a forecast from {dataset.date(t)} needs the {self.history} state(s) before it (model.multistep_input"
                f" = {self.history + 1}): start at {dataset.date(self.history * self.lead)} or later"
            )
        lead_s = self.lead * dataset.frequency_s
        dates = np.array([[dataset.dates[t] + np.timedelta64(k * lead_s, "s")] for k in range(steps + 1)])
        needed = steps if self.valid_time_forcing else steps - 1  # the last date whose forcings are given
        if roles.forcing and t + needed * self.lead >= dataset.n_times:
            raise DatasetError(
                f"a forecast of {steps} steps from {dataset.date(t)} needs the store's forcings {list(roles.forcing)}"
                " (data.forcing's, or given by the store's record) after its last date"
                f" {dataset.date(dataset.n_times - 1)}"
            )
        given = [dataset.state(t + k * self.lead, self.points, member) for k in range(-self.history, 1)]
        # Later states are read only for store forcings, and only at dates whose forcings are
        # given; elsewhere the input stands in (its forcing columns unused).
        later = [
            dataset.state(t + k * self.lead, self.points, member) if roles.forcing and k <= needed else given[-1]
            for k in range(1, steps + 1)
        ]
        x, forcings = self._inputs(np.stack([*given, *later])[:, None], dates)
        return to_device(x, self.device), to_device(forcings, self.device)

    def valid_forcings(self, samples: list[Sample], steps: int) -> np.ndarray:
        """``(steps, batch, local points, forcings)`` the store's forcing columns then the computed
        forcings (and the climatology's values, if any) at each sample's valid dates, ``lead``,
        ..., ``steps x lead`` dates on: what the step to that date is given with
        ``valid_time_forcing`` (read by the fitted baselines, :mod:`training.skill.fitted`)."""
        columns, ks = self.dataset.roles.forcing_columns(), range(1, steps + 1)
        states = [[self.dataset.state(t + k * self.lead, self.points, m) for t, m in samples] for k in ks]
        stored = np.stack([np.stack([s[..., columns] for s in at_k]) for at_k in states])
        dates = np.array([[self.dataset.dates[t + k * self.lead] for t, _ in samples] for k in ks])
        return np.concatenate([stored, self._computed(dates)], axis=-1)

    def _inputs(self, states: np.ndarray, dates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model's input and the forcings ``(steps - 1, batch, local points, forcings)`` each
        later step is given, from ``states`` ``(history + steps + 1, batch, local points,
        variables)`` (the input's ``history`` earlier states, the input, then one a step) and
        ``dates`` ``(steps + 1, batch)`` (the input's, then one a step). The input ``(batch, local
        points, inputs)``: the prognostic states, oldest first, then the forcings. Step ``k``'s
        forcings: the store's forcing columns then the computed forcings at its input date, and
        (``valid_time_forcing``) the same again at its valid date."""
        roles, history = self.dataset.roles, self.history
        from_input = states[history:]
        at_dates = np.concatenate([from_input[..., roles.forcing_columns()], self._computed(dates)], axis=-1)
        per_step = at_dates[:-1]
        if self.valid_time_forcing:
            per_step = np.concatenate([at_dates[:-1], at_dates[1:]], axis=-1)
        prognostic = [s[..., roles.prognostic_columns()] for s in states[: history + 1]]
        x = np.concatenate([*prognostic, per_step[0]], axis=-1)
        return x, per_step[1:]

    def _computed(self, dates: np.ndarray) -> np.ndarray:
        """``(*dates.shape, local points, computed [+ prognostic])`` computed forcings at ``dates``
        (datetime64), then the climatology's values there if any, each date's computed once."""
        at_dates = [self._computed_at(date) for date in dates.reshape(-1)]
        return np.stack(at_dates).reshape(*dates.shape, *at_dates[0].shape)

    def _computed_at(self, date: np.datetime64) -> np.ndarray:
        key = (int(date.astype("datetime64[s]").astype(np.int64)),)
        values = self._forcings.get(key)
        if values is None:
            lat, lon = self.dataset.latitudes[self.points], self.dataset.longitudes[self.points]
            values = computed_forcings(self.dataset.roles.computed, date[None], lat, lon)[0]
            if self.climatology is not None:
                values = np.concatenate([values, self.climatology.at(date)], axis=-1)
            values = self._forcings.put(key, values)
        return values
