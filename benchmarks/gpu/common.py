"""What the GPU check's parts share: where they run, their time budget, how a part fails, the
GEMM yardstick, and subprocesses that can be stopped whole."""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# What the train and sweep parts import beyond torch, einops, numpy and pytest (carried wheels).
WHEEL_MODULES = ("hydra", "omegaconf", "mlflow", "zarr", "numcodecs", "yaml")
NEEDS_WHEELS = "needs the wheels: run scripts/gpu_wheels.sh here and carry .gpu-wheels"


class PartFailed(Exception):
    """A part that could not give its figures: ``line`` says why, in one line; ``details``
    (optional, Markdown) follow it in the section."""

    def __init__(self, line: str, details: str = "") -> None:
        super().__init__(line)
        self.line = line
        self.details = details


class Budget:
    """A part's time budget, counted from its creation: loops skip their remaining cases once
    it is spent, and subprocesses get what is left as their timeout."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def spent(self) -> bool:
        return self.left() <= 0

    def note(self) -> str:
        return f"skipped: past this part's {self.seconds:.0f} s budget"


@dataclass
class Context:
    """Where and how the parts run. ``scratch``: a folder for the runs' own directories;
    ``doc``: the Markdown file the section goes to (plots beside it), or None."""

    device: torch.device
    budget_s: float
    scratch: Path
    doc: Path | None = None

    @property
    def dry_run(self) -> bool:
        return self.device.type != "cuda"

    def budget(self) -> Budget:
        return Budget(self.budget_s)


def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of ``text`` that says something (an error's message), cut to ``limit``."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "(no output)")[:limit]


def missing_wheels() -> list[str]:
    """The modules of :data:`WHEEL_MODULES` this Python cannot import."""
    return [m for m in WHEEL_MODULES if importlib.util.find_spec(m) is None]


def require_wheels() -> None:
    """Raise :class:`PartFailed` (the one line to carry the wheels) when any is missing."""
    missing = missing_wheels()
    if missing:
        raise PartFailed(f"{NEEDS_WHEELS} (missing: {', '.join(missing)})")


def run_logged(
    command: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[int | None, float]:
    """Run ``command`` in the repository root, its output to ``log``; ``(exit code, seconds)``,
    the code None when it ran past ``timeout_s`` and was stopped with every process it started
    (it runs in a session of its own: spawned ranks go too)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
    return code, time.monotonic() - start


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group ``proc`` leads, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(log: Path, lines: int = 40) -> str:
    """The end of a subprocess's log, printed when it fails."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def rate(tflops: float) -> str:
    """A TFLOP/s figure: one decimal on a GPU, three significant digits on toys."""
    return f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.3g}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run: toy sizes, not figures)"


@functools.cache
def gemm_tflops(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Dense ``size³`` matmul rate in this process (TF32 off for fp32): the yardstick. Measured
    once per process; a part run on its own measures it itself."""
    from benchmarks.attention_paths import timed

    torch.backends.cuda.matmul.allow_tf32 = False
    x, y = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    seconds, _ = timed(lambda: x @ y, device, repeats, warmup=1)
    return 2 * size**3 / seconds / 1e12
