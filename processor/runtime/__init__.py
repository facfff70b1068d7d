"""Running model-parallel jobs: local launcher, heartbeat watchdog, allocator policy.

Tools for the programs that run a model (the training app, the benchmarks, the demo); the
model code (:mod:`processor.transformer`, :mod:`processor.attention`,
:mod:`processor.strategies`, :mod:`processor.distributed`) never imports this package.
"""

from processor.runtime.failures import FailureKind, RankFailure, RanksFailedError
from processor.runtime.launch import free_port, run_local, start_fork_server
from processor.runtime.memory import current_rss, peak_rss, set_freed_memory_policy
from processor.runtime.watchdog import Heartbeat, PeerFailureError, is_collective_failure

__all__ = [
    "FailureKind",
    "Heartbeat",
    "PeerFailureError",
    "RankFailure",
    "RanksFailedError",
    "current_rss",
    "free_port",
    "is_collective_failure",
    "peak_rss",
    "run_local",
    "start_fork_server",
    "set_freed_memory_policy",
]
