"""The ``tests`` part: ``pytest -m cuda`` on the ``test_cuda*.py`` files, in a subprocess.

A file that imports the training app or a carried wheel's module is left out (and named) when
the wheels are not installed: the rest need only torch, einops, numpy and pytest. On CPU
(``--dry-run``) the same command runs, and every test skips, saying why.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from benchmarks.gpu.common import (
    NEEDS_WHEELS,
    ROOT,
    WHEEL_MODULES,
    Context,
    PartFailed,
    log_tail,
    missing_wheels,
    run_logged,
)

_CLOSING = re.compile(r"\b(passed|failed|skipped|errors?|deselected|no tests ran)\b.* in [\d.]+s")


def cuda_test_files() -> list[Path]:
    return sorted((ROOT / "tests").rglob("test_cuda*.py"))


def imports_wheels(path: Path) -> bool:
    """Whether the test file imports the training app or a module of a carried wheel."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return bool(tops & {"training", *WHEEL_MODULES})


def summary(log: str) -> tuple[str, list[str]]:
    """pytest's closing line and the ids of the tests that failed or errored."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    closing = next((line.strip("= ") for line in reversed(lines) if _CLOSING.search(line)), "(no summary line)")
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return closing, failed


def tests_part(ctx: Context) -> str:
    """The ``tests`` part's Markdown; :class:`PartFailed` when pytest exits non-zero."""
    files = cuda_test_files()
    left_out = [f for f in files if imports_wheels(f)] if missing_wheels() else []
    run = [str(f.relative_to(ROOT)) for f in files if f not in left_out]
    command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", "cuda", "-p", "no:cacheprovider", *run]
    budget = ctx.budget()
    log = ctx.scratch / "cuda_tests.log"
    code, seconds = run_logged(command, log, budget.left())
    text = log.read_text(errors="replace")
    print(log_tail(log, 60))
    closing, failed = summary(text)
    lines = ["### CUDA tests", "", f"`pytest -m cuda` on {len(run)} files, {seconds:.0f} s: {closing}."]
    if left_out:
        names = ", ".join(f"`{f.relative_to(ROOT)}`" for f in left_out)
        lines.append(f"Left out, as they import the training app: {names} ({NEEDS_WHEELS}).")
    details = "\n".join(lines[2:] + [f"- {f}" for f in failed[:20]])
    if code is None:
        raise PartFailed(f"pytest ran past the {budget.seconds:.0f} s budget and was stopped", details)
    if code != 0:
        raise PartFailed(f"pytest exited {code}: {closing}", details)
    return "\n".join(lines)
