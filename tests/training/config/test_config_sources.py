"""One source for each default: the schema's dataclasses. ``configs/`` and the dataclasses never
disagree: every value a config file of the main job (``configs/config.yaml`` and the options it
chooses) sets is the dataclass default, or fills a setting that has no default (a preset's model
sizes, a dataset's path, a strategy's name); and every preset composes into a whole config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from benchmarks.config import BenchmarkConfig
from training.config.schema import DebugConfig, RunConfig, TrainerConfig, run_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
UNSET = "???"  # OmegaConf's MISSING: a setting without a default


def _leaves(section: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of the plain nested dict ``section``."""
    if not isinstance(section, dict) or not section:
        return {prefix.rstrip("."): section}
    found: dict[str, Any] = {}
    for key, value in section.items():
        found.update(_leaves(value, f"{prefix}{key}."))
    return found


def _defaults(schema: type) -> dict[str, Any]:
    """Every key of ``schema`` with its dataclass default (``???`` where it has none)."""
    return _leaves(OmegaConf.to_container(OmegaConf.structured(schema), resolve=False))


def _set_by(path: Path, package: str = "") -> dict[str, Any]:
    """What the config file ``path`` sets, under ``package`` (its group), Hydra's own keys aside."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    settings = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
    return _leaves(settings, f"{package}." if package else "") if settings else {}


def _chosen_files(primary: Path) -> list[tuple[Path, str]]:
    """``primary`` and the option files its defaults list chooses, each with its package."""
    files = [(primary, "")]
    for entry in OmegaConf.to_container(OmegaConf.load(primary))["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            if option is None:  # an optional group chosen by the command line (experiment)
                continue
            files.append((primary.parent / group / f"{option}.yaml", group))
    return files


def _disagreements(files: list[tuple[Path, str]], schema: type) -> list[str]:
    defaults = _defaults(schema)
    found = []
    for path, package in files:
        for key, value in _set_by(path, package).items():
            if key not in defaults:
                found.append(f"{path.relative_to(CONFIGS)} sets {key}, which the schema does not have")
            elif defaults[key] not in (UNSET, value):
                name = path.relative_to(CONFIGS)
                found.append(f"{name} sets {key} = {value!r}, the dataclass says {defaults[key]!r}")
    return found


def test_the_main_job_s_config_files_never_disagree_with_the_dataclasses():
    assert _disagreements(_chosen_files(CONFIGS / "config.yaml"), RunConfig) == []


def test_the_benchmark_s_config_file_never_disagrees_with_its_dataclass():
    assert _disagreements(_chosen_files(CONFIGS / "benchmark" / "benchmark.yaml"), BenchmarkConfig) == []


def test_composed_with_no_overrides_the_main_job_is_the_dataclass_defaults():
    with initialize_config_module(config_module="configs", version_base="1.3"):
        composed = _leaves(OmegaConf.to_container(compose(config_name="config"), resolve=False))
    defaults = _defaults(RunConfig)
    assert composed.keys() == defaults.keys()
    differ = {k: (defaults[k], v) for k, v in composed.items() if defaults[k] != v}
    assert all(default == UNSET for default, _ in differ.values()), differ
    assert set(differ) == {
        "model.num_layers",
        "model.num_channels",
        "model.num_heads",
        "model.window_size",
        "strategy.name",
        "data.path",
        "data.grid",
        "data.generate",
        "run_dir",
    }


def test_the_defaults_are_the_ones_the_readme_s_skill_table_was_measured_with():
    t = TrainerConfig()
    # lr derived: 3e-3 on the built-in data
    assert (t.steps, t.lr, t.min_lr_ratio, t.val_batches, t.checkpoint_interval) == (1000, None, 0.3, 8, 200)
    assert (t.val_interval, t.warmup_steps, t.batch_size) == (50, 20, None)  # derived: 1 on the built-in data
    assert (t.nprocs, t.ranks_per_model, t.threads_per_rank) == (None, None, 0)  # derived: 2 x 1 thread here
    assert DebugConfig().hooks == [] and DebugConfig().hook_settings is None  # no step hooks


def _options() -> list[tuple[str, str]]:
    groups = [d for d in sorted(CONFIGS.iterdir()) if d.is_dir() and d.name not in ("benchmark", "__pycache__")]
    return [(d.name, p.stem) for d in groups for p in sorted(d.glob("*.yaml"))]


@pytest.mark.parametrize("group,option", _options())
def test_every_preset_composes_into_a_whole_typed_config(group, option):
    with initialize_config_module(config_module="configs", version_base="1.3"):
        cfg = run_config(compose(config_name="config", overrides=["run_dir=/tmp/x", f"{group}={option}"]))
    assert isinstance(cfg, RunConfig)


def test_every_section_field_has_a_docstring_beneath_it():
    """Each field of the configuration's sections says what it is in a docstring under it (the
    form anemoi's and torchtitan's configs use), not in a trailing comment."""
    import ast

    undocumented = []
    for name in ("sections.py", "parity_settings.py", "schema.py"):
        path = Path(__file__).resolve().parents[3] / "training" / "config" / name
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            body = node.body
            for i, statement in enumerate(body):
                if isinstance(statement, ast.AnnAssign):
                    after = body[i + 1] if i + 1 < len(body) else None
                    documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    if not documented or not isinstance(after.value.value, str):
                        undocumented.append(f"{name}: {node.name}.{statement.target.id}")
    assert not undocumented, undocumented
