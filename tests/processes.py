"""Run a command as a test would launch a user's: in its own session, so that a hang ends with
every process it started (torchrun's workers, spawned ranks), not only the first."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def run_in_own_session(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``command`` to its end, or for ``timeout_s`` and then kill its whole process group
    (``subprocess.TimeoutExpired`` is raised); return its exit code, stdout and stderr."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, **pipes)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def start_in_own_session(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``command`` in its own session, stdout and stderr to ``log``; end it with :func:`kill_tree`."""
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process below it (torchrun starts its ranks in sessions of their own)."""
    from tests.training.hooks.faults import descendants

    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
