"""The forecaster a run's configuration describes, built whole on every rank."""

from __future__ import annotations

from processor import TransformerProcessor
from training.config.schema import RunConfig, run_processor_config
from training.data.forcings import VariableRoles
from training.model.forecaster import Forecaster, ShardedGrids
from training.model.linear_baseline import LINEAR_REGRESSION


def build_model(cfg: RunConfig, roles: VariableRoles, grids: ShardedGrids) -> Forecaster:
    """The forecaster of ``cfg``'s model and strategy for variables in ``roles`` on ``grids``
    (their sizes: one learned feature vector per point), its parameters drawn from torch's
    generator, whole: :meth:`Forecaster.split_node_parameters` keeps a rank's blocks."""
    processor = TransformerProcessor(run_processor_config(cfg))
    model = cfg.model
    return Forecaster(
        len(roles.prognostic),
        model.num_channels,
        processor,
        model.mapper,
        model.mapper_heads,
        forcings=forcings_per_step(cfg, roles),
        diagnostics=len(roles.diagnostic),
        multistep=model.multistep_input,
        node_parameters=(grids.data_layout.total, grids.hidden_layout.total, model.trainable_size),
        normalise_increments=model.normalise_increments,
        baseline_inputs=model.baseline == LINEAR_REGRESSION,
        field_input=bool(model.field_input),
    )


def forcings_per_step(cfg: RunConfig, roles: VariableRoles) -> int:
    """Forcing channels a step is given: at its input date (and, ``model.valid_time_forcing``, its
    valid date) the store's forcings, the computed ones and (``model.climatology_input``) the
    climatology of each prognostic variable (:mod:`training.data.climatology_input`)."""
    at_a_date = len(roles.forcing) + len(roles.computed) + (len(roles.prognostic) if cfg.model.climatology_input else 0)
    return at_a_date * (2 if cfg.model.valid_time_forcing else 1)
