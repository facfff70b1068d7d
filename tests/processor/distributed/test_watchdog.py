"""A rank that dies, hangs or fails is named on every other rank, and nothing hangs.

Real faults on real processes: a rank SIGKILLs itself in the middle of a loop of collectives,
sleeps past the collective timeout, or raises on its own.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from processor.runtime import Heartbeat, run_local

TIMEOUT_S = 4.0  # the collective timeout these runs use (the default is 300 s)


def collectives_with_a_fault(fault: str, victim: int) -> str:
    """All-reduce in a loop under a heartbeat; at iteration 5 ``victim`` suffers ``fault``."""
    import torch.distributed as dist

    with Heartbeat.from_env(dist.get_rank(), dist.get_world_size(), interval_s=0.2):
        t = torch.ones(256)
        for i in range(20):
            if i == 5 and dist.get_rank() == victim:
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif fault == "hang":
                    time.sleep(TIMEOUT_S + 4)
                elif fault == "raise":
                    raise ValueError("bad batch on this rank")
            dist.all_reduce(t)
    return "done"


def _lines(message: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^  rank (\d+): (.*)$", message, re.MULTILINE)}


@pytest.mark.parametrize(
    "ranks,fault,victim,victim_line,survivor_line",
    [
        pytest.param(4, "kill", 1, "killed by SIGKILL", "PeerFailureError: rank 1 was lost", marks=pytest.mark.slow),
        (2, "kill", 0, "killed by SIGKILL", "PeerFailureError: rank 0 was lost"),  # rank 0: the store outlives it
        pytest.param(3, "hang", 1, "", "PeerFailureError: rank 1 is stuck", marks=pytest.mark.slow),  # a timeout long
        (2, "raise", 1, "ValueError: bad batch", "PeerFailureError: rank 1 stopped with ValueError: bad batch"),
    ],
    ids=["4-ranks-kill-1", "2-ranks-kill-0", "3-ranks-hang-1", "2-ranks-raise-1"],
)
def test_every_other_rank_names_the_rank_to_blame(ranks, fault, victim, victim_line, survivor_line):
    with pytest.raises(RuntimeError) as info:
        run_local(collectives_with_a_fault, ranks, fault, victim, timeout_s=TIMEOUT_S, threads_per_rank=1)
    lines = _lines(str(info.value))
    assert sorted(lines) == list(range(ranks)), str(info.value)
    assert victim_line in lines[victim], str(info.value)
    for r in range(ranks):
        if r != victim:
            assert survivor_line in lines[r], str(info.value)


def test_no_fault_no_error():
    assert run_local(collectives_with_a_fault, 2, "none", 0, timeout_s=TIMEOUT_S, threads_per_rank=1) == ["done"] * 2
