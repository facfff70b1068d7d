"""The ``parity`` section of the configuration (:class:`training.config.schema.RunConfig`):
what ``python -m training.parity`` compares, and the tolerance of each precision."""

from __future__ import annotations

from dataclasses import dataclass

from training.config.settings import above, at_least, or_null, setting

# The largest relative difference a precision is allowed, when parity.tolerance is not given,
# calibrated for a few steps (the default 3; rounding differences grow with the steps).
# fp32: the library's promise (one rank's numbers, summation order aside). bf16: autocast rounds
# each rank's partial weight gradients to 8 bits of mantissa (2^-8 = 3.9e-3) before the sum over
# the ranks; where the partial sums cancel the gradient differs by several percent (0.05 on the
# default run, 0.11 on the tests' small model): the bound separates that from gross errors only,
# fp32 is the exactness check (docs/gpu.md, "Check it on your machines").
TOLERANCES = {"fp32": 1e-5, "bf16": 2.5e-1}


@dataclass
class ParityConfig:
    """What ``python -m training.parity`` compares: ``steps`` optimiser steps of the configured
    layout against a reference layout of ``reference`` model-parallel ranks (1: one rank holds the
    model, under strategy none; more when one rank cannot, under the configured strategy), one
    replica holding every replica's batch."""

    steps: int = setting(3, at_least(1))
    """Optimiser steps each layout trains."""
    reference: int = setting(1, at_least(1))
    """Model-parallel ranks of the reference layout."""
    tolerance: float | None = setting(None, or_null(above(0)))
    """The largest relative difference allowed; None: the precision's (:data:`TOLERANCES`)."""


def tolerance_of(parity: ParityConfig, precision: str) -> float:
    """The largest relative difference allowed: ``parity.tolerance``, else the precision's."""
    return parity.tolerance if parity.tolerance is not None else TOLERANCES[precision]
