"""A fault-injection hook for tests of what survives a lost rank (documented in docs/reliability.md).

With ``trainer.fault_at_step = s``, rank ``trainer.fault_rank`` SIGKILLs itself in the middle of
step ``s`` (after its backward pass, before the optimiser step), the way a rank dies when
its node fails. A marker file in the run directory makes it happen once per run directory, so
a run restarted by ``torchrun --max-restarts`` goes past step ``s``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

MARKER = "fault_injected"


def maybe_die(trainer_cfg: dict[str, Any], rank: int, step: int, run_dir: Path) -> None:
    """SIGKILL this process if ``trainer_cfg`` asks for a fault here and none was injected yet."""
    if trainer_cfg["fault_at_step"] != step or trainer_cfg["fault_rank"] != rank:
        return
    marker = run_dir / MARKER
    if marker.exists():
        return
    with open(marker, "w") as f:
        f.write(f"rank {rank} killed itself at step {step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
