"""Hydra schemas derived from the library, not copied: a model section from
:class:`processor.ProcessorConfig`'s fields and the strategies' options from their own
dataclass fields, so that a setting added to the processor or a strategy appears in every
app's configuration (the training app's, :mod:`training.config.schema`, and the benchmarks')."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any

from omegaconf import MISSING

from processor import ProcessorConfig
from processor.strategies import BUILT_IN, strategy_options

# The launcher's own keys of every model section (training/config/auto_attention.py): not the processor's.
LAUNCH_FIELDS = (
    ("attention_probe", bool, field(default=True)),  # attention_path=auto: measure the paths (false: the static rule)
    ("attention_auto", Any, field(default=None)),  # filled by attention_path=auto: its pick and each path's time
)
LAUNCH_KEYS = tuple(name for name, _, _ in LAUNCH_FIELDS)


def processor_schema(
    name: str, defaults: dict[str, Any] | None = None, extra: list[tuple[str, Any, Any]] = (), *, module: str
) -> type:
    """A Hydra schema (a dataclass named ``name``, of ``module``) whose fields are
    :class:`processor.ProcessorConfig`'s, the strategy aside (it is a key of its own), with the
    processor's defaults replaced by ``defaults``, after the ``extra`` fields (name, type, and a
    default or a :func:`~training.config.settings.setting`). Derived, not copied: a setting added to
    the processor appears here. A processor setting without a default is required (``???``)."""
    defaults = defaults or {}
    specs: list[tuple[str, Any, Any]] = [
        (key, kind, value if isinstance(value, dataclasses.Field) else field(default=value))
        for key, kind, value in [*extra, *LAUNCH_FIELDS]
    ]
    for f in dataclasses.fields(ProcessorConfig):
        if f.name != "strategy":
            default = defaults.get(f.name, MISSING if f.default is dataclasses.MISSING else f.default)
            specs.append((f.name, f.type, field(default=default)))
    return _named(dataclasses.make_dataclass(name, specs), module)


def _named(cls: type, module: str) -> type:
    """``cls`` (made by ``make_dataclass``) as a class of ``module``: pickle finds it there when
    a configuration goes to a spawned rank."""
    cls.__module__ = module
    return cls


def strategy_options_schema(name: str = "StrategyOptions", *, module: str) -> type:
    """A dataclass of every option of the built-in strategies (their own dataclass fields, e.g.
    ``ring``, ``head_group_size``), each None by default: the strategy's own default. Derived,
    not copied: an option added to a strategy appears here."""
    specs: dict[str, tuple[str, Any, Any]] = {}
    for strategy, cls in BUILT_IN.items():
        hints = typing.get_type_hints(cls)
        for option in strategy_options(strategy):
            kind = hints[option] | None
            if option in specs and specs[option][1] != kind:
                raise TypeError(f"strategy option {option} has two types: {specs[option][1]} and {kind}")
            specs[option] = (option, kind, field(default=None))
    return _named(dataclasses.make_dataclass(name, list(specs.values())), module)
