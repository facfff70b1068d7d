"""Peak resident memory of a snippet, measured in a fresh process (no allocator history)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PRELUDE = """
import torch
from processor.attention import sliding_window_attention
torch.set_num_threads(1)
def rss(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
"""


def peak_bytes(setup: str, work: str) -> int:
    """Bytes the resident set grows by while ``work`` runs, after ``setup`` (both Python source,
    with ``torch`` and ``sliding_window_attention`` imported)."""
    script = "\n".join(
        [
            _PRELUDE,
            textwrap.dedent(setup),
            "open('/proc/self/clear_refs', 'w').write('5')",
            "base = rss('VmRSS')",
            textwrap.dedent(work),
            "print(rss('VmHWM') - base)",
        ]
    )
    return int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
