"""The command-line entry points: ``python -m training`` and the ``gridshard-train`` command
that ``pyproject.toml`` installs."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.launch.errors import EXIT_USER_ERROR

ROOT = Path(__file__).resolve().parents[2]


def _scripts() -> dict[str, str]:
    """``pyproject.toml``'s ``[project.scripts]`` (read by hand: ``tomllib`` is Python 3.11's)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, flags=re.MULTILINE))


def test_every_installed_command_names_a_function_that_exists():
    assert _scripts()
    for name, target in _scripts().items():
        module, _, attribute = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute, None)), (name, target)


def _refused_in_one_line(done: subprocess.CompletedProcess, cwd: Path) -> None:
    assert done.stderr.startswith("error: config key trainer.stpes is not a setting of the schema"), done.stderr
    assert list(cwd.iterdir()) == []  # no run directory


# Loaded by the app and the launcher, not by the command-line check.
_APP_MODULES = ("training.app", "training.launch.launcher", "torch_geometric")


def test_a_misspelt_key_ends_the_command_before_the_app_loads(tmp_path):
    """``python -m training`` checks its overrides before it imports the app: the one line comes
    without the model's modules (seconds of imports) and without a run directory."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['training', 'trainer.stpes=5']\n"
        "try:\n"
        "    runpy.run_module('training', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        f"    print('exit', exc.code, [m for m in {_APP_MODULES!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == f"exit {EXIT_USER_ERROR} []", done.stdout + done.stderr[-2000:]
    _refused_in_one_line(done, tmp_path)


def test_gridshard_train_is_python_m_training(tmp_path):
    """The installed command refuses a misspelt key as ``python -m training`` does: one line, exit 2."""
    command = Path(sys.executable).parent / "gridshard-train"
    if not command.exists():
        pytest.skip(f"{command} is not installed (pip install -e . installs it)")
    done = subprocess.run([str(command), "trainer.stpes=5"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_USER_ERROR, done.stderr[-2000:]
    _refused_in_one_line(done, tmp_path)
