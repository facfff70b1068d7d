"""Peak resident memory of this process over a block of code (Linux, CPU runs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


@dataclass
class PeakMemory:
    baseline: int = 0
    peak: int = 0

    @property
    def increase(self) -> int:
        """Bytes above the resident size at the start of the block."""
        return self.peak - self.baseline


@contextmanager
def track_peak_rss() -> Iterator[PeakMemory]:
    """Reset the kernel's high-water mark, run the block, read the new peak (VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    result = PeakMemory(baseline=_status_bytes("VmRSS"))
    yield result
    result.peak = _status_bytes("VmHWM")
