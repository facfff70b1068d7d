"""The ``propagate`` module torch_geometric writes into the temporary directory for each mapper
class is gone when the process that built the mapper exits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BUILD = (
    "from training.model.graph_transformer import GraphTransformerMapper; GraphTransformerMapper(8, 3, 2)\n"
    "from training.model.mapper import GraphMapper; GraphMapper(8, 3)\n"
)
CHECK = "import glob, sys; sys.exit(0 if len(glob.glob(sys.argv[1] + '/*_propagate_*.py')) == 2 else 3)"


def test_the_generated_sources_are_removed_at_exit(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", BUILD + CHECK, str(tmp_path)], env=env)
    assert done.returncode == 0  # one for each mapper class, written while the process runs
    assert not list(tmp_path.glob("*_propagate_*.py"))  # and gone at its exit


@pytest.mark.slow
def test_a_spawned_process_removes_its_own(tmp_path):
    """A multiprocessing child exits by ``os._exit``, past ``atexit``: its finalizers run."""
    code = (
        "import multiprocessing as mp\n"
        "from training.model.mapper import GraphMapper\n"
        "if __name__ == '__main__':\n"
        "    child = mp.get_context('spawn').Process(target=GraphMapper, args=(8, 3))\n"
        "    child.start(); child.join(); raise SystemExit(child.exitcode)\n"
    )
    script = tmp_path / "spawn.py"
    script.write_text(code)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, "TMPDIR": str(scratch)}, cwd=os.getcwd())
    assert done.returncode == 0
    assert not list(scratch.glob("*_propagate_*.py"))
