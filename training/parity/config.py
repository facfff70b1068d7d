"""The ``parity`` section of the configuration (:class:`training.config.RunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from training.settings import above, at_least, or_null, setting

# The largest relative difference a precision is allowed, when parity.tolerance is not given.
# fp32: the library's promise (one rank's numbers, summation order aside). bf16: autocast rounds
# every product to 8 bits of mantissa (unit roundoff 2^-8 = 3.9e-3), differently on each layout;
# the bound is a few roundoffs, above the drift measured on the default config (docs/parity.md).
TOLERANCES = {"fp32": 1e-5, "bf16": 2.5e-1}


@dataclass
class ParityConfig:
    """What ``python -m training.parity`` compares: ``steps`` optimiser steps of the configured
    layout against a reference layout of ``reference`` model-parallel ranks (1: one rank holds the
    model, under strategy none; more when one rank cannot, under the configured strategy), one
    replica holding every replica's batch."""

    steps: int = setting(3, at_least(1))
    reference: int = setting(1, at_least(1))  # model-parallel ranks of the reference layout
    tolerance: float | None = setting(None, or_null(above(0)))  # None: the precision's (TOLERANCES)


def tolerance_of(parity: ParityConfig, precision: str) -> float:
    """The largest relative difference allowed: ``parity.tolerance``, else the precision's."""
    return parity.tolerance if parity.tolerance is not None else TOLERANCES[precision]
