"""Every command of the README runs as written: its modules exist, a training command's keys
and config-group options are the schema's (checked as the command line is, before Hydra), the
scripts and test paths it names exist, its Python compiles and its YAML names a class that is
there. (Running them all is what CI and the set-up do.)"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

from training.launch.cli_check import check_overrides

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TRAINING_COMMANDS = ("training", "training.evaluate", "training.predict", "training.parity")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _commands() -> list[str]:
    """Each shell command of the README's bash blocks, continuation lines joined, comments cut."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= 250


def test_the_readme_points_to_the_benchmarks_page_for_measured_figures():
    """Times, rates, speed-ups and percentages belong in docs/benchmarks.md, with their host."""
    measured = re.compile(
        r"\b\d+(?:[.,]\d+)?\s*(?:ms|s|min|minutes|seconds|[GT]FLOP/s|samples/s)(?![\w/])"
        r"|\b\d+(?:\.\d+)?\s*%|\b\d+(?:\.\d+)?x\b|\b(?:one|two|three|four|five|ten) minutes\b"
    )
    text = README.read_text()
    assert not measured.findall(text)
    assert "(docs/benchmarks.md)" in text


@pytest.mark.parametrize("command", _commands())
def test_a_readme_command_names_what_exists(command):
    words = shlex.split(command)
    if "-m" in words:
        module = words[words.index("-m") + 1]
        if module in ("pytest",):
            paths = [w for w in words if w.startswith("tests/")]
            assert all((ROOT / p).exists() for p in paths), paths
            return
        if module.split(".")[0] in ("training", "benchmarks", "processor"):
            assert importlib.util.find_spec(module) is not None, module
        if module in TRAINING_COMMANDS:
            check_overrides(words[words.index("-m") + 2 :])  # raises ConfigValueError, naming the key
    elif words[0] == "bash":
        assert (ROOT / words[1]).exists(), words[1]


def test_the_readme_python_compiles_and_its_yaml_names_a_real_class():
    for block in _blocks("python"):
        ast.parse(block)
    for block in _blocks("yaml"):
        target = yaml.safe_load(block)["model"]["processor"]["_target_"]
        module, _, name = target.rpartition(".")
        spec = importlib.util.find_spec(module)
        assert spec is not None and f"class {name}" in Path(spec.origin).read_text(), target


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    broken = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://", "mailto:")):
                if not (page.parent / path).exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
