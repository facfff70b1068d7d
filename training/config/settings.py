"""The pieces typed configs are made of: a setting's default and allowed range, declared together
(:func:`setting`), one checker that walks a config's dataclasses (:func:`check_ranges`), and the
config's plain-data form where it leaves or enters the program (MLflow params, ``config.yaml``,
a checkpoint: :func:`to_settings`, :func:`from_settings`).

The training app's schema (:mod:`training.config.schema`) and the benchmarks' (:mod:`benchmarks.config`)
are both made of these."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf

from processor.errors import UserError

T = TypeVar("T")


class ConfigValueError(UserError):
    """A configuration the run cannot start with: an unknown key or a value out of range. The
    app prints it as one line (it is the user's to fix, not a bug)."""


@dataclass(frozen=True)
class Range:
    """The values a setting may take: ``ok(value)`` says whether one is allowed, ``expected`` is
    how an error message says it (``>= 1``, ``fp32|bf16``)."""

    ok: Callable[[Any], bool]
    expected: str


def at_least(low: float, note: str = "") -> Range:
    """``value >= low``; ``note`` is added to the message (``(0: off)``)."""
    return Range(lambda v: v >= low, f">= {low}{note}")


def above(low: float) -> Range:
    """``value > low``."""
    return Range(lambda v: v > low, f"> {low}")


def within(low: float, high: float, closed: str = "[]") -> Range:
    """``low <= value <= high``, each end open (``(``, ``)``) or closed (``[``, ``]``)."""
    left = (lambda v: v >= low) if closed[0] == "[" else (lambda v: v > low)
    right = (lambda v: v <= high) if closed[1] == "]" else (lambda v: v < high)
    return Range(lambda v: left(v) and right(v), f"in {closed[0]}{low}, {high}{closed[1]}")


def one_of(*choices: str) -> Range:
    """One of ``choices``."""
    return Range(lambda v: v in choices, "|".join(choices))


def or_null(inner: Range) -> Range:
    """``inner``, or None."""
    return Range(lambda v: v is None or inner.ok(v), f"{inner.expected} or null")


def setting(default: Any = dataclasses.MISSING, range: Range | None = None, *, factory: Any = None) -> Any:  # noqa: A002
    """A dataclass field with its ``default`` (or ``factory``) and the ``range`` its values must
    be in, checked by :func:`check_ranges`."""
    metadata = {"range": range} if range is not None else {}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_ranges(config: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigValueError` naming the first field of the dataclass ``config`` (or of a
    dataclass inside it, named by its dotted path after ``prefix``) whose value is out of its
    declared range."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        allowed: Range | None = f.metadata.get("range")
        if allowed is not None and not allowed.ok(value):
            raise ConfigValueError(
                f"config key {prefix}{f.name} = {value!r} is out of range: expected {allowed.expected}"
            )
        if dataclasses.is_dataclass(value):
            check_ranges(value, f"{prefix}{f.name}.")


def to_settings(config: Any) -> dict[str, Any]:
    """The dataclass ``config`` as plain data (nested dicts, lists and scalars): what is written
    to ``config.yaml``, a checkpoint and MLflow, and compared on resume."""
    return dataclasses.asdict(config)


def known_part(kind: type, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``settings`` that the dataclass ``kind`` has fields for (keys written by another
    version of the program are left out)."""
    fields = {f.name: f for f in dataclasses.fields(kind)}
    kept: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in fields:
            continue
        inner = _dataclass_type(kind, key)
        kept[key] = known_part(inner, value) if inner is not None and isinstance(value, Mapping) else value
    return kept


def _dataclass_type(kind: type, name: str) -> type | None:
    """The dataclass a field of ``kind`` holds, or None (a plain value)."""
    hint = typing.get_type_hints(kind).get(name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def from_settings(kind: type[T], settings: Mapping[str, Any], base: T | None = None) -> T:
    """An instance of the dataclass ``kind`` from plain data (read back from ``config.yaml`` or
    a checkpoint), over ``base`` (default: the schema's defaults); types are checked as Hydra
    checks them, and keys ``kind`` does not have are left out."""
    node = OmegaConf.structured(kind if base is None else base)
    return OmegaConf.to_object(OmegaConf.merge(node, known_part(kind, settings)))  # type: ignore[return-value]


def sets_key(key: str, given: list[str] | tuple[str, ...]) -> bool:
    """Whether keys ``given`` (a command line's, or keys never taken from saved settings) set
    ``key``: itself, its section (a config group such as ``model=small``) or a key inside it
    (``data.open_dataset.dataset``)."""
    return any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in given)


def settings_not_given(
    saved: Mapping[str, Any], given: list[str], own: tuple[str, ...], known: dict[str, bool], prefix: str = ""
) -> dict[str, Any]:
    """The part of saved settings to take over: every schema key (``known``: path -> is a
    section) that neither the command line (``given``) nor the command's ``own`` keys set; keys
    the schema no longer has are dropped."""
    kept: dict[str, Any] = {}
    for key, value in saved.items():
        path = prefix + str(key)
        if path not in known or any(path == k or path.startswith(k + ".") for k in own):
            continue
        if known[path] and isinstance(value, Mapping):
            inner = settings_not_given(value, given, own, known, path + ".")
            if inner:
                kept[key] = inner
        elif not sets_key(path, given):
            kept[key] = value
    return kept


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)
    return out


SAVED_CONFIG = "config.yaml"  # the resolved configuration, written at the start of every run


def write_settings(resolved: Any) -> Path:
    """Write ``resolved`` (a :class:`~training.config.schema.RunConfig`) to
    ``<run_dir>/config.yaml``, atomically: a later command in this run directory continues from
    it if the run stops before a checkpoint, and MLflow keeps it as an artifact. Its path."""
    run_dir = Path(resolved.run_dir)
    tmp = run_dir / f".{SAVED_CONFIG}.partial-{os.getpid()}"
    tmp.write_text(yaml.safe_dump(to_settings(resolved), sort_keys=False))
    os.replace(tmp, run_dir / SAVED_CONFIG)
    return run_dir / SAVED_CONFIG
