"""The command line, checked before Hydra sees it: a misspelt key or config-group option, or a
run directory that cannot be created, is one line (exit 2) and creates nothing.

Hydra would refuse these too, but after creating the run directory, in six to twelve lines
(``Could not override 'trainer.stepz'``, ``In 'config': Could not find 'strategy/shard_sequnce'``)
or with a traceback (``hydra.run.dir`` under a read-only directory). Here each names the
nearest valid key or option.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import tempfile
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from training.config.schema import ConfigValueError, RunConfig, schema_keys

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# The sweeps whose values are listed on the command line: each is checked.
_LISTED_SWEEPS = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP)


def _overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides among ``argv`` (Hydra's flags and their values left out)."""
    return [a for a in argv if "=" in a and not a.startswith("-")]


def group_options() -> dict[str, list[str]]:
    """Every config group of ``configs/`` and its options (the YAML files in its folder)."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(CONFIGS.iterdir()) if d.is_dir()}


def _nearest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f": did you mean {near[0]}?" if near else ""


def _known_key(key: str, known: dict[str, bool]) -> bool:
    """``key`` is a schema key, or lies inside a field that takes any keys (``data.open_dataset``)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in known:
            return n == len(parts) or not known[prefix]
    return False


def _check_type(key: str, override, schema: DictConfig) -> None:  # noqa: ANN001 - hydra's Override
    """Raise :class:`ConfigValueError` when a value of ``override`` does not fit the type of the
    schema's ``key`` (``logging.plots=maybe``, ``trainer.steps=ten``): Hydra's own refusal is five
    lines. Interpolations, and the sweeps a sweeper draws from (``interval(...)``, ``glob(...)``),
    are left to the composition."""
    if override.value_type in _LISTED_SWEEPS:
        values = list(override.sweep_iterator())
    elif override.is_sweep_override():
        return
    else:
        values = [override.value()]
    for value in values:
        if isinstance(value, str) and "${" in value:
            continue
        try:
            OmegaConf.update(schema, key, value, merge=True)
        except OmegaConfBaseException as exc:  # what Hydra's own merge of an override raises
            reason = (getattr(exc, "msg", None) or str(exc)).splitlines()[0]
            raise ConfigValueError(f"config key {key} cannot be {value!r}: {reason}") from None


def _values(override) -> list[str]:  # noqa: ANN001 - hydra's Override
    if override.is_sweep_override():
        return [str(v) for v in override.sweep_string_iterator()]
    return [str(override.value())]


def _unreadable(argv: list[str], exc: HydraException) -> str:
    """Why Hydra cannot parse ``argv``: its own first line, or, where the override it stops at is
    a path under ``~`` (which the shell leaves as it is after ``key=``), the ``$HOME`` form."""
    for override in _overrides(argv):
        try:
            OverridesParser.create().parse_overrides([override])
        except HydraException:
            key, _, value = override.partition("=")
            home = re.sub(r"(^|,)~(?=/|,|$)", r"\1$HOME", value)
            if home != value:
                return f"{override}: write {key}={home} (Hydra does not read '~' in a value)"
            break
    return str(exc).splitlines()[0]


def check_overrides(argv: list[str]) -> None:
    """Raise :class:`ConfigValueError` for the first override of ``argv`` whose key is not a
    setting, whose value does not fit the setting's type, whose config-group option does not
    exist, or whose run directory cannot be made."""
    try:
        overrides = OverridesParser.create().parse_overrides(_overrides(argv))
    except HydraException as exc:
        raise ConfigValueError(f"cannot read the command line: {_unreadable(argv, exc)}") from None
    schema = OmegaConf.structured(RunConfig)  # its keys listed before any value is tried on it
    groups, known = group_options(), schema_keys(schema)
    for o in overrides:
        key = o.key_or_group
        if key == "hydra.run.dir" and not o.is_sweep_override():
            check_creatable("hydra.run.dir", Path(str(o.value())))
        if key.startswith(("hydra.", "hydra/")) or o.is_delete():
            continue
        if key in groups:
            for value in _values(o):
                if value not in groups[key]:
                    raise ConfigValueError(
                        f"config group {key} has no option {value}{_nearest(value, groups[key])} "
                        f"(options: {', '.join(groups[key])})"
                    )
        elif not _known_key(key, known):
            raise ConfigValueError(f"config key {key} is not a setting of the schema{_nearest(key, [*known, *groups])}")
        elif known.get(key) is False:
            _check_type(key, o, schema)


def check_creatable(name: str, directory: Path) -> None:
    """Raise :class:`ConfigValueError` unless ``directory`` exists as a writable directory or can
    be created (its nearest existing ancestor is a writable directory)."""
    path = directory if directory.is_absolute() else Path.cwd() / directory
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigValueError(f"{name} = {directory} cannot be created: {ancestor} is a file, not a directory")
    try:  # a real try (root passes every access check; a read-only or special file system does not)
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".gridshard-probe-"))
    except OSError as exc:
        what = "is not writable" if ancestor == path else f"cannot be created in {ancestor}"
        raise ConfigValueError(
            f"{name} = {directory} {what} ({exc.strerror}): give a run directory you can write"
        ) from None


# What Hydra and the app put in a run directory before any work: a refused run leaves only these.
BOOKKEEPING = (".hydra", "app.log", ".run.lock", "store_read_plan.npz")  # the last: training/data/read_plan.py


def discard_refused_run_dir(run_dir: str | Path) -> None:
    """Remove a run directory that holds nothing but :data:`BOOKKEEPING` (a run refused at start),
    and its parent when that is Hydra's empty date folder under ``outputs/`` or ``multirun/``."""
    path = Path(run_dir)
    if not path.is_dir() or any(p.name not in BOOKKEEPING for p in path.iterdir()):
        return
    shutil.rmtree(path, ignore_errors=True)
    date, root = path.parent, path.parent.parent
    if root.name in ("outputs", "multirun") and date.is_dir() and not any(date.iterdir()):
        date.rmdir()
        if not any(root.iterdir()):
            root.rmdir()
